"""Without torch, everything but the torch engine works (toolkit/extras.py, pyproject's
`engine` extra): each command runs in a fresh interpreter where `import torch` fails as it
does when torch is not installed (a meta-path finder refuses it). Simulate, fit, report,
import, twin and lab run without torch in a fresh virtual environment built with
`pip install .` in test_no_torch_venv.py (slow)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A finder ahead of all others: `import torch` (and importlib's find_spec) fail with the
# ModuleNotFoundError of a missing package; nothing else sees a difference.
NO_TORCH = (
    "import sys\n"
    "class NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, NoTorch())\n"
)
HINT = "needs PyTorch, which is not installed: pip install 'pdlab[engine]' (torch>=2.4)"


def pdlab(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    code = NO_TORCH + f"from toolkit.cli import app\napp({list(args)!r}, prog_name='pdlab')\n"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
        check=check,
    )  # fmt: skip


def test_torch_is_an_extra_with_a_range_and_dev_pins_ci_s_wheel() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    assert project["optional-dependencies"]["engine"] == ["torch>=2.4"]
    assert "torch==2.13.0" in project["optional-dependencies"]["dev"]


def test_no_module_outside_the_torch_engine_imports_torch() -> None:
    code = NO_TORCH + (
        "import importlib, pkgutil\n"
        "bad = []\n"
        "for pkg in ('models', 'telemetry', 'cluster', 'toolkit'):\n"
        "    for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + '.'):\n"
        "        if info.name.startswith(('cluster.engines.torch', 'toolkit.profiles.torch_calibration')):\n"
        "            continue\n"
        "        try:\n"
        "            importlib.import_module(info.name)\n"
        "        except ImportError as e:\n"
        "            bad.append(f'{info.name}: {e}')\n"
        "print('\\n'.join(bad) or 'none')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "none", out.stdout


def test_the_torch_commands_say_in_one_line_how_to_get_torch(tmp_path: Path) -> None:
    for args in (("engine",), ("serve", "--engines", "torch"), ("bench", "--suite", "engine")):
        res = pdlab(*args, cwd=tmp_path, check=False)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and HINT in lines[0], res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.parametrize("cmd", [("engine", "--help"), ("lab", "--help")])
def test_help_of_torch_commands_needs_no_torch(cmd: tuple[str, ...]) -> None:
    assert "Usage: pdlab" in pdlab(*cmd, cwd=ROOT).stdout
