"""KV event wire formats of SGLang 0.5.23 and vLLM, decoded into `KVEvent` (SPEC §6, §4 directory).

Both engines publish ZMQ multipart messages [topic, seq (8-byte big-endian), payload] whose
payload is a msgpack batch. What is verified against the sources (see the module tests):

- SGLang (`sglang/srt/disaggregation/kv_events.py`): `EventBatch` is `array_like` ->
  ``[ts, events, attn_dp_rank]``; events are *tagged maps* (`tag=True`, `omit_defaults=True`)
  ``{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
  "lora_id", "medium"?, "cache_salt"?, "session_id"?, "lora_name"?}``, ``{"type":
  "BlockRemoved", "block_hashes", "medium"?}``, ``{"type": "AllBlocksCleared"}``; hashes are
  signed int64; `medium` is "GPU" | "CPU_PINNED" | "DISK" | "EXTERNAL".
- vLLM (`vllm/distributed/kv_events.py`): the same tagged-map events with more optional
  fields (`lora_name`, `extra_keys`, `group_idx`, `kv_cache_spec_kind`,
  `kv_cache_spec_sliding_window`); hashes are `bytes | int` (sha256 bytes by default,
  unsigned 64-bit ints with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); the batch is
  ``[ts, events, data_parallel_rank]`` in releases with `array_like`, a map with those keys
  in later ones (main since 2025; tested in tests/cluster/sglang/test_vllm_kv_events.py). Older releases of both sent events as tagged *arrays* (tag first, then the
  fields in declaration order); this decoder accepts all of these.

Decoding is lenient by design: unknown fields are ignored, missing optional fields take
their defaults, an event of an unknown type or medium, or a malformed one (a non-integer
token id, a hash that does not fit 64 bits, ...), is skipped (a one-line warning the first
time per reason, then counted) rather than failing the batch: its good events are kept. A
batch whose wall time `ts` is not finite (NaN, inf) gets the receive time instead, counted
in `num_bad_ts` and warned about once. Tiers: "GPU" -> "gpu"; "CPU_PINNED" and "CPU" ->
"host"; a missing medium -> "gpu" (both engines' default); "DISK", "EXTERNAL" and anything
else -> skipped, because the directory has no such tier and calling them host memory would
corrupt placement. Block hashes become signed int64: ints in [2^63, 2^64) wrap (two's
complement); bytes map to their low 64 bits read big-endian, exactly what vLLM itself
publishes under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, so a bytes hash and its int form agree.
"""

from __future__ import annotations

import array
import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

import msgspec

from cluster.core import BlockHash, KVEvent, KVEventKind, Tier

logger = logging.getLogger(__name__)

WireFormat = Literal["sglang", "vllm", "vllm-array-batch", "legacy-array"]
WIRE_FORMATS: tuple[WireFormat, ...] = ("sglang", "vllm", "vllm-array-batch", "legacy-array")
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # replay end marker (both engines)

_MASK64 = (1 << 64) - 1
_MEDIUM_TIER: dict[str, Tier] = {"GPU": "gpu", "CPU_PINNED": "host", "CPU": "host"}
_TIER_MEDIUM: dict[str, str] = {"gpu": "GPU", "host": "CPU_PINNED"}
# Field order of the tagged-array forms (tag first), as declared in the structs.
_ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


class WireError(ValueError):
    """A payload or frame is not a KV event batch / metrics message; says what was wrong.

    `field` names the offending field when one event is malformed (for counting by reason).
    """

    def __init__(self, message: str, field: str = "event") -> None:
        super().__init__(message)
        self.field = field


class DecodedBatch(NamedTuple):
    """One decoded batch: wall time `ts` (s), its DP rank, events, and events skipped."""

    ts: float
    dp_rank: int | None
    events: list[KVEvent]
    skipped: int


# --- encoders (exact wire structs; the stand-in and the tests publish with these) ----------


class SGLangBlockStored(msgspec.Struct, tag="BlockStored", omit_defaults=True, gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class SGLangBlockRemoved(msgspec.Struct, tag="BlockRemoved", omit_defaults=True, gc=False):
    block_hashes: list[int]
    medium: str | None = None


class SGLangAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True, gc=False):
    pass


SGLangEvent = SGLangBlockStored | SGLangBlockRemoved | SGLangAllBlocksCleared


class SGLangEventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[SGLangEvent]
    attn_dp_rank: int | None = None


class VLLMBlockStored(msgspec.Struct, tag="BlockStored", omit_defaults=True, gc=False):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class VLLMBlockRemoved(msgspec.Struct, tag="BlockRemoved", omit_defaults=True, gc=False):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


VLLMEvent = VLLMBlockStored | VLLMBlockRemoved | SGLangAllBlocksCleared


class VLLMEventBatchMap(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[VLLMEvent]
    data_parallel_rank: int | None = None


class VLLMEventBatchArray(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VLLMEvent]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()


def to_sglang_event(ev: KVEvent) -> SGLangEvent:
    """The SGLang wire struct of one `KVEvent` (tier -> medium "GPU"/"CPU_PINNED")."""
    if ev.kind is KVEventKind.CLEARED:
        return SGLangAllBlocksCleared()
    medium = _TIER_MEDIUM[ev.tier or "gpu"]
    if ev.kind is KVEventKind.REMOVED:
        return SGLangBlockRemoved(block_hashes=list(ev.block_hashes), medium=medium)
    return SGLangBlockStored(
        block_hashes=list(ev.block_hashes),
        parent_block_hash=ev.parent_hash,
        token_ids=list(ev.token_ids or ()),
        block_size=ev.block_tokens,
        lora_id=None,
        medium=medium,
    )


def encode_batch(
    events: Sequence[KVEvent | SGLangEvent],
    ts: float,
    dp_rank: int | None = 0,
    fmt: WireFormat = "sglang",
) -> bytes:
    """Encode events as one msgpack batch payload in the given engine's wire format.

    "sglang": array batch, tagged-map events. "vllm": map batch, tagged-map events (vLLM's
    current struct config). "vllm-array-batch": array batch, tagged-map events (vLLM
    releases whose EventBatch is array_like). "legacy-array": array batch, tagged-array
    events (older releases of both engines).
    """
    sg = [to_sglang_event(e) if isinstance(e, KVEvent) else e for e in events]
    if fmt == "sglang":
        return _ENCODER.encode(SGLangEventBatch(ts=ts, events=sg, attn_dp_rank=dp_rank))
    if fmt in ("vllm", "vllm-array-batch"):
        vl: list[VLLMEvent] = []
        for e in sg:
            if isinstance(e, SGLangBlockStored):
                vl.append(
                    VLLMBlockStored(
                        block_hashes=list(e.block_hashes),
                        parent_block_hash=e.parent_block_hash,
                        token_ids=e.token_ids,
                        block_size=e.block_size,
                        lora_id=e.lora_id,
                        medium=e.medium,
                        lora_name=e.lora_name,
                    )
                )
            elif isinstance(e, SGLangBlockRemoved):
                vl.append(VLLMBlockRemoved(block_hashes=list(e.block_hashes), medium=e.medium))
            else:
                vl.append(e)
        cls = VLLMEventBatchMap if fmt == "vllm" else VLLMEventBatchArray
        return _ENCODER.encode(cls(ts=ts, events=vl, data_parallel_rank=dp_rank))
    if fmt == "legacy-array":
        arr: list[list[Any]] = []
        for e in sg:
            tag = type(e).__struct_config__.tag
            arr.append([tag, *(getattr(e, f) for f in _ARRAY_FIELDS[str(tag)])])
        return _ENCODER.encode([ts, arr, dp_rank])
    raise ValueError(f"unknown wire format {fmt!r}; choose one of: {', '.join(WIRE_FORMATS)}")


# --- decoding ------------------------------------------------------------------------------


def to_int64(h: object) -> BlockHash:
    """A block hash as signed int64: wrap uint64 ints, take the low 64 bits of bytes."""
    if isinstance(h, bool):
        raise WireError(f"block hash must be an int or bytes, got {h!r}", "block hash")
    if isinstance(h, int):
        if not -(1 << 63) <= h < (1 << 64):
            raise WireError(f"block hash {h} does not fit in 64 bits", "block hash")
    elif isinstance(h, bytes | bytearray | memoryview):
        h = int.from_bytes(bytes(h), "big") & _MASK64
    else:
        raise WireError(f"block hash must be an int or bytes, got {type(h).__name__}", "block hash")
    return h - (1 << 64) if h >= 1 << 63 else h


class _Skip(Exception):
    """An event this decoder deliberately ignores (unknown type or medium)."""


class BatchDecoder:
    """Lenient decoder of KV event batches of one node; counts and logs skipped events.

    `run_start_wall` (Unix seconds) turns the batch wall time into seconds since the run
    start; events published before it get t = 0.
    """

    def __init__(self, node_id: int = 0, run_start_wall: float = 0.0) -> None:
        self.node_id = node_id
        self.run_start_wall = run_start_wall
        self._warned: set[str] = set()
        self.skipped_by_reason: dict[str, int] = {}
        self.num_bad_ts = 0  # batches whose ts was not finite (the receive time was used)

    def decode(self, payload: bytes, received_wall: float | None = None) -> DecodedBatch:
        """Decode one batch; `received_wall` (Unix s, default now) replaces a non-finite ts."""
        try:
            raw = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError as e:
            raise WireError(f"KV event payload is not msgpack: {e}") from None
        except RecursionError:  # nested deeper than the decoder's stack
            raise WireError("KV event payload is nested too deeply") from None
        if isinstance(raw, list | tuple):
            if len(raw) < 2:
                raise WireError(f"KV event batch array needs [ts, events, ...], got {raw!r:.80}")
            ts, events, dp = raw[0], raw[1], raw[2] if len(raw) > 2 else None
        elif isinstance(raw, dict):
            if "ts" not in raw or "events" not in raw:
                raise WireError(f"KV event batch map needs ts and events, got keys {list(raw)}")
            ts, events = raw["ts"], raw["events"]
            dp = raw.get("attn_dp_rank", raw.get("data_parallel_rank"))
        else:
            raise WireError(f"KV event batch must be an array or map, got {type(raw).__name__}")
        if not isinstance(ts, int | float) or isinstance(ts, bool):
            raise WireError(f"KV event batch ts must be a number, got {ts!r:.40}")
        if not isinstance(events, list):
            raise WireError(f"KV event batch events must be an array, got {type(events).__name__}")
        if dp is not None and not isinstance(dp, int):
            dp = None
        ts = float(ts)
        if not math.isfinite(ts):
            self.num_bad_ts += 1
            if "ts" not in self._warned:
                self._warned.add("ts")
                logger.warning(
                    "KV event batch ts is %r: using the receive time instead (warned once; "
                    "counted in num_bad_ts)",
                    ts,
                )
            ts = time.time() if received_wall is None else received_wall
        t = max(0.0, ts - self.run_start_wall)
        out: list[KVEvent] = []
        skipped = 0
        for raw_ev in events:
            try:
                out.append(self._event(t, raw_ev))
            except _Skip as why:
                skipped += 1
                self._note_skip(str(why))
            except WireError as why:  # one bad event does not poison its batch
                skipped += 1
                self._note_skip(f"malformed event ({why.field})", str(why))
        return DecodedBatch(ts, dp, out, skipped)

    def _note_skip(self, reason: str, example: str | None = None) -> None:
        self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + 1
        if reason not in self._warned:
            self._warned.add(reason)
            detail = f", e.g. {example}" if example else ""
            logger.warning(
                "skipping KV events: %s%s (warned once per reason; counted)", reason, detail
            )

    def _event(self, t: float, raw: object) -> KVEvent:
        if isinstance(raw, dict):
            tag = raw.get("type")
            fields = raw
        elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
            tag = raw[0]
            names = _ARRAY_FIELDS.get(tag, ())
            fields = dict(zip(names, raw[1:], strict=False))
        else:
            raise WireError(
                f"KV event must be a tagged map or tagged array, got {raw!r:.80}", "event shape"
            )
        if tag == "AllBlocksCleared":
            return KVEvent(t, self.node_id, KVEventKind.CLEARED, None)
        if tag not in ("BlockStored", "BlockRemoved"):
            raise _Skip(f"unknown event type {tag!r}")
        medium = fields.get("medium")
        if medium is None:
            tier: Tier = "gpu"
        elif isinstance(medium, str) and medium.upper() in _MEDIUM_TIER:
            tier = _MEDIUM_TIER[medium.upper()]
        else:
            raise _Skip(f"medium {medium!r} has no pdlab tier (gpu/host)")
        hashes = fields.get("block_hashes")
        if not isinstance(hashes, list):
            raise WireError(
                f"{tag}.block_hashes must be an array, got {hashes!r:.60}", "block_hashes"
            )
        block_hashes = tuple(to_int64(h) for h in hashes)
        if tag == "BlockRemoved":
            return KVEvent(t, self.node_id, KVEventKind.REMOVED, tier, block_hashes)
        parent = fields.get("parent_block_hash")
        token_ids = fields.get("token_ids")
        block_size = fields.get("block_size", 0)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 0:
            raise WireError(
                f"BlockStored.block_size must be an int >= 0, got {block_size!r:.40}", "block_size"
            )
        tokens = _token_ids(token_ids)
        return KVEvent(
            t,
            self.node_id,
            KVEventKind.STORED,
            tier,
            block_hashes,
            None if parent is None else to_int64(parent),
            block_size,
            tokens,
        )


def _token_ids(raw: object) -> tuple[int, ...] | None:
    """Token ids of a stored block; bigram pages carry (id, id) pairs: keep the first."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise WireError(
            f"BlockStored.token_ids must be an array, got {type(raw).__name__}", "token_ids"
        )
    try:
        array.array("q", raw)  # the common case, checked in C: every entry an int64
        return tuple(raw)
    except (TypeError, OverflowError):
        pass
    out = []
    for t in raw:
        if isinstance(t, list | tuple) and t:
            t = t[0]
        if isinstance(t, bool) or not isinstance(t, int):
            raise WireError(f"BlockStored.token_ids holds {t!r:.40}, not an int", "token_ids")
        out.append(t)
    return tuple(out)


def kv_event_rows(events: Iterable[KVEvent]) -> dict[str, list[Any]]:
    """Columns of the `kv_events` table (SPEC §3, without run_id): one row per block hash.

    Stored rows chain `parent_hash` (the event's parent for the first block, the previous
    block after that) and carry the block's token count; removed rows have no parent and
    num_tokens 0 (engines do not send it); a clear is one row per tier with a NULL hash
    (SGLang's AllBlocksCleared empties the node's whole tree).
    """
    cols: dict[str, list[Any]] = {
        k: [] for k in ("t", "node_id", "tier", "kind", "block_hash", "parent_hash", "num_tokens")
    }

    def add(ev: KVEvent, tier: str, h: int | None, parent: int | None, n: int) -> None:
        cols["t"].append(ev.t)
        cols["node_id"].append(ev.node_id)
        cols["tier"].append(tier)
        cols["kind"].append(ev.kind.value)
        cols["block_hash"].append(h)
        cols["parent_hash"].append(parent)
        cols["num_tokens"].append(n)

    for ev in events:
        if ev.kind is KVEventKind.CLEARED:
            for tier in (ev.tier,) if ev.tier else ("gpu", "host"):
                add(ev, tier, None, None, 0)
            continue
        tier = ev.tier or "gpu"
        if ev.kind is KVEventKind.REMOVED:
            for h in ev.block_hashes:
                add(ev, tier, h, None, 0)
            continue
        parent = ev.parent_hash
        for h in ev.block_hashes:
            add(ev, tier, h, parent, ev.block_tokens)
            parent = h
    return cols
