"""A notebook's own database and run size (toolkit/notebook.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.core import ConfigError
from toolkit.fit.synth import synth_logs
from toolkit.notebook import notebook_db, run_size


def test_run_size_is_the_cells_choice_unless_the_tests_ask_for_quick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PDLAB_QUICK", raising=False)
    assert run_size() == "default" and run_size("full") == "full"
    monkeypatch.setenv("PDLAB_QUICK", "1")
    assert run_size("full") == "quick"
    monkeypatch.setenv("PDLAB_QUICK", "0")
    assert run_size("full") == "full"
    with pytest.raises(
        ConfigError, match="run size must be one of quick, default, full, got 'big'"
    ):
        run_size("big")


def test_notebook_db_is_fresh_on_each_execution(tmp_path: Path) -> None:
    db = notebook_db("01_quickstart", data_dir=tmp_path / ".data")
    assert db == tmp_path / ".data" / "01_quickstart.duckdb" and not db.exists()
    synth_logs(db, nodes=1, prefill_iters=10, decode_iters=10)
    (tmp_path / ".data" / "01_quickstart.duckdb.wal").write_text("left over")
    (tmp_path / ".data" / "01_quickstart.duckdb.live" / "run-x").mkdir(parents=True)
    assert notebook_db("01_quickstart", fresh=False, data_dir=tmp_path / ".data").exists()
    again = notebook_db("01_quickstart", data_dir=tmp_path / ".data")
    assert sorted(p.name for p in (tmp_path / ".data").iterdir()) == []
    assert again == db


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden"])
def test_notebook_db_names_are_plain_stems(name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plain file stem"):
        notebook_db(name, data_dir=tmp_path)
