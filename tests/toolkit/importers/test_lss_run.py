"""`pdlab import lss-run` on LLMServingSim's A6000 setups (the committed copy) and on broken
copies of its files: one-line errors, the database left as it was."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from cluster.data import BUNDLED
from telemetry import open_reader
from toolkit.cli import app

A6000 = BUNDLED / "lss_ispass26_a6000"
PULSE = A6000 / "datasets" / "sharegpt_pulse_req50_n6_delay15_pc.jsonl"
LLAMA = A6000 / "datasets" / "sharegpt_req300_rate10_llama.jsonl"
F7 = A6000 / "figure_7"
runner = CliRunner()


def base(config: Path, dataset: Path, name: str, db: Path) -> list[str]:
    return ["import", "lss-run", "--config", str(config), "--dataset", str(dataset),
            "--profiles", str(A6000 / "profiles"), "--models", str(A6000 / "models"),
            "--name", name, "--db", str(db)]  # fmt: skip


def md_pc_ps(db: Path, name: str = "md") -> list[str]:
    return [
        *base(F7 / "config/MD+PC+PS_config.json", PULSE, name, db),
        "--prefix-caching", "--prefix-storage", "cpu", "--prefix-sharing",
        *(x for f in ("inst0", "inst1", "shared_cpu") for x in ("--reference-prefix", str(F7 / f"reference/MD+PC+PS_{f}.tsv"))),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lss") / "lss.duckdb"
    res = runner.invoke(app, [*md_pc_ps(path), "--json"])
    assert res.exit_code == 0, res.output
    return path


def q(db: Path, sql: str) -> list[tuple]:  # type: ignore[type-arg]
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_the_cluster_requests_profiles_and_references_are_stored(db: Path) -> None:
    assert q(db, "SELECT node_id, role, tp, prefix_caching, prefix_pool, host_memory_gib FROM cluster_instances ORDER BY node_id") == [
        (0, "collocated", 1, True, "cpu-shared", 128.0), (1, "collocated", 1, True, "cpu-shared", 128.0)
    ]  # fmt: skip
    assert q(db, "SELECT count(*), sum(t_in), sum(t_out) FROM requests") == [(300, 82645, 75249)]
    ids = q(
        db, "SELECT input_token_ids, output_token_ids FROM request_tokens WHERE request_id = '0'"
    )[0]
    assert len(json.loads(ids[0])) == 299 and len(json.loads(ids[1])) == 349
    series = q(
        db,
        "SELECT scope, node_id, metric, count(*) FROM reference_series WHERE source = 'real' GROUP BY ALL ORDER BY ALL",
    )
    assert series == [
        ("instance", 0, "gpu_mem_mb", 123), ("instance", 0, "prefix_hit_pct", 123),
        ("instance", 1, "gpu_mem_mb", 123), ("instance", 1, "prefix_hit_pct", 123),
        ("pool", None, "cpu_mem_mb", 123), ("pool", None, "cpu_prefix_hit_pct", 123),
    ]  # fmt: skip
    (model, hw, tp, doc), = q(db, "SELECT model, hardware, tp, profile FROM operator_profiles")  # fmt: skip
    prof = json.loads(doc)
    assert (model, hw, tp) == ("meta-llama/Llama-3.1-8B", "A6000", 1)
    assert prof["format"] == "pdlab-operator-profile" and prof["memory_gbps"] == 768
    cfg = json.loads(q(db, "SELECT config FROM runs")[0][0])
    assert cfg["frontend"]["rule"] == "round_robin" and "39,877" in cfg["frontend"]["why"]
    eng = cfg["instances"][0]["engine"]
    assert (eng["max_num_seqs"], eng["max_num_batched_tokens"]) == (
        256,
        2048,
    )  # vLLM's defaults < 70 GiB
    assert cfg["instances"][0]["sources"]["max_num_seqs"].startswith("assumed")


def test_peers_series_beside_the_reference_and_a_latency_table(tmp_path: Path) -> None:
    db = tmp_path / "f5.duckdb"
    lat = tmp_path / "MD_latency.tsv"
    lat.write_text(
        "framework\tthroughput_tok_s\tmean_ttft_ms\tmean_tpot_ms\nVidur\t1765.5\t59.1\tX\nvLLM\t1858.47\t50.33\t22.665\n"
    )
    fig = A6000 / "figure_5"
    gpu_first = tmp_path / "profiles"  # the <GPU>/<org>/<model>/tp<N> layout
    gpu_first.mkdir()
    (gpu_first / "A6000").symlink_to(A6000 / "profiles", target_is_directory=True)
    args = base(fig / "config/PDD_config.json", LLAMA, "pdd", db)
    args[args.index("--profiles") + 1] = str(gpu_first)
    res = runner.invoke(app, [*args,
                              "--reference-throughput", str(fig / "reference/PDD_throughput.tsv"),
                              "--reference-latency", str(lat), "--max-num-seqs", "128", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [i["role"] for i in out["instances"]] == ["prefill", "decode"]
    assert out["instances"][0]["max_num_seqs"] == 128
    assert out["reference_series"] == ["LLMServingSim:throughput_tok_s", "real:throughput_tok_s"]
    assert q(db, "SELECT framework, is_real, throughput_tok_s, ttft_mean_s, tpot_mean_s FROM reference_latency ORDER BY framework") == [
        ("Vidur", False, 1765.5, pytest.approx(0.0591), None), ("vLLM", True, 1858.47, pytest.approx(0.05033), pytest.approx(0.022665)),
    ]  # fmt: skip
    assert q(db, "SELECT count(*) FROM request_tokens") == [(300,)]  # the file has them
    assert q(db, "SELECT source FROM operator_profiles")[0][0].startswith(str(gpu_first / "A6000"))


def _broken(tmp_path: Path, kind: str) -> tuple[list[str], str]:
    db = tmp_path / "kept.duckdb"
    if kind == "config":
        cfg = json.loads((F7 / "config/MD+PC+PS_config.json").read_text())
        del cfg["nodes"][0]["instances"][1]["npu_mem"]
        p = tmp_path / "c.json"
        p.write_text(json.dumps(cfg, indent=2))
        args = md_pc_ps(db, "new")
        args[args.index("--config") + 1] = str(p)
        return args, "field nodes.instances.npu_mem: missing"
    if kind == "dataset":
        rows = (
            gzip.decompress(PULSE.with_name(PULSE.name + ".gz").read_bytes()).decode().splitlines()
        )
        r = json.loads(rows[6])
        r["input_tok_ids"] = r["input_tok_ids"][:-1]
        rows[6] = json.dumps(r)
        p = tmp_path / "d.jsonl"
        p.write_text("\n".join(rows) + "\n")
        args = md_pc_ps(db, "new")
        args[args.index("--dataset") + 1] = str(p)
        return args, "line 7: field input_tok_ids: has"
    if kind == "prefix":
        p = tmp_path / "inst1.tsv"
        text = (F7 / "reference/MD+PC+PS_inst1.tsv").read_text().splitlines()
        text[3] = text[3].replace("\t0", "\tlots", 1)
        p.write_text("\n".join(text) + "\n")
        args = md_pc_ps(db, "new")
        args[args.index(str(F7 / "reference/MD+PC+PS_inst1.tsv"))] = str(p)
        return args, "inst1.tsv: line 4: field prefix_hit_pct"
    if kind == "profiles":
        args = md_pc_ps(db, "new")
        empty = tmp_path / "empty"
        empty.mkdir(exist_ok=True)
        args[args.index("--profiles") + 1] = str(empty)
        return args, "no profile of meta-llama/Llama-3.1-8B on A6000 at TP 1"
    if kind == "sharing":
        args = base(F7 / "config/MD+PC+PS_config.json", PULSE, "new", db)
        return [
            *args,
            "--prefix-caching",
            "--prefix-sharing",
        ], "--prefix-sharing shares a prefix storage tier"
    assert kind == "again"
    return md_pc_ps(db, "md"), "run 'md' already exists"


@pytest.fixture(scope="module")
def holding_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database that already holds one run ('md', figure 5's MD setup)."""
    path = tmp_path_factory.mktemp("held") / "held.duckdb"
    ok = runner.invoke(app, base(A6000 / "figure_5/config/MD_config.json", LLAMA, "md", path))
    assert ok.exit_code == 0, ok.output
    return path


@pytest.mark.parametrize("kind", ["config", "dataset", "prefix", "profiles", "sharing", "again"])
def test_bad_input_is_one_line_and_leaves_the_database_as_it_was(
    tmp_path: Path, holding_one: Path, kind: str
) -> None:
    db = tmp_path / "kept.duckdb"
    shutil.copy(holding_one, db)
    before = open_reader(db).runs()["run_id"].to_list()
    args, message = _broken(tmp_path, kind)
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert open_reader(db).runs()["run_id"].to_list() == before == ["md"]
    assert q(db, "SELECT count(*) FROM requests") == [(300,)]
