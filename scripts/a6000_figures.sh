#!/usr/bin/env bash
# Reproduce the A6000 figure-5/7 validation rows (issue 22): import each setup with
# `pdlab import lss-run`, then `pdlab validate DB --json`.
#   scripts/a6000_figures.sh DB [OUT.json] [extra pdlab validate flags]
set -euo pipefail
DB=${1:?database path}; OUT=${2:-/dev/stdout}; shift $(( $# > 2 ? 2 : $# )) || true
PDLAB=${PDLAB:-$(dirname "$0")/../.venv/bin/pdlab}
A=$($PDLAB data path lss_ispass26_a6000)
F5=$A/figure_5; F7=$A/figure_7
imp() { $PDLAB import lss-run --profiles "$A/profiles" --models "$A/models" --db "$DB" --replace "$@" >/dev/null; }
LL=$A/datasets/sharegpt_req300_rate10_llama.jsonl
PHI=$A/datasets/sharegpt_req300_rate10_phi.jsonl
PULSE=$A/datasets/sharegpt_pulse_req50_n6_delay15_pc.jsonl
imp --name a6000-fig5-MD --config "$F5/config/MD_config.json" --dataset "$LL" --reference-throughput "$F5/reference/MD_throughput.tsv"
imp --name a6000-fig5-SD-PC --config "$F5/config/SD+PC_config.json" --dataset "$LL" --prefix-caching --reference-throughput "$F5/reference/SD+PC_throughput.tsv"
imp --name a6000-fig5-PDD --config "$F5/config/PDD_config.json" --dataset "$LL" --reference-throughput "$F5/reference/PDD_throughput.tsv"
imp --name a6000-fig5-SM --config "$F5/config/SM_config.json" --dataset "$PHI" --reference-throughput "$F5/reference/SM_throughput.tsv"
imp --name a6000-fig7-SD-PC --config "$F7/config/SD+PC_config.json" --dataset "$PULSE" --prefix-caching --reference-prefix "$F7/reference/SD+PC.tsv"
imp --name a6000-fig7-MD-PC-PS --config "$F7/config/MD+PC+PS_config.json" --dataset "$PULSE" --prefix-caching --prefix-storage cpu --prefix-sharing \
  --reference-prefix "$F7/reference/MD+PC+PS_inst0.tsv" --reference-prefix "$F7/reference/MD+PC+PS_inst1.tsv" --reference-prefix "$F7/reference/MD+PC+PS_shared_cpu.tsv"
$PDLAB validate "$DB" --json "$@" > "$OUT"
