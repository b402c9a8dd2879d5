"""Reading fields of imported files with errors that name the file, line and field.

Importers (toolkit.importers) read JSON and JSONL written by other tools. Every problem is
an `ImportFileError` whose message starts `<file>: line <n>: field <name>: ...`, so a user
can open the file at the line. For a JSON document (not line-oriented) the line is where the
field's key appears (`key_line`), or the line of its closest enclosing key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class ImportFileError(ValueError):
    """An input file is missing or malformed; the message names file, line and field."""

    def __init__(self, path: str | Path, line: int, field: str | None, problem: str) -> None:
        where = f"{path}: line {line}"
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


def load_json(path: Path) -> tuple[Any, str]:
    """(document, text) of a JSON file, or ImportFileError with the line of a syntax error."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ImportFileError(path, 0, None, "file is missing") from None
    except UnicodeDecodeError as exc:
        raise ImportFileError(path, 1, None, f"not UTF-8 text ({exc.reason})") from None
    try:
        return json.loads(text), text
    except json.JSONDecodeError as exc:
        raise ImportFileError(path, exc.lineno, None, f"not valid JSON ({exc.msg})") from None


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

    def integer(self, key: str, *, required: bool = False, minimum: int = 0) -> int | None:
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.fail(key, "missing (an integer is required)")
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not float(v).is_integer():
            raise self.fail(key, f"expected an integer, got {v!r}")
        if v < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {v!r}")
        return int(v)

    def number(self, key: str, *, required: bool = False) -> float | None:
        v = self.obj.get(key)
        if v is None:
            if required:
                raise self.fail(key, "missing (a number is required)")
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.fail(key, f"expected a finite number, got {v!r}")
        return float(v)

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
