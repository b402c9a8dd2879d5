"""Reading the files a user names, bounded: size caps, regular files only, one-line errors.

Importers (`pdlab import`), operator profiles (`pdlab profile import`), model configs
(`--model-config`), hardware profiles (`--profile`) and traces read files other tools
wrote. A file may be anything the user's path points at — a symlink to `/dev/zero`, a FIFO
that never ends, a 50 GB log, a directory, a binary file — so every read goes through here:

- the path must be a regular file (after symlinks); a device, FIFO or socket is refused
  unless special files are allowed (`pdlab --allow-special-files ...` or
  `PDLAB_ALLOW_SPECIAL_FILES=1`: e.g. `<(zcat run.jsonl.gz)`), and then it is still capped;
- reading streams in 1 MiB chunks and stops at a cap: `MAX_DOCUMENT_BYTES` (64 MiB) for one
  JSON document (settings, configs, profiles), `MAX_DATA_BYTES` (512 MiB) for line-oriented
  data (request logs, benchmark results, traces, operator CSVs; of a `.gz` trace, the
  decompressed bytes). The data cap is changed with `pdlab --max-input-mb N ...` or
  `PDLAB_MAX_INPUT_MB=N`: a cap is what keeps a wrong path from taking the machine's memory
  (an import holds a few times its file in memory);
- text must be UTF-8 without NUL bytes (JSON and CSV never hold a raw NUL: a NUL is a
  binary file, refused at the first chunk, so `/dev/zero` costs one chunk, not a cap);
- JSON nested too deep for the parser, or numbers too long to convert, are errors too.

Every problem is an `InputFileError` (a `ConfigError`) reading `FILE: line N: what` (`FILE:
what` when the file as a whole is wrong), so commands print one line and exit non-zero.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import stat
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO, Any

from cluster.core import ConfigError

MIB = 1 << 20
MAX_DOCUMENT_BYTES = 64 * MIB
MAX_DATA_BYTES = 512 * MIB
CHUNK_BYTES = MIB
ALLOW_SPECIAL_ENV = "PDLAB_ALLOW_SPECIAL_FILES"
MAX_INPUT_MB_ENV = "PDLAB_MAX_INPUT_MB"
MISSING = "does not exist"


class InputFileError(ConfigError):
    """A file a user named cannot be read as asked; the message names the file and line."""

    def __init__(self, path: str | os.PathLike[str], line: int, problem: str) -> None:
        super().__init__(f"{path}: line {line}: {problem}" if line else f"{path}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem

    @property
    def missing(self) -> bool:
        """The file does not exist (callers with their own wording for that case)."""
        return self.problem.endswith(MISSING)


def special_files_allowed() -> bool:
    return os.environ.get(ALLOW_SPECIAL_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def data_cap_bytes() -> int:
    """The cap of line-oriented data files: `PDLAB_MAX_INPUT_MB` MiB, else MAX_DATA_BYTES."""
    raw = os.environ.get(MAX_INPUT_MB_ENV, "").strip()
    if not raw:
        return MAX_DATA_BYTES
    try:
        mb = float(raw)
    except ValueError:
        mb = float("nan")
    if not 0 < mb <= 1 << 30:  # also false for NaN
        raise ConfigError(f"{MAX_INPUT_MB_ENV} must be a number of MiB in (0, 2^30], got {raw!r}")
    return int(mb * MIB)


def check_input_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """`path` as a Path if it names a readable regular file (or an allowed special one)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputFileError(p, 0, f"{what} {MISSING}") from None
    except OSError as exc:
        raise InputFileError(p, 0, f"cannot read the {what} ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(p, 0, f"is a directory, expected a {what}")
    if not stat.S_ISREG(st.st_mode) and not special_files_allowed():
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a character device"
            if stat.S_ISCHR(st.st_mode)
            else "a block device"
            if stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise InputFileError(
            p,
            0,
            f"is {kind}, not a regular {what}; to read it anyway pass --allow-special-files "
            f"(or set {ALLOW_SPECIAL_ENV}=1)",
        )
    return p


def _open_binary(p: Path, decompress: bool) -> IO[bytes]:
    try:
        raw: IO[bytes] = p.open("rb")
    except OSError as exc:
        raise InputFileError(p, 0, f"cannot open ({exc.strerror or exc})") from None
    if decompress and p.suffix.lower() == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _chunks(p: Path, cap: int, decompress: bool, what: str) -> Iterator[bytes]:
    """The file's bytes in chunks; InputFileError past `cap` bytes (decompressed)."""
    total = 0
    with _open_binary(p, decompress) as f:
        while True:
            try:
                chunk = f.read(CHUNK_BYTES)
            except (OSError, EOFError) as exc:  # gzip: corrupt or truncated stream
                raise InputFileError(p, 0, f"cannot read the {what} ({exc})") from None
            if not chunk:
                return
            total += len(chunk)
            if total > cap:
                raise InputFileError(
                    p,
                    0,
                    f"larger than the {cap / MIB:g} MiB allowed for a {what}; if it is "
                    f"right, raise the cap with --max-input-mb (or {MAX_INPUT_MB_ENV})",
                )
            yield chunk


def iter_lines(
    path: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    decompress: bool = False,
    what: str = "file",
) -> Generator[str, None, None]:
    """The UTF-8 lines of a text file, each with its '\\n' (splits at '\\n' only: JSON text
    holds no raw newline and CSV keeps its '\\r'), streamed under the data cap.

    Errors (InputFileError) name the line: a NUL byte (a binary file), invalid UTF-8, the
    cap. With `decompress`, a `.gz` file is read through gzip (the cap counts what it
    decompresses to)."""
    p = check_input_file(path, what)
    cap = data_cap_bytes() if max_bytes is None else max_bytes
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    line_no = 1
    pending: list[str] = []
    for chunk in _chunks(p, cap, decompress, what):
        nul = chunk.find(b"\x00")
        if nul >= 0:
            at = line_no + chunk.count(b"\n", 0, nul)
            raise InputFileError(p, at, "binary data (a NUL byte): expected UTF-8 text")
        try:
            text = decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            at = line_no + chunk.count(b"\n", 0, max(exc.start, 0))
            raise InputFileError(p, at, f"not UTF-8 text ({exc.reason})") from None
        parts = text.split("\n")
        if len(parts) == 1:
            pending.append(text)
            continue
        pending.append(parts[0])
        yield "".join(pending) + "\n"
        line_no += 1
        for part in parts[1:-1]:
            yield part + "\n"
            line_no += 1
        pending = [parts[-1]]
    try:
        tail = decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise InputFileError(p, line_no, f"not UTF-8 text ({exc.reason})") from None
    last = "".join(pending) + tail
    if last:
        yield last


def head_text(
    path: str | os.PathLike[str], num_bytes: int = 4096, *, decompress: bool = False
) -> str:
    """The first `num_bytes` of a (checked) text file, for sniffing its format; bytes that
    are not UTF-8 are replaced (the full read reports them with their line)."""
    p = check_input_file(path)
    with _open_binary(p, decompress) as f:
        try:
            data = f.read(num_bytes)
        except (OSError, EOFError) as exc:
            raise InputFileError(p, 0, f"cannot read the file ({exc})") from None
    return data.decode("utf-8", errors="replace")


def read_text(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_DOCUMENT_BYTES, what: str = "file"
) -> str:
    """A whole (small) text file under `max_bytes` (a document: settings, a config)."""
    return "".join(iter_lines(path, max_bytes=max_bytes, what=what))


def parse_json(text: str, path: str | os.PathLike[str], line: int | None = None) -> Any:
    """json.loads with one-line errors naming `path` and the line (`line` for a JSONL line,
    else the line of the syntax error): syntax, nesting deeper than the parser's recursion
    limit (~1,000 levels), integers longer than Python converts (4,300 digits)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, line or exc.lineno, f"not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputFileError(path, line or 1, "JSON nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise InputFileError(path, line or 1, f"not valid JSON ({exc})") from None


def load_json_document(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_DOCUMENT_BYTES, what: str = "file"
) -> tuple[Any, str]:
    """(document, text) of a JSON file read under `max_bytes`."""
    text = read_text(path, max_bytes=max_bytes, what=what)
    return parse_json(text, path), text
