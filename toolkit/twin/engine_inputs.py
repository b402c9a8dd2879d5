"""What an engine model needs to replay an imported run: settings, KV capacity, pricer, requests.

`load_engine_inputs(db, run, profile)` gathers, for one imported run (toolkit.importers):
- the recorded engine settings (`runs.config["engine"]`), with flags overriding them
  (`--gpu-memory-gib`, `--gpu-memory-utilization`, batch limits);
- the iteration pricer and model shape of a `pdlab profile import` document;
- the KV capacity per engine: the recorded KV blocks, or, when GPU memory is given or
  nothing was recorded, vLLM's budget from GPU memory (cluster.hardware.engine_settings);
- the recorded requests to replay: arrival (engine clock, s since the run's start), input
  and output tokens, the engine (DP rank) that served them, and their measured timestamps.
It checks that the profile was built for the engine's TP degree, and that it describes the
run's model and GPU (toolkit.twin.guards: refused unless `force`; `guards` says what was
checked, what was forced and where the run leaves the profile's measured grid). The
pricer takes the engine's DP and EP degrees, and the link flags, else a link the profile
fitted in situ on a run of the engine (toolkit.profiles.torch_calibration: the collectives
as the ranks' lockstep pays for them, waits included), else the interconnect the run
recorded (`config["interconnect"]`, e.g. from a cluster description), else the profile's
link; `link` says which link prices the collectives.

A DP run's requests keep their recorded rank when the run recorded one (`ranks`
"recorded"); otherwise (the importer says "dp_ranks": "not recorded", or an older import
put every request on rank 0) their rank is left to the replay, which assigns them as
vLLM's DP load balancer does (`ranks` "vLLM's DP load balancer",
cluster.sim.engine_model.dp_balance). `parameters` lists what no data measured, with
sources and ranges (toolkit.twin.parameters); `overhead` is the replay's CPU overhead.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from cluster.core import ConfigError
from cluster.hardware.engine_settings import GIB, EngineSettings, KvCapacity
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import OperatorProfile
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profiles import load_profile
from cluster.sim.engine_model import IterationOverhead
from toolkit.queries.run import Source, open_run
from toolkit.twin.guards import GuardReport, check_profile, extrapolation
from toolkit.twin.parameters import ReplayParameter, replay_parameters

BALANCED = "vLLM's DP load balancer"


class EngineInputs(NamedTuple):
    run_id: str
    engine: EngineSettings
    shape: ModelShape
    pricer: IterationPricer
    kv: KvCapacity
    arrivals: str  # 'recorded', 'burst' or 'unknown' (see toolkit.importers)
    requests: pl.DataFrame  # request_id, t_arrival, t_in, t_c, t_out, node, t_first_token, t_done
    link: str  # where the collectives' bandwidth and latency come from
    ranks: str = "recorded"  # or BALANCED: the replay assigns the DP ranks
    overhead: IterationOverhead = IterationOverhead()
    parameters: tuple[ReplayParameter, ...] = ()
    guards: GuardReport | None = None
    config: dict[str, Any] | None = None  # the run's recorded config
    calibration: dict[str, Any] | None = None  # the profile's in-situ calibration record


def load_engine_inputs(
    source: Source,
    run_id: str | None,
    profile: str | Path,
    *,
    gpu_memory_gib: float | None = None,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    link_gbps: float | None = None,
    link_latency_s: float | None = None,
    force: bool = False,
) -> EngineInputs:
    """Settings, shape, pricer, KV capacity and requests of one imported run (module doc)."""
    prof = load_profile(str(profile))
    if prof.pricer is None or prof.model_shape is None:
        raise ConfigError(
            f"{profile}: not an operator profile (make one with `pdlab profile import`)"
        )
    op = OperatorProfile.from_json(json.loads(Path(profile).read_text()), str(profile))
    with open_run(source, run_id) as run:
        config = run.config()
        hardware = [
            str(h) for (h,) in run.rows("SELECT hardware FROM nodes WHERE run_id = ?", [run.run_id])
        ]
        reqs = run.df(
            "SELECT request_id, t_arrival, t_in, t_c, t_out, prefill_node AS node, "
            "t_first_token, t_done FROM requests WHERE run_id = ? ORDER BY t_arrival, request_id",
            [run.run_id],
        )
        rid = run.run_id
    doc = config.get("engine")
    if not isinstance(doc, dict):
        raise ConfigError(f"run {rid!r} has no engine settings (import it with `pdlab import`)")
    engine = EngineSettings.from_json(doc).with_overrides(
        gpu_memory_bytes=None if gpu_memory_gib is None else int(gpu_memory_gib * GIB),
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    shape = prof.model_shape
    guards = check_profile(op, config, hardware, force=force, profile=str(profile))
    if prof.pricer.parallel.tp != engine.tensor_parallel_size:
        raise ConfigError(
            f"profile {profile} prices TP {prof.pricer.parallel.tp}; run {rid!r} ran TP "
            f"{engine.tensor_parallel_size} (import the profile with --tp {engine.tensor_parallel_size})"
        )
    if gpu_memory_gib is not None or gpu_memory_utilization is not None:
        # Memory flags ask for vLLM's budget, not the blocks the recorded run allocated.
        kv = engine.kv_capacity(shape, reserve_bytes=engine.non_kv_reserve_bytes(shape))
    else:
        kv = engine.kv_capacity(shape)
    source = getattr(prof, "link_source", "")
    pricer, link = _pricer_for(prof.pricer, engine, config, link_gbps, link_latency_s, source)
    context = int((reqs["t_in"] + reqs["t_out"]).max() or 0) if reqs.height else 0
    guards = guards._replace(extrapolating=extrapolation(op, engine, context))
    ranks = "recorded"
    if engine.data_parallel_size > 1 and not _ranks_recorded(config, reqs):
        ranks = BALANCED
        reqs = reqs.with_columns(pl.lit(None, dtype=reqs["node"].dtype).alias("node"))
    overhead = IterationOverhead()
    # a memory flag is a nominal size; so is a cluster description's (not the device's)
    nominal = gpu_memory_gib is not None or config.get("gpu_memory_source") != "device"
    params = replay_parameters(
        engine, shape, pricer, kv, link, eager=bool(config.get("enforce_eager")), nominal_memory=nominal,
    )  # fmt: skip
    arrivals = str(config.get("arrivals", "recorded"))
    return EngineInputs(
        rid, engine, shape, pricer, kv, arrivals, reqs, link, ranks, overhead, params, guards,
        config, getattr(prof, "calibration", None),
    )  # fmt: skip


def _ranks_recorded(config: dict[str, Any], reqs: pl.DataFrame) -> bool:
    """Whether the requests' DP ranks are the ones that served them (module docstring)."""
    said = config.get("dp_ranks")
    if said is not None:
        return said == "recorded"
    # imported before the importer said: every request on rank 0 is the default, not a rank
    return reqs.height == 0 or bool((reqs["node"].fill_null(0) != 0).any())


def _pricer_for(
    pricer: IterationPricer,
    engine: EngineSettings,
    config: dict[str, Any],
    link_gbps: float | None,
    link_latency_s: float | None,
    profile_link: str = "",
) -> tuple[IterationPricer, str]:
    """The profile's pricer with the engine's DP/EP and the best-known link (module doc)."""
    par = pricer.parallel
    recorded = config.get("interconnect")
    rec = recorded if isinstance(recorded, dict) else {}
    if profile_link.startswith("fitted"):
        rec = {}  # fitted in situ beats a link measured alone or described
    gbps = next((v for v in (link_gbps, rec.get("link_gbps"), par.link_gbps) if v is not None), 0.0)
    lat = next(
        (
            v
            for v in (link_latency_s, rec.get("link_latency_s"), par.link_latency_s)
            if v is not None
        ),
        0.0,
    )
    if link_gbps is not None or link_latency_s is not None:
        link = "flags"
    elif rec:
        link = f"recorded ({rec.get('source', 'run config')})"
    elif profile_link:
        link = f"profile ({profile_link})"
    else:
        link = "profile's assumption"
    if gbps <= 0 or lat < 0:
        raise ConfigError(f"link: bandwidth must be > 0 and latency >= 0, got {gbps} GB/s, {lat} s")
    new = replace(
        par,
        dp=engine.data_parallel_size,
        ep=engine.expert_parallel_size,
        link_gbps=float(gbps),
        link_latency_s=float(lat),
    )
    if new == par:
        return pricer, link
    return IterationPricer(pricer.tables, pricer.shape, new, pricer.memory_gbps), link


def engine_settings(source: Source, run_id: str | None = None) -> EngineSettings | None:
    """The engine settings an imported run recorded (None for runs without them)."""
    with open_run(source, run_id) as run:
        doc = run.config().get("engine")
    return EngineSettings.from_json(doc) if isinstance(doc, dict) else None
