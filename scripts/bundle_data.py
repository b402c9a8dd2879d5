"""Build pdlab's bundled real data (cluster/data/files/) from a full copy.

    python scripts/bundle_data.py [--from ../shared/data]

Copies the files of every data set in `cluster.data.catalog.DATASETS` byte for byte, gzips
those over BUNDLE_GZIP_BYTES (gzip -9, no name or time in the header, so the output is the
same on every run), and writes SOURCE.md (what, source, license of each). The result is what
`pip install pdlab` ships; `pdlab data list` shows it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
from pathlib import Path

from cluster.data import BUNDLED
from cluster.data.catalog import BUNDLE_GZIP_BYTES, DATASETS


def _files(src: Path, path: str, files: tuple[str, ...]) -> list[str]:
    base = src / path
    if base.is_file():
        return [path]
    if files:
        return [f"{path}/{f}" for f in files]
    return sorted(str(p.relative_to(src)) for p in base.rglob("*") if p.is_file())


def _copy(src: Path, rel: str) -> int:
    data = (src / rel).read_bytes()
    out = BUNDLED / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    if len(data) > BUNDLE_GZIP_BYTES and not rel.endswith(".gz"):
        out = out.with_name(out.name + ".gz")
        with out.open("wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as f:
            f.write(data)
    else:
        out.write_bytes(data)
    return out.stat().st_size


SUMS = "SHA256SUMS"  # sha256 of each bundled file's plain bytes, as in the full copy


def plain_bytes(path: Path) -> bytes:
    """A file's bytes, decompressed when it is a `.gz`."""
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def write_sums(src: Path) -> int:
    """SHA256SUMS: one `<sha256>  <path in the bundle>` line per bundled file, the digest of
    the full copy's plain bytes, so a checkout without the full copy can still check that
    its bundle is the full copy's bytes (tests/toolkit/test_data_cli.py)."""
    lines = []
    for d in DATASETS:
        base = BUNDLED / d.path
        files = (
            sorted(p for p in base.rglob("*") if p.is_file())
            if base.is_dir()
            else [base if base.is_file() else base.with_name(base.name + ".gz")]
        )
        for f in files:
            rel = f.relative_to(BUNDLED)
            full = src / (rel.with_suffix("") if f.suffix == ".gz" else rel)
            if not full.exists():  # the full copy keeps some files gzipped itself
                full = src / rel
            lines.append(f"{hashlib.sha256(plain_bytes(full)).hexdigest()}  {rel}")
    (BUNDLED / SUMS).write_text("\n".join(lines) + "\n")
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="src", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "data")  # fmt: skip
    src = parser.parse_args().src
    shutil.rmtree(BUNDLED, ignore_errors=True)
    lines = [
        "# Real data bundled with pdlab",
        "",
        f"Built by `scripts/bundle_data.py` from a full copy; files over {BUNDLE_GZIP_BYTES // 1024}"
        " KiB are gzip-compressed (`<name>.gz`). `pdlab data list` says which copy is used.",
        "",
        "| data set | path | what | source | license |",
        "|---|---|---|---|---|",
    ]
    total = 0
    for d in DATASETS:
        for rel in _files(src, d.path, d.files):
            total += _copy(src, rel)
        lines.append(f"| `{d.name}` | `{d.path}` | {d.what} | {d.source} | {d.license} |")
    (BUNDLED / "SOURCE.md").write_text("\n".join(lines) + "\n")
    write_sums(src)
    print(f"bundled {len(DATASETS)} data sets into {BUNDLED}: {total / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
