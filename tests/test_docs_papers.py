"""docs/papers.md maps the papers' equations and algorithms to code: every name it gives
(`module` or `module:Qualified.name` in backticks) must import and resolve, so the map
cannot silently rot when code moves."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "docs" / "papers.md"
SPEC = ROOT / "docs" / "spec.md"
PACKAGES = ("models", "telemetry", "cluster", "toolkit")
NAME = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.\w+)*)(?::([\w.]+))?`")


def _names() -> list[tuple[str, str | None]]:
    found = NAME.findall(PAPERS.read_text())
    return sorted({(mod, qual or None) for mod, qual in found}, key=lambda x: (x[0], x[1] or ""))


def test_papers_md_names_code() -> None:
    # A floor, so a broken pattern that matches nothing cannot pass vacuously.
    assert len(_names()) >= 100


@pytest.mark.parametrize("module,qualname", _names(), ids=lambda v: v or "")
def test_named_code_exists(module: str, qualname: str | None) -> None:
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as e:
        pytest.fail(
            f"docs/papers.md names module {module}, which does not import ({e}): update the map"
        )
    for part in (qualname or "").split(".") if qualname else ():
        assert hasattr(obj, part), (
            f"docs/papers.md names {module}:{qualname}, but {part!r} is not in "
            f"{getattr(obj, '__name__', obj)!r}: update the map"
        )
        obj = getattr(obj, part)


def test_spec_keeps_section_numbers() -> None:
    """Code cites "SPEC §N" for N in 1..10: each must be a heading of docs/spec.md."""
    headings = set(re.findall(r"(?m)^## (\d+)\. ", SPEC.read_text()))
    cited: set[str] = set()
    for pkg in (*PACKAGES, "tests"):
        for path in (ROOT / pkg).rglob("*.py"):
            cited.update(re.findall(r"SPEC §(\d+)", path.read_text()))
    assert cited, "no SPEC citations found: the pattern is broken"
    assert cited <= headings, (
        f"SPEC sections cited but missing from docs/spec.md: {cited - headings}"
    )


def test_paper_texts_stay_out_of_the_repo() -> None:
    """The papers are cited by title; their texts are not ours to commit."""
    text = PAPERS.read_text() + SPEC.read_text()
    assert "000_3130cbc389a3c17e" not in text and "003_882412fa7cdb72a3" not in text
