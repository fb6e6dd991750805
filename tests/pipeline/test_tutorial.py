"""Every `kompile` command in section 1 of docs/tutorial.md runs as written and succeeds."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"


def _local_commands() -> list[str]:
    text = TUTORIAL.read_text()
    section = text.split("## 1.", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [
        line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("kompile ")
    ]


def test_tutorial_has_local_commands() -> None:
    assert len(_local_commands()) >= 3


@pytest.mark.parametrize("command", _local_commands())
def test_tutorial_command(command: str, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    argv = [sys.executable, "-m", "kompile.cli", *shlex.split(command)[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "--json" in command:
        assert '"targetsReady": "2/2"' in proc.stdout
