"""Fixtures of the engine tests: SGLang's wire modules (shared with tests/cluster/sglang) and
helpers that drive a torch engine's scheduler in-process."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest

_SGLANG_CONFTEST = Path(__file__).resolve().parents[1] / "sglang" / "conftest.py"


def _sglang_fixtures() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("_pdlab_sglang_conftest", _SGLANG_CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def sglang_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, types.ModuleType]:
    """SGLang 0.5.23's kv_events, network and forward_pass_metrics modules, from its wheel."""
    return _sglang_fixtures().load_sglang_modules(tmp_path, monkeypatch)


@pytest.fixture
def engine_parts():  # type: ignore[no-untyped-def]
    """Factory: `make(role="null", **EngineConfig fields)` -> a started Scheduler; stopped after."""
    from cluster.engines.torch.config import EngineConfig
    from cluster.engines.torch.runner import ModelRunner
    from cluster.engines.torch.scheduler import Scheduler
    from cluster.engines.torch.transfer import RoomRegistry

    made: list[Scheduler] = []

    def make(role: str = "null", **fields: Any) -> Scheduler:
        cfg = EngineConfig(**({"gpu_pages": 256, "host_pages": 512} | fields))
        sched = Scheduler(cfg, role, ModelRunner(cfg), rooms=RoomRegistry())  # type: ignore[arg-type]
        sched.start()
        made.append(sched)
        return sched

    yield make
    for s in made:
        s.stop()
