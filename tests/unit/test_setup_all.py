"""scripts/setup-all.sh (`make setup`): its three lanes run at once, and a failed step fails the run,
shows its log and stops only its own lane. Stand-ins: the scripts it calls, copied beside it as stubs
that note when they ran (the real ones download gigabytes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = {
    "setup-venv.sh": "venv",
    "install-tools.sh": "tools",
    "setup-backend-env.sh": "env-$1",
    "build-control-plane.sh": "control-plane",
    "build-s3-server.sh": "s3-server",
    "build-kstatus.sh": "kstatus",
    "fetch-kserve-crd.sh": "kserve-crd",
}


def _repo(tmp_path: Path, fail: str = "") -> Path:
    """A folder with setup-all.sh and stub scripts: each writes `<step> <start> <end>` to ran.txt
    after a second's sleep; the step named `fail` says why on stderr and exits 3 instead."""
    scripts = tmp_path / "repo" / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup-all.sh", scripts)
    for script, step in STEPS.items():
        (scripts / script).write_text(
            "#!/usr/bin/env bash\n"
            f'step="{step}"; start=$(date +%s.%N); sleep 1\n'
            f'if [ "$step" = "{fail}" ]; then echo "$step: the download broke off" >&2; exit 3; fi\n'
            f'echo "$step $start $(date +%s.%N)" >> {tmp_path}/ran.txt\n'
        )
        (scripts / script).chmod(0o755)
    return scripts / "setup-all.sh"


def _run(script: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KOMPILE_CACHE": str(tmp_path / "cache")}
    return subprocess.run(
        ["bash", str(script), "iree", "tvm"], capture_output=True, text=True, env=env, timeout=60
    )


def _ran(tmp_path: Path) -> dict[str, tuple[float, float]]:
    rows = (tmp_path / "ran.txt").read_text().split("\n")
    return {r.split()[0]: (float(r.split()[1]), float(r.split()[2])) for r in rows if r}


def test_every_step_runs_once_and_the_three_lanes_overlap(tmp_path: Path) -> None:
    began = time.monotonic()
    done = _run(_repo(tmp_path), tmp_path)
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    ran = _ran(tmp_path)
    assert set(ran) == {
        "venv",
        "tools",
        "env-iree",
        "env-tvm",
        "control-plane",
        "s3-server",
        "kstatus",
        "kserve-crd",
    }
    # Each lane's first step starts at once, not after another lane's: 8 one-second steps, 4 in the
    # longest lane.
    firsts = [ran[s][0] for s in ("venv", "env-iree", "control-plane")]
    assert max(firsts) - min(firsts) < 0.8
    assert wall < 7, wall
    # Within a lane, one after another.
    assert ran["control-plane"][1] <= ran["s3-server"][0] <= ran["kstatus"][0] <= ran["kserve-crd"][0]
    assert ran["venv"][1] <= ran["tools"][0] and ran["env-iree"][1] <= ran["env-tvm"][0]
    logs = tmp_path / "cache" / "setup-logs"
    assert {p.name for p in logs.iterdir()} >= {"venv.log", "env-tvm.log", "control-plane.log"}


def test_a_failed_step_fails_the_run_shows_its_log_and_stops_only_its_lane(tmp_path: Path) -> None:
    done = _run(_repo(tmp_path, fail="s3-server"), tmp_path)
    assert done.returncode == 1
    assert "[setup] ERROR: s3-server failed" in done.stderr
    assert "s3-server: the download broke off" in done.stderr  # the tail of its log
    assert "setup-logs/s3-server.log" in done.stderr
    ran = _ran(tmp_path)
    # Its lane stopped there; the other lanes finished what they had.
    assert "s3-server" not in ran and "kstatus" not in ran and "kserve-crd" not in ran
    assert {"control-plane", "venv", "tools", "env-iree", "env-tvm"} <= set(ran)
