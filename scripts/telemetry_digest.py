"""Print the digest of every telemetry table of a run (`telemetry.digest`).

`python scripts/telemetry_digest.py DB [--run RUN]`: one line per table: name, rows, digest.
"""

from __future__ import annotations

import argparse

from telemetry.digest import table_digests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--run", default=None)
    args = ap.parse_args()
    for t, (n, d) in table_digests(args.db, args.run).items():
        print(f"{t} {n} {d}")


if __name__ == "__main__":
    main()
