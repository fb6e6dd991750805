"""kstatus, the status library behind Flux's health checks, run on an object: the TEST TOOL that
scripts/build-kstatus.sh builds from devtools/kstatus (sigs.k8s.io/cli-utils), not a copy of its rules."""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-kstatus.sh"


@cache
def _binary() -> Path:
    # stderr passes through: a cold build (about a minute) shows its progress lines.
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{BUILD_SCRIPT} failed with exit status {done.returncode}")
    return Path(lines[-1]) / "kstatus"


def kstatus(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) as kstatus computes them: InProgress, Failed, Current, Terminating..."""
    done = subprocess.run(
        [str(_binary())], input=json.dumps(obj), capture_output=True, text=True, check=True, timeout=60
    )
    out = json.loads(done.stdout)
    return out["status"], out["message"]
