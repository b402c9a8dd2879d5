"""The bounded reader of user-named files (cluster.input_files): lines, errors, caps."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import input_files
from cluster.input_files import (
    ALLOW_SPECIAL_ENV,
    MAX_INPUT_MB_ENV,
    InputFileError,
    head_text,
    iter_lines,
    read_text,
)

text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=60
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(text, max_size=8), st.integers(1, 9), st.booleans())
def test_lines_are_the_file_split_at_newlines_whatever_the_chunks(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], chunk: int, gz: bool
) -> None:
    """Chunks of a few bytes cut lines and multi-byte characters anywhere: same lines."""
    body = "\n".join(parts)
    path = tmp_path_factory.mktemp("lines") / ("t.jsonl.gz" if gz else "t.jsonl")
    data = body.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(input_files, "CHUNK_BYTES", chunk)
        got = list(iter_lines(path, decompress=gz))
    assert "".join(got) == body
    assert all(line.endswith("\n") for line in got[:-1])
    expected = body.split("\n")
    if expected[-1] == "":  # a final newline ends the last line, it starts none
        expected.pop()
    assert [g.removesuffix("\n") for g in got] == expected


@pytest.mark.parametrize(
    ("data", "line", "words"),
    [
        (b"ok\nok\n\xff\xfe\n", 3, "not UTF-8"),
        (b"a\nb\nc\x00d\n", 3, "binary data"),
        ("a\n" * 5 + "caf\xe9".encode("latin-1").decode("latin-1"), 6, "not UTF-8"),
    ],
)
def test_errors_name_the_line_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes | str, line: int, words: str
) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(data if isinstance(data, bytes) else data.encode("latin-1"))
    monkeypatch.setattr(input_files, "CHUNK_BYTES", 3)
    with pytest.raises(InputFileError, match=f"f.txt: line {line}: {words}"):
        list(iter_lines(path))


def test_caps_count_decompressed_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b"{}\n" * 2_000_000))  # 6 MB of text, ~10 kB on disk
    monkeypatch.setenv(MAX_INPUT_MB_ENV, "2")
    with pytest.raises(InputFileError, match="larger than the 2 MiB"):
        list(iter_lines(path, decompress=True))
    monkeypatch.setenv(MAX_INPUT_MB_ENV, "8")
    assert sum(1 for _ in iter_lines(path, decompress=True)) == 2_000_000
    monkeypatch.setenv(MAX_INPUT_MB_ENV, "nan")
    with pytest.raises(ValueError, match=MAX_INPUT_MB_ENV):
        list(iter_lines(path))


def test_special_files_only_when_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputFileError, match=r"character device.*--allow-special-files"):
        read_text(link)
    monkeypatch.setenv(ALLOW_SPECIAL_ENV, "1")
    with pytest.raises(InputFileError, match="line 1: binary data"):
        read_text(link)
    assert head_text(link, 16) == "\x00" * 16
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    monkeypatch.delenv(ALLOW_SPECIAL_ENV)
    with pytest.raises(InputFileError, match="is a FIFO"):
        read_text(fifo)  # refused before opening (which would block without a writer)
    with pytest.raises(InputFileError, match="is a directory"):
        read_text(tmp_path)
    with pytest.raises(InputFileError, match="does not exist") as err:
        read_text(tmp_path / "nope")
    assert err.value.missing
