"""What the twin of a PD cluster run needs: its recorded settings, a profile from its own fits,
its finished requests, and the open-loop trace that replays them (SPEC §9; paper 000 §5.1).

A cluster run is one whose config names its nodes and split: a live torch or SGLang cluster
(`"engines"`: each engine's role, KV page size, chunk budget and KV capacity; `"cluster"`: the
router, decode binder and KV fetch) or a simulated run (`"nodes"`, `"split"`, the preset
profile). Each node is priced by the run's own iteration logs: `toolkit.fit.forms` fits
each node's forms chosen by cross-validation (Eq. 1 and Eq. 2 or their extensions) to its
passes' wall time (`TARGET`), holding 20% of the iterations out to measure the fits' MAPE
(or none when a phase has too few iterations to fit otherwise), and
`cluster.hardware.profiles.from_fit_doc` combines them per phase (the prefill nodes' fits
price prefill, the decode nodes' fits decode, sample-weighted; the simulator prices every
node of a phase alike) on a base profile holding the engine's block size, chunk budget, KV
capacity and MoE shape, with no noise and no context term the fits did not have. The fits
minimize relative error (what held-out MAPE rewards), which under heavy-tailed noise prices
a typical pass, not the mean one; a simulator adds pass times, so each phase's coefficients
are multiplied by the run's summed measured pass time over the summed time the fits give
its passes (`mean_scale`: about 1 on a simulator's 3% noise; on a loaded CPU the share of a
core the engines got, 2-4x). A live run's serving overheads (the time around the passes:
proxy, wake-up, KV hand-off, decode join, streaming, each pass's CPU overhead) come from
its `overhead_fits` or its request stages (`run_overheads`, toolkit.fit.overheads) and are
priced by the simulator where they happen (SimConfig.overheads).

The workload follows what the run recorded rather than regenerating it: the agent loop of a
live run waits in wall time for tool pauses, caps response lengths and scales token counts,
and its agents release turns when their previous call completes, so a regenerated workload
would differ from the one served before any timing does. `write_trace` writes the run's
finished requests as an open-loop Mooncake trace (cluster.workloads.traces): each at its
recorded arrival, with its recorded input and output lengths, and its recorded cached prefix
t_c as the leading blocks of one shared block chain, so the simulated prefill node finds
(about) the same prefix cached as the real one did. A priming request of the longest such
prefix runs first and every arrival is shifted by `lead_s`, so that chain is cached before
the first recorded request arrives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from cluster.core import ConfigError, parse_split
from cluster.hardware.profiles import PRESETS, HardwareProfile, from_fit_doc
from models.overheads import ServingOverheads
from toolkit.fit.forms import fit_run_forms
from toolkit.fit.run import FitInputError, RunFit, to_json
from toolkit.queries.run import open_run

HOLDOUT = 0.2  # iterations held out of the fits to measure their MAPE
# The twin prices passes in wall time: forms fitted to it carry how the share of a core an
# engine gets falls as the cluster gets busy (larger batches), which the passes' CPU time
# (`pdlab fit`'s default where measured) times one ratio would miss.
TARGET = "wall"
REQUEST_COLUMNS = (
    "request_id",
    "t_arrival",
    "t_in",
    "t_c",
    "t_out",
    "t_first_token",
    "t_done",
)


@dataclass(frozen=True, slots=True)
class RecordedCluster:
    """The settings of a recorded PD cluster run that its twin reproduces."""

    source: str  # the run's source: torch, sglang, sim, ...
    nodes: int
    split: str  # XPYD, or collocated (simulated runs only)
    router: str
    decode_binder: str | None
    kv_fetch: str | None
    eviction: str
    block_tokens: int
    chunk_tokens: int
    kv_tokens: int  # L1 (GPU) KV capacity per node
    host_kv_tokens: int  # L2 (host)
    max_decode_batch: int
    base: str  # the preset whose other fields (KV transfer times, ...) the twin keeps
    switches: int  # phase switches the run recorded (the twin keeps the initial split)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


class ClusterInputs(NamedTuple):
    run_id: str
    cluster: RecordedCluster
    fits: RunFit
    profile: HardwareProfile  # the fits' coefficients times `scale`
    scale: tuple[float, float]  # (prefill, decode): measured / modelled pass time, summed
    requests: pl.DataFrame  # finished requests (REQUEST_COLUMNS), by arrival
    # the run's serving overheads (stored in overhead_fits, else fitted from its stages);
    # None when it recorded none (a simulated run, an engine without stage stamps)
    overheads: ServingOverheads | None = None


def recorded_cluster(config: dict[str, Any], source: str, switches: int) -> RecordedCluster:
    """The cluster settings a run's config records; ConfigError for a run that is no cluster
    run (an imported benchmark of one engine)."""
    engines = config.get("engines")
    if isinstance(engines, list) and engines and isinstance(config.get("cluster"), dict):
        from cluster.engines.torch.config import EngineConfig

        c = config["cluster"]
        defaults = EngineConfig()
        roles = [str(e.get("role")) for e in engines]
        p, d = roles.count("prefill"), roles.count("decode")
        first = engines[0]
        kv = int(first.get("kv_capacity_tokens") or 0)
        if p + d != len(roles) or not p or not d or kv <= 0:
            raise ConfigError(
                f"run's engines have roles {roles} and KV capacity {kv}: the cluster twin needs "
                "prefill and decode engines with a recorded KV capacity"
            )
        return RecordedCluster(
            source=source,
            nodes=len(roles),
            split=f"{p}P{d}D",
            router=str(c.get("router", "ttft")),
            decode_binder=c.get("decode_binder"),
            kv_fetch=c.get("kv_fetch"),
            eviction=str(c.get("eviction", "branch")),
            block_tokens=int(first.get("block_size") or c.get("block_tokens") or 16),
            chunk_tokens=int(first.get("chunk_tokens") or defaults.chunk_tokens),
            kv_tokens=kv,
            # the torch engine's host tier is 4x its GPU pool by default, as a preset's L2
            host_kv_tokens=4 * kv,
            max_decode_batch=defaults.max_running,
            base="gb300",
            switches=switches,
        )
    if "split" in config and "nodes" in config:
        base = str(config.get("profile"))
        b = PRESETS.get(base, PRESETS["gb300"])
        nodes = int(config["nodes"])
        parse_split(str(config["split"]), nodes)
        return RecordedCluster(
            source=source,
            nodes=nodes,
            split=str(config["split"]),
            router=str(config.get("router", "ttft")),
            decode_binder=config.get("decode_binder"),
            kv_fetch=config.get("kv_fetch"),
            eviction=str(config.get("eviction", "branch")),
            block_tokens=b.block_tokens,
            chunk_tokens=b.chunk_tokens,
            kv_tokens=int(config.get("l1_tokens") or b.l1_tokens),
            host_kv_tokens=int(config.get("l2_tokens") or b.l2_tokens),
            max_decode_batch=b.max_decode_batch,
            base=b.name,
            switches=switches,
        )
    raise ConfigError(
        "not a PD cluster run (its config records no engines and no split): the cluster twin "
        "replays live torch/SGLang or simulated cluster runs; give --profile to replay an "
        "imported benchmark on engine models"
    )


def fitted_profile(
    fits: RunFit, cluster: RecordedCluster, shape: tuple[int, int]
) -> HardwareProfile:
    """The simulator profile of the run's own fits (module docstring); `shape` is the MoE
    (top_k, experts) the run's nodes record."""
    top_k, experts = shape
    b = PRESETS[cluster.base]
    live = cluster.source != "sim"
    base = replace(
        b,
        top_k=top_k if experts else b.top_k,
        num_experts=experts,
        # A live engine feeds one token per request per pass; a simulated run keeps its
        # preset's speculative decoding, which its decode rows were priced with.
        t_fwd=1.0 if live else b.t_fwd,
        t_acc=1.0 if live else b.t_acc,
        decode_ctx_s_per_token=0.0,
        noise=0.0,
        l1_tokens=cluster.kv_tokens,
        l2_tokens=cluster.host_kv_tokens,
        chunk_tokens=cluster.chunk_tokens,
        block_tokens=cluster.block_tokens,
        max_decode_batch=cluster.max_decode_batch,
        hardware=f"twin of {fits.run_id}",
    )
    doc = to_json(fits)
    for n in doc["nodes"]:
        n["moe_top_k"], n["moe_experts"] = base.top_k, base.num_experts
    try:
        return from_fit_doc(doc, f"fits of run {fits.run_id}", base)
    except ConfigError as exc:
        notes = "; ".join(
            str(f.message)
            for n in fits.nodes
            for f in (n.prefill, n.decode)
            if not f.ok and f.message
        )
        raise ConfigError(
            f"{exc} (the twin prices each phase by them){': ' if notes else ''}{notes}"
        ) from None


def mean_scale(run: Any, profile: HardwareProfile) -> tuple[float, float]:
    """Per phase, the run's summed pass time over the summed time `profile` prices its
    passes at, every term of its forms included (module docstring: the fits are relative,
    or of the passes' CPU time, and the simulator adds wall times)."""
    took = modelled = 0.0
    for t_uc, pairs, t_rst, t_c, dur in run.rows(
        "SELECT t_uc, attn_pairs, t_rst, t_c, duration_s FROM prefill_iterations WHERE run_id = ?",
        [run.run_id],
    ):
        modelled += profile.prefill_time(float(t_uc), float(pairs), float(t_rst), float(t_c))
        took += float(dur)
    prefill = took / modelled if modelled > 0 else 1.0
    modelled = took = 0.0
    for batch, ctx, total in run.rows(
        "SELECT batch_size, list(ctx_tokens::DOUBLE), sum(duration_s) FROM decode_iterations "
        "WHERE run_id = ? GROUP BY batch_size",
        [run.run_id],
    ):
        modelled += float(profile.decode_times(int(batch), np.asarray(ctx)).sum())
        took += float(total)
    return prefill, (took / modelled if modelled > 0 else 1.0)


def scaled(profile: HardwareProfile, prefill: float, decode: float) -> HardwareProfile:
    """`profile` with every prefill term times `prefill` and every decode term times
    `decode` (the knee stays: it is a token count)."""
    return replace(
        profile,
        prefill=tuple(c * prefill for c in profile.prefill),  # type: ignore[arg-type]
        prefill_kv_read_s_per_token=profile.prefill_kv_read_s_per_token * prefill,
        prefill_expert_s=profile.prefill_expert_s * prefill,
        decode=tuple(d * decode for d in profile.decode),  # type: ignore[arg-type]
        decode_ctx_s_per_token=profile.decode_ctx_s_per_token * decode,
    )


def load_cluster_inputs(
    db: str | Path, run_id: str | None, *, rescale: bool = True, overheads_on: bool = True
) -> ClusterInputs:
    """Settings, fits, profile, finished requests and serving overheads of one cluster run
    (module docstring); `rescale` False keeps the fits' coefficients as they are,
    `overheads_on` False leaves the overheads out (the passes alone)."""
    with open_run(db, run_id) as run:
        rid = run.run_id
        source = str(run.scalar("SELECT source FROM runs WHERE run_id = ?", [rid]))
        tables = {r[0] for r in run.rows("SELECT table_name FROM information_schema.tables")}
        counts = {
            t: run.count(t) if t in tables else 0
            for t in ("prefill_iterations", "decode_iterations")
        }
        switches = run.count("phase_switches") if "phase_switches" in tables else 0
        cluster = recorded_cluster(run.config(), source, switches)
        if not all(counts.values()):
            raise ConfigError(
                f"run {rid!r} has {counts['prefill_iterations']} prefill and "
                f"{counts['decode_iterations']} decode iteration rows: the cluster twin prices "
                "each node by fits of the run's own iteration logs, which it needs in both phases"
            )
        shapes = run.rows(
            "SELECT moe_top_k, moe_experts FROM nodes WHERE run_id = ? LIMIT 1", [rid]
        )
        cols = ", ".join(REQUEST_COLUMNS)
        df = (
            run.df(
                f"SELECT {cols} FROM requests WHERE run_id = ? AND t_first_token IS NOT NULL "
                "AND t_done IS NOT NULL ORDER BY t_arrival, request_id",
                [rid],
            )
            if "requests" in tables
            else pl.DataFrame()
        )
    if df.height == 0:
        raise ConfigError(f"run {rid!r} has no finished requests to replay")
    shape = (int(shapes[0][0]), int(shapes[0][1])) if shapes else (0, 0)
    try:
        fits = fit_run_forms(db, rid, form="auto", bootstrap=0, holdout=HOLDOUT, target=TARGET)
        if not (any(n.prefill.ok for n in fits.nodes) and any(n.decode.ok for n in fits.nodes)):
            # too few iterations to hold some out (a short run): fit on all of them
            fits = fit_run_forms(db, rid, form="auto", bootstrap=0, holdout=0.0, target=TARGET)
    except FitInputError as exc:
        raise ConfigError(str(exc)) from None
    profile = fitted_profile(fits, cluster, shape)
    scale = (1.0, 1.0)
    if rescale:
        with open_run(db, rid) as run:
            scale = mean_scale(run, profile)
        profile = scaled(profile, *scale)
    overheads = run_overheads(db, rid) if overheads_on else None
    return ClusterInputs(rid, cluster, fits, profile, scale, df, overheads)


def run_overheads(db: str | Path, run_id: str) -> ServingOverheads | None:
    """The run's serving overheads: those stored in `overhead_fits` (`pdlab fit`), else
    fitted now from its request stages and pass overheads, with its requests' stage
    vectors drawn jointly (models.overheads); None when it has neither."""
    from toolkit.fit.overheads import (
        REQUEST_STAGE_COLUMNS,
        fit_samples,
        load_overheads,
        request_matrix,
        stage_samples,
    )

    with open_run(db, run_id) as run:
        stored = load_overheads(run)
        got = stored if stored is not None else fit_samples(stage_samples(run))
        joint = request_matrix(run) if got else None
    if joint is not None:
        got = replace(got, joint_stages=REQUEST_STAGE_COLUMNS, joint_s=joint)
    return got or None


def priming_s(profile: HardwareProfile, tokens: int) -> float:
    """Modelled seconds to prefill `tokens` alone in chunks and decode one token."""
    t, done, chunk = 0.0, 0, profile.chunk_tokens
    while done < tokens:
        n = min(chunk, tokens - done)
        t += profile.prefill_time(n, n * done + n * (n + 1) / 2, 0.0)
        done += n
    return t + float(profile.decode_times(1, np.array([float(tokens)]))[0])


def write_trace(path: Path, requests: pl.DataFrame, profile: HardwareProfile) -> tuple[float, bool]:
    """Write `requests` as the Mooncake trace of module docstring; returns (lead_s, primed):
    the shift of every arrival, and whether a priming request comes first."""
    bt = profile.block_tokens
    t_in = requests["t_in"].to_list()
    t_c = requests["t_c"].to_list()
    # whole cached blocks, always leaving one token to compute
    blocks = [max(0, min(int(c), int(n) - 1)) // bt for c, n in zip(t_c, t_in, strict=True)]
    longest = max(blocks, default=0)
    lead_s = 1.0 + 2.0 * priming_s(profile, longest * bt) if longest else 0.0
    lines = []
    if longest:
        lines.append(
            {"timestamp": 0.0, "input_length": longest * bt, "output_length": 1,
             "hash_ids": list(range(longest))}
        )  # fmt: skip
    for arrival, n_in, n_out, k in zip(
        requests["t_arrival"].to_list(), t_in, requests["t_out"].to_list(), blocks, strict=True
    ):
        lines.append(
            {"timestamp": 1000.0 * (lead_s + float(arrival)), "input_length": int(n_in),
             "output_length": int(n_out), "hash_ids": list(range(k))}
        )  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return lead_s, bool(longest)
