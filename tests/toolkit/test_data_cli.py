"""The real data shipped with pdlab (cluster/data) and `pdlab data list|path`: every data set
is bundled, matches the full copy byte for byte (after gunzip) where one is present, the
bundled copy is what pdlab reads without a full copy, and the wheel ships it."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cluster.data as data
from cluster.core import ConfigError
from cluster.data import BUNDLED, DATASETS, data_path, dataset_path
from cluster.workloads.traces import resolve_trace_path
from toolkit.cli import app
from toolkit.profiles.real import load_profile
from toolkit.samples.lss_a6000 import lss_a6000_dir

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


def _bundled_files(d: data.Dataset) -> list[Path]:
    base = BUNDLED / d.path
    if base.is_dir():
        return sorted(p for p in base.rglob("*") if p.is_file())
    gz = base.with_name(base.name + ".gz")
    return [base if base.is_file() else gz]


def _plain(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def test_every_data_set_is_bundled_small_and_with_source_and_license() -> None:
    total = 0
    for d in DATASETS:
        files = _bundled_files(d)
        assert files and all(f.is_file() for f in files), d.name
        assert d.source and d.license and d.what, d.name
        for f in files:
            size = f.stat().st_size
            total += size
            # large files are gzipped (a gzip of a file over the threshold may stay over it)
            assert f.suffix == ".gz" or size <= 256 * 1024, f
    assert total < 8e6  # the wheel's real data stays well under 10 MB
    notes = (BUNDLED / "SOURCE.md").read_text()
    for d in DATASETS:
        assert f"`{d.name}`" in notes and d.license in notes


def test_the_bundled_files_are_the_full_copy_s_bytes() -> None:
    """Every bundled file's plain bytes have the digest SHA256SUMS records for the full copy
    (scripts/bundle_data.py writes it from the full copy), and SHA256SUMS lists exactly the
    bundled files; where the full copy sits next to this checkout, its bytes are compared
    too."""
    sums = dict(
        reversed(line.split("  ", 1))
        for line in (BUNDLED / "SHA256SUMS").read_text().splitlines()
        if line.strip()
    )
    bundled = {str(f.relative_to(BUNDLED)): f for d in DATASETS for f in _bundled_files(d)}
    assert set(sums) == set(bundled)
    for rel, f in bundled.items():
        assert hashlib.sha256(_plain(f)).hexdigest() == sums[rel], rel
        if SHARED.is_dir():
            r = Path(rel)
            full = SHARED / (r.with_suffix("") if f.suffix == ".gz" else r)
            if not full.exists():  # the full copy keeps some files gzipped itself
                full = SHARED / r
            assert _plain(f) == _plain(full), rel


def test_without_a_full_copy_pdlab_reads_the_bundled_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "full_roots", lambda: [])
    assert data.data_dir() == BUNDLED
    sweagent = resolve_trace_path("thunderagent_sweagent_glm45fp8_h200_turns.jsonl")
    assert sweagent == BUNDLED / "traces/thunderagent_sweagent_glm45fp8_h200_turns.jsonl.gz"
    assert lss_a6000_dir() == BUNDLED / "lss_ispass26_a6000"
    h100 = load_profile("h100")  # its CSVs are gzipped in the bundle
    assert h100.num_layers == 80 and h100.decode_attention.height > 0
    assert data_path("models/Qwen/Qwen3-32B.json").parent == BUNDLED / "models/Qwen"


def test_a_full_copy_in_pdlab_data_dir_is_used_first_and_a_partial_one_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models/Qwen").mkdir(parents=True)
    (tmp_path / "models/Qwen/Qwen3-32B.json").write_text("{}")
    monkeypatch.setenv("PDLAB_DATA_DIR", str(tmp_path))
    assert data_path("models/Qwen/Qwen3-32B.json") == tmp_path / "models/Qwen/Qwen3-32B.json"
    assert dataset_path("lss-a6000").name == "lss_ispass26_a6000"  # not in the partial copy
    with pytest.raises(ConfigError, match="unknown data set 'nope'"):
        dataset_path("nope")
    with pytest.raises(ConfigError, match="a path under the data root"):
        dataset_path("../secrets")


def test_data_list_and_path_from_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "full_roots", lambda: [])
    runner = CliRunner()
    res = runner.invoke(app, ["data", "list", "--json"])
    assert res.exit_code == 0, res.output
    entries = json.loads(res.output)
    assert [e["name"] for e in entries] == [d.name for d in DATASETS]
    assert {e["used_from"] for e in entries} == {"bundled"}
    res = runner.invoke(app, ["data", "list"])
    assert "bundled copy:" in res.output and "license: MIT (vidur)" in res.output
    res = runner.invoke(app, ["data", "path", "vllm-rtx4090-llama31-8b"])
    assert res.output.strip() == str(BUNDLED / "real_runs/rtx4090_llama31_8b_vllm")
    res = runner.invoke(app, ["data", "path", "nope"])
    assert res.exit_code == 2 and "unknown data set 'nope'" in res.output


def test_a_path_printed_by_pdlab_data_imports(tmp_path: Path) -> None:
    """The README's way: `pdlab import lss-bench $(pdlab data path NAME) --db real.duckdb`."""
    run = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "data", "path", "vllm-rtx4090-llama31-8b"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    res = CliRunner().invoke(app, ["import", "lss-bench", run, "--db", str(tmp_path / "r.duckdb")])
    assert res.exit_code == 0, res.output


def test_the_wheel_ships_the_bundled_data(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("pdlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for d in DATASETS:
        for f in _bundled_files(d):
            assert f"cluster/data/files/{f.relative_to(BUNDLED)}" in names, f
    assert wheel.stat().st_size < 10e6
    print(f"wheel: {wheel.stat().st_size / 1e6:.1f} MB")
