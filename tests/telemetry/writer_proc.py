"""A telemetry writer in its own process, stepped by the test over stdin/stdout.

usage: writer_proc.py DB RUN_ID BATCHES ROWS
Registers 3 nodes, then for each batch appends ROWS decode iterations, flushes, prints
"flushed <total>" and waits for a line on stdin. Then prints "closing", closes (finalizes)
and prints "closed". A test that never answers the last prompt can kill it mid-run.
"""

from __future__ import annotations

import sys

import numpy as np

from telemetry import TelemetryWriter


def main(db: str, run_id: str, batches: int, rows: int) -> None:
    w = TelemetryWriter(db, run_id=run_id, flush_interval_s=3600)
    w.add_nodes(
        [
            {"node_id": i, "name": f"n{i}", "hardware": "H200", "moe_top_k": 8, "moe_experts": 256}
            for i in range(3)
        ]
    )
    total = 0
    for _ in range(batches):
        ids = np.arange(total, total + rows, dtype=np.int64)
        w.append(
            "decode_iterations",
            {
                "node_id": (ids % 3).astype(np.int32),
                "iter_id": ids,
                "t_start": ids * 0.01,
                "duration_s": np.full(rows, 0.01),
                "batch_size": np.full(rows, 8, dtype=np.int32),
                "t_fwd": np.ones(rows),
                "ctx_tokens": ids,
            },
        )
        w.flush()
        total += rows
        print(f"flushed {total}", flush=True)
        sys.stdin.readline()
    print("closing", flush=True)
    w.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
