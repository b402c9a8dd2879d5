"""A pdlab profile from an operator profile and a model config (`pdlab profile import`).

Two folder layouts of LLMServingSim are read: dense.csv + per_sequence.csv + attention.csv
[+ moe.csv] (cluster.hardware.operator_tables) and layers.csv + attention.csv
(cluster.hardware.layer_tables); both become the same operator tables, grid and fits.

`build_profile` composes the iteration time of every point of the measured attention grid
(cluster.hardware.pricer: layers x (dense ops + attention) + per-iteration ops, MoE, TP
communication) whose tokens lie inside the measured dense grid, in three phases: pure
prefill chunks, pure decode batches and mixed iterations (a chunk with decodes). Each
phase's candidate forms (models.forms) are scored by 5-fold cross-validation over random
point buckets; the simplest within one standard error of the best is chosen. Per form it
reports the coefficients, robust 95% intervals (a cluster bootstrap over the grid's chunk
sizes or batch sizes, models.selection.robust_ci) and held-out MAPE (every point predicted by
a fit that did not see it).

A bundle calibrated in situ on a recorded run (`calibration.json` beside the tables, as
toolkit.profiles.torch_calibration writes it) keeps that record (`calibration`), and a
bundle's `link.json` names where the collectives' link came from (`link_source`, when the
profile's link is that one); both are in the notes.

The JSON document (`format` "pdlab-operator-profile") carries the operator tables too, so
`OperatorProfile.pricer` prices any mixed batch exactly as the grid does, and the model's
KV bytes per token and weight bytes (per rank and in all). cluster.hardware.profiles
turns it into a simulator profile (`--profile PROFILE.json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cluster.core import ConfigError
from cluster.hardware.attention_kernel import flash_attention_version
from cluster.hardware.engine_settings import EngineSettings
from cluster.hardware.layer_tables import is_layers_layout, load_layer_tables
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import OperatorTables
from cluster.hardware.pricer import IterationPricer, Parallelism
from models.fitting import FitError, GramStats, fit_from_gram, mape
from models.forms import Form, Phase, candidates, form_by_label
from models.selection import Candidate, choose_form
from models.work import attn_pairs

FORMAT = "pdlab-operator-profile"
VERSION = 1
FOLDS = 5
NUM_BUCKETS = 20
MIN_POINTS = 20  # a phase needs this many grid points to be fitted
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class FormFit:
    """One form fitted on one phase of the grid."""

    form: str
    terms: tuple[str, ...]
    coef: tuple[float, ...]
    ci: tuple[tuple[float, float], ...] | None
    mape: float  # held-out (5-fold) MAPE, fraction
    cv_rmse: float

    def to_json(self) -> dict[str, Any]:
        return {
            "terms": list(self.terms),
            "coef": list(self.coef),
            "ci": None if self.ci is None else [list(c) for c in self.ci],
            "mape": self.mape,
            "cv_rmse": self.cv_rmse,
        }


@dataclass(frozen=True, slots=True)
class PhaseFits:
    phase: Phase
    points: int
    chosen: str
    forms: dict[str, FormFit]

    @property
    def best(self) -> FormFit:
        return self.forms[self.chosen]

    @property
    def paper(self) -> FormFit:
        return self.forms["paper"]


@dataclass(eq=False)
class OperatorProfile:
    """An imported operator profile: tables, model, parallelism, fits (module docstring)."""

    name: str
    tables: OperatorTables
    shape: ModelShape
    parallel: Parallelism
    fits: dict[Phase, PhaseFits]
    hardware: str = ""
    source: str = ""
    engine: EngineSettings | None = None
    kv_tokens: int | None = None
    notes: tuple[str, ...] = ()
    memory_gbps: float | None = None  # GPU memory bandwidth (the pricer's attention floor)
    link_source: str = ""  # where the link was measured or fitted ("": assumed)
    calibration: dict[str, Any] | None = None  # the bundle's in-situ calibration record
    pricer: IterationPricer = field(init=False)

    def __post_init__(self) -> None:
        self.pricer = IterationPricer(self.tables, self.shape, self.parallel, self.memory_gbps)

    def to_json(self) -> dict[str, Any]:
        p = self.parallel
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "hardware": self.hardware,
            "source": self.source,
            "model": self.shape.to_json(),
            "parallel": {
                "tp": p.tp,
                "dp": p.dp,
                "ep": p.ep,
                "link_gbps": p.link_gbps,
                "link_latency_s": p.link_latency_s,
                "expert_load_skew": p.expert_load_skew,
            },
            "kv_bytes_per_token": self.shape.kv_bytes_per_token(p.tp),
            "kv_bytes_per_token_total": self.shape.kv_bytes_per_token_total(),
            "weight_bytes": self.shape.weight_bytes(p.tp, p.ep if self.shape.is_moe else 1),
            "weight_bytes_total": self.shape.weight_bytes(),
            "kv_tokens": self.kv_tokens,
            "engine": None if self.engine is None else self.engine.to_json(),
            "fits": {
                ph: {
                    "points": f.points,
                    "chosen": f.chosen,
                    "forms": {k: v.to_json() for k, v in f.forms.items()},
                }
                for ph, f in self.fits.items()
            },
            "notes": list(self.notes),
            "memory_gbps": self.memory_gbps,
            "link_source": self.link_source,
            "calibration": self.calibration,
            "tables": self.tables.to_json(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], source: str = "profile") -> OperatorProfile:
        if doc.get("format") != FORMAT:
            raise ConfigError(f"{source}: not a {FORMAT} document")
        try:
            fits = {
                ph: PhaseFits(
                    ph,
                    int(f["points"]),
                    str(f["chosen"]),
                    {
                        k: FormFit(
                            k,
                            tuple(v["terms"]),
                            tuple(float(c) for c in v["coef"]),
                            None
                            if v["ci"] is None
                            else tuple((float(a), float(b)) for a, b in v["ci"]),
                            float(v["mape"]),
                            float(v["cv_rmse"]),
                        )
                        for k, v in f["forms"].items()
                    },
                )
                for ph, f in doc["fits"].items()
            }
            engine = doc.get("engine")
            return cls(
                name=str(doc["name"]),
                tables=OperatorTables.from_json(doc["tables"]),
                shape=ModelShape.from_json(doc["model"]),
                parallel=Parallelism(**doc["parallel"]),
                fits=fits,
                hardware=str(doc.get("hardware", "")),
                source=str(doc.get("source", "")),
                engine=None if engine is None else EngineSettings.from_json(engine),
                kv_tokens=doc.get("kv_tokens"),
                notes=tuple(doc.get("notes", ())),
                memory_gbps=doc.get("memory_gbps"),
                link_source=str(doc.get("link_source") or ""),
                calibration=doc.get("calibration"),
            )
        except ConfigError as exc:  # a value past its ceiling, an impossible model
            raise ConfigError(f"{source}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: malformed {FORMAT} document ({exc!r})") from None


def grid_rows(
    pricer: IterationPricer,
) -> dict[Phase, tuple[dict[str, FloatArray], FloatArray, FloatArray]]:
    """Per phase: form row fields, composed iteration seconds, and cluster ids of every
    measured attention point whose tokens are inside the measured dense grid."""
    a = pricer.tables.attention
    out: dict[Phase, tuple[dict[str, FloatArray], FloatArray, FloatArray]] = {}
    limit = pricer.tables.max_tokens
    for phase in ("prefill", "decode", "mixed"):
        pc, kp, nd, kd = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
        if phase == "prefill":
            keep = (pc > 0) & (nd == 0)
        elif phase == "decode":
            keep = (pc == 0) & (nd > 0)
        else:
            keep = (pc > 0) & (nd > 0)
        keep &= pc + nd <= limit
        pc, kp, nd, kd = pc[keep], kp[keep], nd[keep], kd[keep]
        y = np.array(
            [
                pricer.time([(int(u), int(c))] if u > 0 else [], [int(k)] * int(b))
                for u, c, b, k in zip(pc, kp, nd, kd, strict=True)
            ]
        )
        rows = {
            "t_uc": pc,
            "attn_pairs": np.where(pc > 0, attn_pairs(pc, kp), 0.0),
            "t_rst": np.zeros_like(pc),
            "t_c": kp,
            "batch_size": nd,
            "t_fwd": np.ones_like(pc),
            "ctx_tokens": nd * kd,
            "num_seqs": (pc > 0) + nd,
        }
        cluster = pc if phase == "prefill" else nd if phase == "decode" else pc * 1000 + nd
        out[phase] = (rows, y, cluster)
    return out


def _buckets(x: FloatArray, y: FloatArray, ids: npt.NDArray[np.int64]) -> list[GramStats]:
    return [GramStats.from_rows(x[ids == b], y[ids == b]) for b in np.unique(ids)]


def fit_phase(
    phase: Phase,
    rows: dict[str, FloatArray],
    y: FloatArray,
    cluster: FloatArray,
    shape: ModelShape,
    seed: int = 0,
) -> PhaseFits:
    """Fit every candidate form of a phase; choose by CV (models.selection.choose_form),
    refitted on every point, with intervals from resampling the grid's clusters."""
    rng = np.random.default_rng(seed)
    fold_of = rng.permutation(len(y)) % NUM_BUCKETS
    _, cl = np.unique(cluster, return_inverse=True)
    k, e = shape.top_k, shape.num_experts
    designs = {f.label: (f, f.design(rows, k, e)) for f in candidates(phase, "auto")}

    def candidate(form: Form, x: FloatArray) -> Candidate:
        # The interval's clusters are bucketed only for the forms reported.
        folds = _buckets(x, y, fold_of)
        return Candidate(form, folds, GramStats.from_rows(x, y), lambda: _buckets(x, y, cl))

    scored = [candidate(f, x) for f, x in designs.values()]
    always = ("c0", "d0", "m0")  # every form keeps its constant
    choice = choose_form(scored, folds=FOLDS, always=always, interval="robust")
    scores = {s.form.label: s for s in choice.scores}
    forms: dict[str, FormFit] = {}
    for c in scored:
        label = c.form.label
        if label not in scores or (label != "paper" and label != choice.form.label):
            continue  # scored, not reported: only the paper form and the chosen one
        try:
            fit = (
                choice
                if label == choice.form.label
                else choose_form([c], always=always, interval="robust")
            )
        except FitError:
            continue
        forms[label] = FormFit(
            label,
            c.form.terms,
            fit.coef,
            fit.ci,
            _heldout_mape(c.form, designs[label][1], y, fold_of, always),
            scores[label].cv_rmse,
        )
    return PhaseFits(phase, len(y), choice.form.label, forms)


def _heldout_mape(
    form: Form, x: FloatArray, y: FloatArray, fold_of: Any, always: tuple[str, ...]
) -> float:
    pred = np.empty_like(y)
    for f in range(FOLDS):
        test = fold_of % FOLDS == f
        coef, _ = fit_from_gram(GramStats.from_rows(x[~test], y[~test]), form.terms, always=always)
        pred[test] = x[test] @ coef
    return mape(y, pred)


def build_profile(
    directory: str | Path,
    shape: ModelShape,
    *,
    tp: int = 1,
    profiled_tp: int | None = None,
    parallel: Parallelism | None = None,
    engine: EngineSettings | None = None,
    hardware: str = "",
    name: str | None = None,
    layout: str = "auto",
    memory_gbps: float | None = None,
) -> OperatorProfile:
    """Load an LLMServingSim bundle, compose its grid and fit every phase's forms.

    `profiled_tp` is the TP the bundle was measured at (default: the `tp<N>` in the
    directory name, else 1); a TP 1 bundle is scaled to `tp` (operator_tables docstring).
    `layout` is "dense" (dense.csv, per_sequence.csv, attention.csv[, moe.csv]), "layers"
    (layers.csv + attention.csv, cluster.hardware.layer_tables) or "auto" (detected).
    """
    d = Path(directory)
    if profiled_tp is None:
        profiled_tp = int(d.name[2:]) if d.name.startswith("tp") and d.name[2:].isdigit() else 1
    layout = profile_layout(d, layout)
    if layout == "layers":
        tables = load_layer_tables(d, shape, profiled_tp=profiled_tp, tp=tp)
        need, where = ("q_proj", "o_proj"), "layers.csv"
    else:
        tables = OperatorTables.load(d, profiled_tp=profiled_tp, tp=tp)
        need, where = ("qkv_proj", "o_proj"), "dense.csv"
    tables = replace(tables, fa_version=flash_attention_version(hardware))
    par = parallel or Parallelism(tp=tp)
    if par.tp != tp:
        raise ConfigError(f"parallelism tp={par.tp} differs from tp={tp}")
    missing = [op for op in need if op not in tables.ops]
    if missing:
        raise ConfigError(
            f"{d}: {where} has no {', '.join(missing)} rows: not a decoder-layer profile"
        )
    if memory_gbps is not None and memory_gbps <= 0:
        raise ConfigError(f"memory bandwidth must be > 0 GB/s, got {memory_gbps}")
    pricer = IterationPricer(tables, shape, par, memory_gbps)
    notes = [
        f"measured at TP {profiled_tp}" + (f", scaled to TP {tp}" if tp != profiled_tp else ""),
        "no CUDA graphs, no CPU scheduling time in the operator times (eager profiling)",
    ]
    fits: dict[Phase, PhaseFits] = {}
    for phase, (rows, y, cluster) in grid_rows(pricer).items():
        if len(y) < MIN_POINTS:
            if phase != "mixed":
                raise ConfigError(
                    f"{d}: attention.csv has {len(y)} {phase} points inside the dense grid, need {MIN_POINTS}"
                )
            notes.append(f"no mixed fit: {len(y)} mixed points in the grid")
            continue
        fits[phase] = fit_phase(phase, rows, y, cluster, shape)
    link_source, calibration = _bundle_link_source(d, par), _bundle_calibration(d)
    if calibration is not None:
        notes.append(
            f"calibrated in situ: fitted on run {calibration.get('fitted_on') or calibration.get('run')}"
            f" (fixed costs x{calibration.get('fixed_factor', 1.0):.3g}, per-unit costs "
            f"x{calibration.get('unit_factor', 1.0):.3g})"
        )
    if tp > 1 or par.ep > 1:
        said = link_source or "assumed"
        notes.append(
            f"communication {said}: {par.link_gbps:g} GB/s, {par.link_latency_s * 1e6:g} us per collective"
        )
    kv_tokens = None
    if engine is not None and (engine.num_gpu_blocks or engine.gpu_memory_bytes):
        kv_tokens = engine.kv_capacity(shape).tokens
    return OperatorProfile(
        name or f"{shape.name}-tp{tp}",
        tables,
        shape,
        par,
        fits,
        hardware=hardware,
        source=str(d),
        engine=engine,
        kv_tokens=kv_tokens,
        notes=tuple(notes),
        memory_gbps=memory_gbps,
        link_source=link_source,
        calibration=calibration,
    )


def _bundle_calibration(d: Path) -> dict[str, Any] | None:
    """The bundle's in-situ calibration record (`calibration.json`), if it has one."""
    import json

    path = d / "calibration.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a calibration record (a JSON object)")
    return {k: v for k, v in doc.items() if k != "db"}  # where it was fitted is local


def _bundle_link_source(d: Path, par: Parallelism) -> str:
    """`link.json`'s source when the profile's link is that file's, else ""."""
    import json

    path = d / "link.json"
    if not path.is_file():
        return ""
    try:
        doc = json.loads(path.read_text())
        same = np.isclose(float(doc["link_gbps"]), par.link_gbps, rtol=1e-5) and np.isclose(
            float(doc["link_latency_s"]), par.link_latency_s, rtol=1e-5
        )
    except (ValueError, KeyError, TypeError):
        return ""
    return str(doc.get("source") or "") if same else ""


LAYOUTS = ("auto", "dense", "layers")


def profile_layout(directory: Path, layout: str = "auto") -> str:
    """ "dense" or "layers": the given layout, or the one the folder's files show."""
    if layout not in LAYOUTS:
        raise ConfigError(f"profile layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if layout != "auto":
        return layout
    # without layers.csv the dense loader names what is missing (dense.csv first)
    return "layers" if is_layers_layout(directory) else "dense"


def chosen_form(profile: OperatorProfile, phase: Phase) -> Form:
    return form_by_label(phase, profile.fits[phase].chosen)
