"""The references in docs/ list every table, column and endpoint (and stay generated)."""

from __future__ import annotations

import re
from pathlib import Path

from cluster.live.tokens import ROUTES
from telemetry.schema import TABLES
from telemetry.schema_doc import schema_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _path_key(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def test_telemetry_reference_is_generated_from_the_schema() -> None:
    text = (DOCS / "telemetry.md").read_text()
    assert text == schema_markdown(), (
        "regenerate: python -m telemetry.schema_doc > docs/telemetry.md"
    )


def test_telemetry_reference_lists_every_table_and_column_with_its_meaning() -> None:
    text = (DOCS / "telemetry.md").read_text()
    for table, cols in TABLES.items():
        section = text.split(f"### {table}\n", 1)[1].split("\n### ", 1)[0]
        for col in cols:
            row = next(
                line for line in section.splitlines() if line.startswith(f"| `{col.name}` |")
            )
            meaning = row.rstrip(" |").rsplit("|", 1)[1].strip()
            assert col.sql in row and meaning, (table, col.name)


def test_rest_reference_lists_every_endpoint_of_the_server() -> None:
    text = (DOCS / "rest-api.md").read_text()
    documented = {_path_key(m) for m in re.findall(r"`(/[^`?\s]*)", text)}
    source = (ROOT / "cluster" / "server" / "app.py").read_text()
    routes = {_path_key(p) for p in re.findall(r'@app\.(?:get|post|put|delete)\("([^"]+)"', source)}
    serving = (ROOT / "cluster" / "live" / "serving.py").read_text()
    routes |= {_path_key(p) for p in re.findall(r'add_api_route\("([^"]+)"', serving)}
    routes |= set(ROUTES)
    assert routes and routes <= documented, sorted(routes - documented)
