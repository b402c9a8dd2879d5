"""Replay of Continuum's SWE-smith trajectories (full messages + tool timings) as programs.

Paper 003 §3.2 / App. A: a trace fixes each turn's prompt, output and tool duration. The file is
a JSON list of trajectories whose `messages` hold the whole conversation (system prompt, task,
then assistant actions alternating with tool observations) and whose assistant `tool_calls`
carry `execution_time_seconds`. Each assistant message is one LLM turn: its prompt is every
message before it, its output the message itself (text + tool-call arguments), and the gap
before the next turn is the summed execution time of its tool calls, labelled with the tool's
name (`bash`, `str_replace_editor`, `submit`). There is no tokenizer here, so token counts are
estimated as ceil(characters / 4); identical system prompts share one segment across programs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cluster.core import ConfigError
from cluster.input_files import head_text, iter_lines, parse_json
from cluster.workloads import trace_fields as fields
from cluster.workloads.builder import ProgramBuilder
from cluster.workloads.program import Program, Segment, SegmentIds

CHARS_PER_TOKEN = 4
SYSTEM_PROMPT_BASE = 1_000  # shared ids of distinct system prompts (below TRACE_BLOCK_BASE)


def is_continuum(path: Path) -> bool:
    """A JSON list whose first element has `messages` (cheap check on the file's start)."""
    head = head_text(path, 4_096, decompress=True).lstrip()
    return head.startswith("[") and '"messages"' in head


def estimate_tokens(msg: dict[str, Any]) -> int:
    content = msg.get("content", "")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = msg.get("tool_calls") or []
    text = str(content) + "".join(json.dumps(c.get("function", {})) for c in calls)
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def read_continuum(
    path: Path, ids: SegmentIds, limit: int = 0, max_tokens: int = fields.MAX_REQUEST_TOKENS
) -> list[Program]:
    text = "".join(iter_lines(path, decompress=True, what="trace"))
    trajectories = parse_json(text, path)
    if not isinstance(trajectories, list):
        raise ConfigError(f"{path}: expected a JSON list of trajectories")
    systems: dict[str, int] = {}
    programs: list[Program] = []
    for k, traj in enumerate(trajectories):
        if limit and len(programs) >= limit:
            break
        msgs = traj.get("messages") if isinstance(traj, dict) else None
        if isinstance(msgs, str):
            try:
                msgs = json.loads(msgs)
            except (ValueError, RecursionError) as exc:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                raise ConfigError(
                    f"{path}: trajectory {k}: messages: not valid JSON ({why})"
                ) from None
        if not isinstance(msgs, list):
            raise ConfigError(f"{path}: trajectory {k} has no 'messages' list")
        assert isinstance(traj, dict)
        pid = str(traj.get("traj_id") or traj.get("instance_id") or f"continuum-{k:06d}")
        programs.append(
            _program(f"{path}: trajectory {k} ({pid})", pid, msgs, ids, systems, max_tokens)
        )
    return programs


def _program(
    where: str,
    pid: str,
    msgs: list[Any],
    ids: SegmentIds,
    systems: dict[str, int],
    max_tokens: int,
) -> Program:
    b = ProgramBuilder(pid, "continuum", ids)
    pending: list[Segment] = []
    gap_s, tool = 0.0, None
    for m, msg in enumerate(msgs):
        at = f"{where}, message {m}"
        if not isinstance(msg, dict) or "role" not in msg:
            raise ConfigError(f"{at}: role: missing in {str(msg)[:80]}")
        calls = msg.get("tool_calls") or []
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function", {}), dict) for c in calls
        ):
            raise fields.bad(
                at, "tool_calls", "malformed", "a list of {function: {...}, execution_time_seconds}"
            )
        try:
            tokens = estimate_tokens(msg)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ConfigError(f"{at}: content: malformed ({exc})") from None
        fields.tokens(at, "content (estimated tokens)", tokens, max_tokens)
        if msg["role"] != "assistant":
            if msg["role"] == "system":
                text = str(msg.get("content", ""))
                seg_id = systems.setdefault(text, SYSTEM_PROMPT_BASE + len(systems))
                pending.append(Segment(seg_id, tokens))
            else:
                pending.append(b.seg(tokens))
            continue
        if not b.num_turns:
            if not pending:
                raise ConfigError(f"{where}: an assistant message comes before any prompt")
            b.start("root", pending, tokens)
        else:
            b.step("root", pending, tokens, gap_s=gap_s, tool=tool)
        gap_s = sum(
            fields.number(at, "execution_time_seconds", c.get("execution_time_seconds", 0.0),
                          nonnegative=True)
            for c in calls
        )  # fmt: skip
        tool = str(calls[0].get("function", {}).get("name", "tool")) if calls else "user"
        pending = []
    if not b.num_turns:
        raise ConfigError(f"{where}: no assistant turns")
    b.finish("root")
    return b.build()
