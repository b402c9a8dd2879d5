"""`relaunch_command` placeholders reach the shell quoted (issue 28, Low): a URL or host in
the operator's cluster file is an argument of the command, never shell code."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from cluster.live.role_switch import SwitchFailed, relaunch_command


def test_placeholders_are_arguments_never_shell_code(tmp_path: Path) -> None:
    out, pwned = tmp_path / "out", tmp_path / "pwned"
    fields = {
        "role": "decode",
        "node_id": 3,
        "http_url": f"http://h:1/$(touch {pwned});`touch {pwned}`",
        "host": f"h; touch {pwned} #",
        "port": "",
    }
    template = "printf '%s\\n' {http_url} {host} {role} {node_id} {port} > " + shlex.quote(str(out))
    subprocess.run(relaunch_command(template, fields), shell=True, check=True)
    assert not pwned.exists()
    assert out.read_text().splitlines() == [fields["http_url"], fields["host"], "decode", "3", ""]


def test_a_malformed_template_names_the_placeholders() -> None:
    with pytest.raises(SwitchFailed, match=r"placeholders: \{role\}, \{port\}"):
        relaunch_command("restart {nope}", {"role": "decode", "port": 1})
