"""Replay of recorded traces as agent programs (paper 003 §3.1-3.2, App. A; SPEC §5).

A trace fixes the logical programs (turns, token counts, tool durations), not their serving
trajectory: successor turns are still released causally, r_{k+1} = c_k + g_k (paper 003 §3.2).
Formats, sniffed from the file's extension and first record:

- SWE-agent turns (ThunderAgent, `.jsonl` with run/instance/step/input_tokens/...): one program
  per (run, instance), turns in step order. Turn k appends input_k - (input_{k-1} + output_{k-1})
  tokens when that is >= 0; otherwise the context shrank (the harness elided history) and the
  turn is a "compact" turn keeping the first prompt (system + task) and re-sending the rest as
  one new segment; `report.num_compactions` counts them. The gap before turn k is the recorded
  agent-side pause llm_enter_k - llm_exit_{k-1} (tool execution `tool_s` plus observation and
  harness overhead; the timestamps include both, `tool_s` alone would drop ~70% of the pause).
  The programs replay as a closed loop at the recorded concurrency (`run` = bs1/bs4/bs32 ->
  1/4/32 agents, `arrival_s` None); `recorded_turn_times` keeps the measured
  (prefill_time_s, decode_time_s) of every turn for validation.
- Mooncake (`.jsonl` with timestamp/input_length/output_length/hash_ids): one single-turn
  program per line, arriving at timestamp/1000 s (open loop). Each hash_id is one 512-token
  block and becomes the shared segment TRACE_BLOCK_BASE + hash_id, so equal hash_ids are equal
  segments across programs; the last block holds input_length - 512 (n - 1) tokens. Records
  whose blocks do not cover input_length exactly are repaired (blocks truncated, or the excess
  appended as private tokens) and counted in `report.num_block_fixes`.
- Azure LLM inference (`.csv` with arrived_at,num_prefill_tokens,num_decode_tokens): single-turn
  open-loop programs with unique content (the trace has no prefix information).
- Continuum SWE-smith trajectories (`.json` list with full messages and tool timings): one
  program per trajectory, token counts estimated from characters (see `continuum.py`).

Every record is validated before any program is built (`trace_fields`): finite times,
non-negative offsets, integer token counts up to `max_tokens`, well-formed hash_ids; a bad
record is a `ConfigError` reading `FILE:LINE: FIELD: what was wrong (allowed: ...)`.

`next_program` hands out the trace's programs in order for closed-loop use; with `cycle=True`
it starts over when they run out, giving repeated programs fresh ids for their private content
(shared Mooncake blocks keep theirs, so repeats can hit blocks of earlier passes).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from cluster.core import ConfigError
from cluster.input_files import check_input_file, iter_lines
from cluster.workloads import trace_fields as fields
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.continuum import is_continuum, read_continuum
from cluster.workloads.program import SHARED_SEGMENT_LIMIT, Program, Segment, SegmentIds
from cluster.workloads.source import TRACE_BLOCK_BASE, check_positive

TRACE_FORMATS = ("sweagent", "mooncake", "azure", "continuum")
SWEAGENT_KEYS = (
    "run",
    "instance",
    "step",
    "input_tokens",
    "output_tokens",
    "llm_enter",
    "llm_exit",
)
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
AZURE_KEYS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
SWEAGENT_RUNS = {"bs1": 1, "bs4": 4, "bs32": 32}


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Real data: $PDLAB_DATA_DIR, else <project root>/../shared/data, else the trimmed
    copies bundled in tests/fixtures (a clean clone without the shared directory)."""
    env = os.environ.get("PDLAB_DATA_DIR")
    if env:
        return Path(env)
    shared = project_root().parent / "shared" / "data"
    bundled = project_root() / "tests" / "fixtures"
    return shared if shared.is_dir() or not bundled.is_dir() else bundled


def resolve_trace_path(spec: str | os.PathLike[str]) -> Path:
    """The spec as a path (relative to the working directory), else under the data dir;
    a gzip-compressed copy (`<name>.gz`) stands in for a missing plain file."""
    path = Path(spec).expanduser()
    tried = [path]
    if not path.is_absolute():
        tried += [data_dir() / path, data_dir() / "traces" / path]
    tried += [c.with_name(c.name + ".gz") for c in tried if c.suffix != ".gz"]
    for candidate in tried:
        if candidate.is_file():
            return candidate
        if candidate.exists() and not candidate.is_dir():  # a FIFO, a device: refused
            return check_input_file(candidate, "trace")  # unless special files are allowed
    raise ConfigError(f"trace file {str(spec)!r} not found (tried: {', '.join(map(str, tried))})")


@contextlib.contextmanager
def open_text(path: Path, newline: str | None = None) -> Iterator[Iterator[str]]:
    """A trace's lines (each with its '\\n'), decompressing `.gz` files, read bounded
    (cluster.input_files: a regular file, at most the data cap of text, UTF-8). Lines split
    at '\\n' and keep a '\\r' before it, what csv wants (`newline` is accepted for callers
    of the file-object version and changes nothing)."""
    lines = iter_lines(path, decompress=True, what="trace")
    try:
        yield lines
    finally:
        lines.close()


def _suffix(path: Path) -> str:
    """The format suffix, looking through a `.gz`."""
    return Path(path.stem).suffix.lower() if path.suffix.lower() == ".gz" else path.suffix.lower()


def sniff(path: Path) -> str:
    """The trace format of `path`, from its extension and first record."""
    if _suffix(path) == ".csv":
        with open_text(path) as f:
            header = next(csv.reader(f), [])
        if set(AZURE_KEYS) <= {h.strip() for h in header}:
            return "azure"
        raise ConfigError(f"{path}: CSV header {header} lacks the Azure columns {list(AZURE_KEYS)}")
    if is_continuum(path):
        return "continuum"
    first = _first_record(path)
    if isinstance(first, dict):
        if set(SWEAGENT_KEYS) <= first.keys():
            return "sweagent"
        if set(MOONCAKE_KEYS) <= first.keys():
            return "mooncake"
    raise ConfigError(
        f"{path}: unrecognised trace; expected JSON lines with {list(SWEAGENT_KEYS)} (SWE-agent) "
        f"or {list(MOONCAKE_KEYS)} (Mooncake), a CSV with {list(AZURE_KEYS)} (Azure), "
        "or a JSON list of trajectories with 'messages' (Continuum)"
    )


def _first_record(path: Path) -> Any:
    with open_text(path) as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line)
                except (ValueError, RecursionError):  # not JSON: sniff says unrecognised
                    return None
    return None


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
            except (ValueError, RecursionError) as exc:  # long integers, deep nesting
                why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                raise ConfigError(f"{path}:{n}: not valid JSON ({why})") from None
            if not isinstance(rec, dict):
                raise ConfigError(f"{path}:{n}: expected a JSON object per line")
            yield n, rec


@dataclass(frozen=True, slots=True)
class TraceParams:
    """Parameters of a trace replay (each applies to the formats named)."""

    run: str = "bs32"  # sweagent: which recorded run (bs1 | bs4 | bs32 concurrent agents)
    block_tokens: int = 512  # mooncake: tokens per hash block
    time_scale: float = 1.0  # mooncake, azure: arrival times are multiplied by this
    limit: int = 0  # read at most this many programs (0 = all)
    cycle: bool = True  # next_program starts over (fresh private ids) when the trace runs out
    max_tokens: int = fields.MAX_REQUEST_TOKENS  # largest token count a record may hold

    def __post_init__(self) -> None:
        if self.run not in SWEAGENT_RUNS:
            raise ConfigError(
                f"parameter 'run' must be one of {sorted(SWEAGENT_RUNS)}, got {self.run!r}"
            )
        check_positive("block_tokens", self.block_tokens)
        check_positive("time_scale", self.time_scale)
        if self.limit < 0:
            raise ConfigError(f"parameter 'limit' must be >= 0, got {self.limit}")
        check_positive("max_tokens", self.max_tokens)


class TraceReport(NamedTuple):
    """What reading the trace found."""

    format: str
    path: str
    num_programs: int
    num_turns: int
    num_compactions: int  # sweagent: turns whose context shrank
    num_block_fixes: int  # mooncake: records whose blocks did not cover input_length
    num_skipped: int  # records without input tokens (not replayable)


class TraceSource:
    """A recorded trace as a workload source (see the module docstring)."""

    def __init__(self, path: Path, params: TraceParams, *, seed: int = 0) -> None:
        self.path = path
        self.params = params
        self.seed = seed  # traces are deterministic; kept for a uniform interface
        self.format = sniff(path)
        self.name = self.format
        self.ids = SegmentIds()
        self.recorded_concurrency: int | None = None
        self.recorded_turn_times: dict[tuple[str, int], tuple[float, float]] | None = None
        reader = {
            "sweagent": self._read_sweagent,
            "mooncake": self._read_mooncake,
            "azure": self._read_azure,
            "continuum": self._read_continuum,
        }
        self.programs, compactions, fixes, skipped = reader[self.format]()
        if not self.programs:
            raise ConfigError(f"{path}: no replayable programs (run={params.run!r}?)")
        self.report = TraceReport(
            self.format,
            str(path),
            len(self.programs),
            sum(len(p.turns) for p in self.programs),
            compactions,
            fixes,
            skipped,
        )
        self._next = 0

    # -- source interface --------------------------------------------------------------------

    def trace_programs(self) -> list[Program]:
        return list(self.programs)

    def target_concurrency(self, now: float) -> int | None:
        return self.recorded_concurrency

    def next_program(self, now: float) -> Program:
        index = self._next
        self._next += 1
        rnd, k = divmod(index, len(self.programs))
        if rnd > 0 and not self.params.cycle:
            raise ConfigError(
                f"trace {self.path.name} has only {len(self.programs)} programs (cycle=False)"
            )
        prog = self.programs[k]
        if rnd == 0:
            return replace(prog, arrival_s=None)
        return self._relabel(prog, rnd)

    def _relabel(self, prog: Program, rnd: int) -> Program:
        """A repeat of `prog` with fresh ids for its private content."""
        fresh: dict[int, int] = {}

        def new(seg_id: int) -> int:
            if seg_id < SHARED_SEGMENT_LIMIT:
                return seg_id
            if seg_id not in fresh:
                fresh[seg_id] = self.ids()
            return fresh[seg_id]

        turns = tuple(
            replace(
                t,
                append=tuple(Segment(new(s.seg_id), s.tokens) for s in t.append),
                output_seg=new(t.output_seg),
            )
            for t in prog.turns
        )
        return Program(f"{prog.program_id}~{rnd}", prog.workload, turns, None)

    # -- readers -----------------------------------------------------------------------------

    def _read_sweagent(self) -> tuple[list[Program], int, int, int]:
        run = self.params.run
        by_instance: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for n, raw in _json_lines(self.path):
            rec = self._sweagent_record(f"{self.path}:{n}", raw)
            if rec["run"] == run:
                by_instance.setdefault(rec["instance"], []).append((n, rec))
        self.recorded_concurrency = SWEAGENT_RUNS[run]
        self.recorded_turn_times = {}
        # Programs in the order the recorded run started them.
        order = sorted(by_instance, key=lambda i: min(r["llm_enter"] for _, r in by_instance[i]))
        if self.params.limit:
            order = order[: self.params.limit]
        programs: list[Program] = []
        compactions = 0
        for instance in order:
            prog, c = self._sweagent_program(run, instance, by_instance[instance])
            programs.append(prog)
            compactions += c
        return programs, compactions, 0, 0

    def _sweagent_record(self, where: str, rec: dict[str, Any]) -> dict[str, Any]:
        """The fields of one SWE-agent turn, validated."""
        top = self.params.max_tokens
        get = fields.require
        return {
            "run": fields.text(where, "run", get(where, rec, "run")),
            "instance": fields.text(where, "instance", get(where, rec, "instance")),
            "step": fields.tokens(where, "step", get(where, rec, "step"), 10**9),
            "input_tokens": fields.tokens(
                where, "input_tokens", get(where, rec, "input_tokens"), top, low=1
            ),
            "output_tokens": fields.tokens(
                where, "output_tokens", get(where, rec, "output_tokens"), top
            ),
            "llm_enter": fields.number(
                where, "llm_enter", get(where, rec, "llm_enter"), nonnegative=True
            ),
            "llm_exit": fields.number(
                where, "llm_exit", get(where, rec, "llm_exit"), nonnegative=True
            ),
            "prefill_time_s": fields.optional_number(
                where, "prefill_time_s", rec.get("prefill_time_s")
            ),
            "decode_time_s": fields.optional_number(
                where, "decode_time_s", rec.get("decode_time_s")
            ),
        }

    def _sweagent_program(
        self, run: str, instance: str, rows: list[tuple[int, dict[str, Any]]]
    ) -> tuple[Program, int]:
        path = self.path
        rows = sorted(rows, key=lambda nr: int(nr[1]["step"]))
        steps = [r["step"] for _, r in rows]
        if len(set(steps)) != len(steps):
            raise ConfigError(f"{path}: {run}/{instance} repeats a step number")
        pid = f"{run}/{instance}"
        b = ProgramBuilder(pid, "sweagent", self.ids)
        compactions = 0
        prev: dict[str, Any] | None = None
        first: Segment | None = None
        for i, (_n, rec) in enumerate(rows):
            inp, out = rec["input_tokens"], rec["output_tokens"]
            if prev is None:
                first = b.seg(inp)
                b.start("root", (first,), out)
            else:
                gap_s = max(0.0, rec["llm_enter"] - prev["llm_exit"])
                grown = inp - (prev["input_tokens"] + prev["output_tokens"])
                if grown >= 0:
                    append = (b.seg(grown),) if grown > 0 else ()
                    b.step("root", append, out, gap_s=gap_s, tool="bash")
                else:
                    # Context shrank: keep the first prompt if it still fits, re-send the rest.
                    assert first is not None
                    keep = 1 if first.tokens <= inp else 0
                    rest = inp - first.tokens * keep
                    append = (b.seg(rest),) if rest > 0 else ()
                    b.compact("root", keep, append, out, gap_s=gap_s, tool="bash")
                    compactions += 1
            self.recorded_turn_times[(pid, i)] = (  # type: ignore[index]
                rec["prefill_time_s"],
                rec["decode_time_s"],
            )
            prev = rec
        b.finish("root")
        return b.build(), compactions

    def _read_mooncake(self) -> tuple[list[Program], int, int, int]:
        path, bt = self.path, self.params.block_tokens
        block_tokens: dict[int, int] = {}  # hash_id -> tokens of its first use
        programs: list[Program] = []
        fixes = skipped = 0
        top = self.params.max_tokens
        max_hash = SHARED_SEGMENT_LIMIT - TRACE_BLOCK_BASE - 1
        for n, rec in _json_lines(path):
            if self.params.limit and len(programs) >= self.params.limit:
                break
            where = f"{path}:{n}"
            ts = fields.number(
                where, "timestamp", fields.require(where, rec, "timestamp"),
                nonnegative=True, unit="milliseconds",
            )  # fmt: skip
            inp = fields.tokens(
                where, "input_length", fields.require(where, rec, "input_length"), top
            )
            out = fields.tokens(
                where, "output_length", fields.require(where, rec, "output_length"), top
            )
            hashes = fields.hash_ids(where, rec.get("hash_ids"), max_hash)
            arrival_s = ts / 1000.0 * self.params.time_scale
            if not math.isfinite(arrival_s):
                raise fields.bad(
                    where, "timestamp", f"{ts:g} ms times time_scale is not finite",
                    "a finite arrival time",
                )  # fmt: skip
            if inp <= 0:
                skipped += 1
                continue
            b = ProgramBuilder(f"mooncake-{len(programs):06d}", "mooncake", self.ids)
            segs, fixed = self._blocks(n, hashes, inp, bt, block_tokens, b)
            fixes += fixed
            b.start("root", segs, out)
            b.finish("root")
            programs.append(b.build(arrival_s=arrival_s))
        return programs, 0, fixes, skipped

    def _blocks(
        self,
        n: int,
        hashes: list[Any],
        inp: int,
        bt: int,
        block_tokens: dict[int, int],
        b: ProgramBuilder,
    ) -> tuple[list[Segment], int]:
        """Segments of one Mooncake request: shared 512-token blocks, repaired if inconsistent."""
        fixed = 0
        if hashes and bt * (len(hashes) - 1) >= inp:  # more blocks than tokens
            hashes = hashes[: math.ceil(inp / bt)]
            fixed = 1
        segs: list[Segment] = []
        covered = 0
        for j, h in enumerate(hashes):
            tokens = bt if j < len(hashes) - 1 else min(bt, inp - covered)
            if j == len(hashes) - 1 and h in block_tokens and block_tokens[h] <= inp - covered:
                tokens = block_tokens[h]  # a known (partial) block; any excess stays private
            seg_id = TRACE_BLOCK_BASE + h  # < SHARED_SEGMENT_LIMIT (checked by hash_ids)
            if block_tokens.setdefault(h, tokens) != tokens:
                # Same id, different length: not the same content; keep it private.
                segs.append(b.seg(tokens))
                fixed = 1
            else:
                segs.append(Segment(seg_id, tokens))
            covered += tokens
        if covered < inp:
            segs.append(b.seg(inp - covered))  # tokens beyond the blocks (or no blocks at all)
            fixed = 1 if hashes else fixed
        return segs, fixed

    def _read_azure(self) -> tuple[list[Program], int, int, int]:
        path = self.path
        programs: list[Program] = []
        skipped = 0
        with open_text(path) as f:
            for n, row in enumerate(csv.DictReader(f), 2):
                if self.params.limit and len(programs) >= self.params.limit:
                    break
                where = f"{path}:{n}"
                top = self.params.max_tokens
                arrived = fields.number(
                    where, "arrived_at", fields.csv_number(where, "arrived_at", row.get("arrived_at")),
                    nonnegative=True,
                )  # fmt: skip
                inp = fields.tokens(
                    where, "num_prefill_tokens",
                    fields.csv_number(where, "num_prefill_tokens", row.get("num_prefill_tokens")),
                    top,
                )  # fmt: skip
                out = fields.tokens(
                    where, "num_decode_tokens",
                    fields.csv_number(where, "num_decode_tokens", row.get("num_decode_tokens")),
                    top,
                )  # fmt: skip
                if inp <= 0:
                    skipped += 1
                    continue
                b = ProgramBuilder(f"azure-{len(programs):06d}", "azure", self.ids)
                b.start("root", (b.seg(inp),), out)
                b.finish("root")
                programs.append(b.build(arrival_s=arrived * self.params.time_scale))
        return programs, 0, 0, skipped

    def _read_continuum(self) -> tuple[list[Program], int, int, int]:
        programs = read_continuum(self.path, self.ids, self.params.limit, self.params.max_tokens)
        return programs, 0, 0, 0
