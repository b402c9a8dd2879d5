"""Trace files that are not what they claim: devices, directories, binary, deep JSON, bombs.

`make_workload(path)` (and `pdlab simulate --workload FILE`) reads a trace through the
bounded reader (cluster.input_files): each of these is one `ConfigError` naming the file,
not a traceback and not the machine's memory. test_fuzz_traces.py fuzzes the records.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from fuzz_cli import RSS_CAP_MB, one_line_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.core import ConfigError
from cluster.input_files import MAX_INPUT_MB_ENV
from cluster.workloads import make_workload

RECORD = {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}


def _load(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        make_workload(str(path))
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("binary.jsonl", b"\x00\x01\x02garbage", "binary data"),
        ("latin.jsonl", b'{"timestamp": 0, "input_length": "caf\xe9"}\n', "not UTF-8"),
        ("deep.jsonl", ("[" * 100_000).encode() + b"\n", "unrecognised trace"),
        ("deep2.jsonl", (json.dumps(RECORD) + "\n" + "[" * 100_000 + "\n").encode(), ":2: not valid JSON"),
        ("bad.csv.gz", b"not gzip at all", "cannot read"),
    ],
)  # fmt: skip
def test_probe_malformed_trace_files(tmp_path: Path, name: str, content: bytes, words: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert words in _load(path)


def test_probe_a_trace_that_is_a_device_or_a_directory(tmp_path: Path) -> None:
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    assert "character device" in _load(link)
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"folder\.jsonl"):
        make_workload(str(folder))
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "pipe.jsonl"
        os.mkfifo(fifo)
        assert "FIFO" in _load(fifo)  # refused before opening it (opening would block)


def test_probe_a_gzip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    """24 MiB of valid records in a small .gz: the cap counts decompressed bytes."""
    path = tmp_path / "bomb.jsonl.gz"
    line = (json.dumps(RECORD) + "\n").encode()
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(24 * 2**20 // (len(line) * 1024) + 1):
            f.write(line * 1024)
    res = run_cli("simulate", "--workload", str(path), "--duration", "30", "--warmup", "0",
                  env={MAX_INPUT_MB_ENV: "8"})  # fmt: skip
    one_line_error(res.code, res.err, "bomb.jsonl.gz", "larger than the 8 MiB")
    assert res.peak_rss_mb < RSS_CAP_MB, res


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=1, max_size=200), st.sampled_from([".jsonl", ".csv", ".json"]))
def test_any_bytes_as_a_trace(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, ext: str
) -> None:
    path = tmp_path_factory.mktemp("bytes") / f"t{ext}"
    path.write_bytes(data)
    try:
        make_workload(str(path))
    except ConfigError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc), str(exc)
