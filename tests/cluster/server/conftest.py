"""A real `pdlab serve` on a loopback port for the API tests (no mocks: HTTP, DuckDB, threads)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from telemetry import open_reader
from toolkit.client import ServerProcess, launch_server

TOKEN = "test-token-123"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("serve") / "live.duckdb"
    srv = launch_server(
        "--nodes", "4", "--split", "2P2D", "--agents", "24", "--workload", "cc",
        "--window", "60", "--slices", "4",
        token=TOKEN, db=db, speed=40.0,
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]
    # Shutdown consolidated the run into the database: no longer live, rows kept.
    runs = open_reader(db).runs()
    assert runs.height == 1 and not runs["live"][0]
    assert "switches" in srv.log()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=15.0) as c:
        yield c


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}
