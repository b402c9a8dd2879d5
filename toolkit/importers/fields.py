"""Reading fields of imported files with errors that name the file, line and field.

Importers (toolkit.importers) read JSON and JSONL written by other tools. Every problem is
an `ImportFileError` whose message starts `<file>: line <n>: field <name>: ...`, so a user
can open the file at the line. For a JSON document (not line-oriented) the line is where the
field's key appears (`key_line`), or the line of its closest enclosing key.

Files are read bounded (cluster.input_files: regular files only unless allowed, size caps,
UTF-8 without NUL bytes, JSON nesting): `load_json` for a document, `json_lines` for JSONL.
Values are checked against the ceilings of cluster.size_limits, so nothing an importer
stores is meaningless or overflows a column: an integer is at most `INT64_MAX` unless a
tighter `maximum` is given (`tokens` for token counts), a time is finite and within
`maximum` (`timestamp`: a clock reading, `seconds`: a duration). A new importer reuses these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.input_files import InputFileError, iter_lines, parse_json, read_text

INT64_MAX = (1 << 63) - 1
MAX_TOKENS = int(limits.REQUEST_TOKENS.hi)  # input or output tokens of one request
MAX_TIMESTAMP_S = limits.TIMESTAMP_S.hi  # an epoch or monotonic clock reading
MAX_SPAN_S = limits.RUN_SPAN_S.hi  # a duration inside one run


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class ImportFileError(ValueError):
    """An input file is missing or malformed; the message names file, line and field."""

    def __init__(self, path: str | Path, line: int, field: str | None, problem: str) -> None:
        where = f"{path}: line {line}" if line else str(path)  # 0: the file as a whole
        super().__init__(f"{where}: field {field}: {problem}" if field else f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.field = field


def key_line(text: str, keys: Sequence[str]) -> int:
    """1-based line of the last of `keys` found in order (each after the previous one)."""
    lines = text.splitlines()
    at, found = 0, 1
    for key in keys:
        needle = json.dumps(key)
        for i in range(at, len(lines)):
            if needle in lines[i]:
                at, found = i, i + 1
                break
        else:
            break
    return found


def _as_import_error(exc: InputFileError) -> ImportFileError:
    problem = "file is missing" if exc.missing else exc.problem
    return ImportFileError(exc.path, exc.line, None, problem)


def load_json(path: Path) -> tuple[Any, str]:
    """(document, text) of a JSON file read bounded, or ImportFileError naming the line."""
    try:
        text = read_text(path, what="JSON file")
        return parse_json(text, path), text
    except InputFileError as exc:
        raise _as_import_error(exc) from None


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file, streamed bounded."""
    try:
        for i, raw in enumerate(iter_lines(path, what="JSON lines file"), 1):
            if raw.strip():
                yield i, parse_json(raw, path, i)
    except InputFileError as exc:
        raise _as_import_error(exc) from None


class Fields:
    """Typed access to one JSON object's fields; errors name `path`, the line and the field.

    `line` is the JSONL line of the object; for a JSON document (line None) the error line
    is where the field's key appears after its parents' keys (`keys`) in `text`.
    """

    def __init__(
        self,
        obj: Any,
        path: Path,
        line: int | None = None,
        text: str = "",
        keys: tuple[str, ...] = (),
    ) -> None:
        self.path = path
        self.line = line
        self.text = text
        self.keys = keys
        if not isinstance(obj, dict):
            got = type(obj).__name__
            raise ImportFileError(
                path, self.where(), self.name(), f"expected a JSON object, got {got}"
            )
        self.obj = obj

    def name(self, key: str | None = None) -> str | None:
        parts = [*self.keys, key] if key else list(self.keys)
        return ".".join(parts) or None

    def where(self, key: str | None = None) -> int:
        if self.line is not None:
            return self.line
        return key_line(self.text, [*self.keys, key] if key else list(self.keys))

    def fail(self, key: str, problem: str) -> ImportFileError:
        return ImportFileError(self.path, self.where(key), self.name(key), problem)

    @contextmanager
    def naming_errors(self, key: str | None = None) -> Iterator[None]:
        """Re-raise a ConfigError of the block (a ceiling of cluster.size_limits, an engine
        setting or model shape refused) as an ImportFileError naming this file and line."""
        try:
            yield
        except ImportFileError:
            raise
        except ConfigError as exc:
            raise ImportFileError(self.path, self.where(key), self.name(key), str(exc)) from None

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def sub(self, key: str, *, required: bool = False) -> Fields | None:
        """The object under `key` (None when absent or null and not required)."""
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.fail(key, "missing (a JSON object is required)")
            return None
        return Fields(v, self.path, self.line, self.text, (*self.keys, key))

    def integer(
        self, key: str, *, required: bool = False, minimum: int = 0, maximum: int = INT64_MAX
    ) -> int | None:
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.fail(key, "missing (an integer is required)")
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or (isinstance(v, float) and not (math.isfinite(v) and v.is_integer()))
        ):
            raise self.fail(key, f"expected an integer, got {_show(v)}")
        if v < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {_show(v)}")
        if v > maximum:
            raise self.fail(key, f"must be at most {maximum:,}, got {_show(v)}")
        return int(v)

    def tokens(self, key: str, *, required: bool = False, minimum: int = 0) -> int | None:
        """A token count of one request, up to MAX_TOKENS (cluster.size_limits)."""
        return self.integer(key, required=required, minimum=minimum, maximum=MAX_TOKENS)

    def number(
        self,
        key: str,
        *,
        required: bool = False,
        minimum: float = -math.inf,
        maximum: float = math.inf,
    ) -> float | None:
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.fail(key, "missing (a number is required)")
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(key, f"expected a finite number, got {_show(v)}")
        try:
            x = float(v)
        except OverflowError:  # an integer beyond a float's range
            raise self.fail(key, f"expected a finite number, got {_show(v)}") from None
        if not math.isfinite(x):
            raise self.fail(key, f"expected a finite number, got {_show(v)}")
        if x < minimum:
            raise self.fail(key, f"must be >= {minimum:g}, got {x:g}")
        if x > maximum:
            raise self.fail(key, f"must be at most {maximum:g}, got {x:g}")
        return x

    def timestamp(self, key: str, *, required: bool = False) -> float | None:
        """A clock reading in seconds (epoch or monotonic), in [0, MAX_TIMESTAMP_S]."""
        return self.number(key, required=required, minimum=0.0, maximum=MAX_TIMESTAMP_S)

    def seconds(self, key: str, *, required: bool = False) -> float | None:
        """A duration in seconds inside one run, in [0, MAX_SPAN_S]."""
        return self.number(key, required=required, minimum=0.0, maximum=MAX_SPAN_S)

    def boolean(self, key: str) -> bool | None:
        v = self.obj.get(key)
        if v is None:
            return None
        if not isinstance(v, bool):
            raise self.fail(key, f"expected true or false, got {v!r}")
        return v

    def string(self, key: str, *, required: bool = False) -> str | None:
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.fail(key, "missing (a string is required)")
            return None
        if not isinstance(v, str | int) or isinstance(v, bool):
            raise self.fail(key, f"expected a string, got {v!r}")
        return str(v)

    def array(self, key: str, *, required: bool = False) -> list[Any] | None:
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.fail(key, "missing (an array is required)")
            return None
        if not isinstance(v, list):
            raise self.fail(key, f"expected an array, got {type(v).__name__}")
        return v
