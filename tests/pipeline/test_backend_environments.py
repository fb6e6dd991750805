"""The contract with a backend's own environment (kompile.compile_jobs.env_protocol): the pipeline
starts the environment's python on kompile.compile_jobs.env_runner and talks JSON lines with it.
Stand-in environments here: one whose python is the project venv's (it lacks LiteRT, so loading a
model crashes the process), and one whose python dies at once. A step's own failure is a
BackendError with its message; a dead process is EnvironmentFailed with its error line; in a run,
each becomes the candidate's reason, never a traceback."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kompile.compile_jobs.backends.base import BackendError
from kompile.compile_jobs.environments import EnvironmentFailed, EnvProcess
from tests.pipeline.conftest import small_cnn_doc


def _env(path: Path, script: str) -> Path:
    (path / "bin").mkdir(parents=True)
    python = path / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    (path / ".complete").touch()
    return path


@pytest.fixture(autouse=True)
def _kept_logs_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stderr copies kept for a bug report (EnvProcess.keep_log) go to this test's folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture
def project_python_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An 'environment' running this venv's python: the runner and the protocol, no LiteRT."""
    path = _env(tmp_path / "venv-env", f'exec {sys.executable} "$@"')
    monkeypatch.setenv("KOMPILE_ENV_LITERT", str(path))
    return path


def test_a_step_failure_comes_back_as_its_message(project_python_env: Path) -> None:
    with EnvProcess("litert") as env:
        with pytest.raises(BackendError, match="no model loaded") as err:
            env.call({"op": "run", "feeds": "x.npz", "out": ""})
        assert not isinstance(err.value, EnvironmentFailed)
        with pytest.raises(BackendError, match="unknown op 'bogus'"):
            env.call({"op": "bogus"})
        # The process outlives a step's failure: the next request is served.
        with pytest.raises(BackendError, match="no model loaded"):
            env.call({"op": "run", "feeds": "x.npz", "out": ""})


def test_a_crash_is_environment_failed_with_its_error_and_a_kept_log(
    project_python_env: Path, tmp_path: Path
) -> None:
    env = EnvProcess("litert")
    with pytest.raises(EnvironmentFailed) as info:
        env.call({"op": "load", "model": str(tmp_path / "m.tflite"), "threads": 1})
    env.close()
    assert not env.scratch.exists()  # the process's scratch (feeds, stderr log) goes with it
    message = str(info.value)
    # The error itself, not the traceback's frames: the whole stderr is kept for a bug report.
    assert "exited with code 1 during load: ModuleNotFoundError: No module named 'ai_edge_litert'" in message
    assert "Traceback" not in message and 'File "' not in message, message
    kept = Path(message.rsplit("its stderr is kept in ", 1)[1].rstrip(")"))
    assert "Traceback (most recent call last)" in kept.read_text()
    kept.unlink()


def test_an_environment_process_dies_with_the_process_that_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kompile killed outright (SIGKILL, the OOM killer) must not leave its environment's process
    working on alone: a tvm one would go on tuning for up to half an hour. An idle one ends when its
    stdin closes; a busy one is stood in here by the project's python whose import of the steps
    module blocks (a sitecustomize named so), as a long step would."""
    import signal
    import subprocess
    import time

    stub = tmp_path / "busy-stand-in"
    stub.mkdir()
    (stub / "sitecustomize.py").write_text(
        "import importlib, time\n"
        "real = importlib.import_module\n"
        "def busy(name, *args):\n"
        "    if name.endswith('envs.litert'):\n"
        "        time.sleep(600)\n"
        "    return real(name, *args)\n"
        "importlib.import_module = busy\n"
    )
    env = _env(tmp_path / "busy-env", f'PYTHONPATH={stub}:$PYTHONPATH exec {sys.executable} "$@"')
    monkeypatch.setenv("KOMPILE_ENV_LITERT", str(env))
    script = (
        "import time\n"
        "from kompile.compile_jobs.environments import EnvProcess\n"
        "env = EnvProcess('litert')\n"
        "print(env.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    # Killed outright, it cannot remove its scratch folder: that goes in this test's folder.
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(3)  # the child is in its step
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def alive(pid: int) -> bool:  # an unreaped zombie has exited
        try:
            return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the environment's process outlived the process that started it")


def test_an_environment_that_cannot_start_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _env(tmp_path / "broken", "echo 'libpython3.11.so: cannot open shared object file' >&2; exit 127")
    monkeypatch.setenv("KOMPILE_ENV_LITERT", str(path))
    with (
        EnvProcess("litert") as env,
        pytest.raises(EnvironmentFailed, match=r"code 127 during load: libpython3.11.so: cannot open"),
    ):
        env.call({"op": "load", "model": "m.tflite", "threads": 1})


def test_a_process_the_kernel_kills_is_named_by_its_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stands in for the OOM killer: the process gets SIGKILL, with nothing on its stderr.
    monkeypatch.setenv("KOMPILE_ENV_LITERT", str(_env(tmp_path / "killed", "kill -KILL $$")))
    with (
        EnvProcess("litert") as env,
        pytest.raises(EnvironmentFailed, match=r"was killed by SIGKILL during load: no output on stderr"),
    ):
        env.call({"op": "load", "model": "m.tflite", "threads": 1})


def test_arrays_travel_as_npz_by_position(project_python_env: Path, tmp_path: Path) -> None:
    """The feeds file a runner writes is what the environment reads: positions, not names."""
    from kompile.compile_jobs.env_backend import save_arrays
    from kompile.compile_jobs.envs import read_arrays
    from kompile.compile_jobs.envs.litert import _ordered

    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.int64)
    got = read_arrays(save_arrays(tmp_path / "f.npz", [a, b]))
    assert [x.tolist() for x in got] == [a.tolist(), b.tolist()]
    assert _ordered(["args_10", "args_2", "args_0"]) == ["args_0", "args_2", "args_10"]


def _litert_run(kompile_run: Any, write_manifest: Any) -> dict[str, Any]:
    doc = small_cnn_doc(targets=[{"name": "edge", "backend": "litert", "precision": "fp32"}])
    res = kompile_run(write_manifest(doc))
    target: dict[str, Any] = res.status["targets"][0]
    return target


def test_a_run_without_the_environment_fails_the_target_with_what_to_run(
    kompile_run: Any, write_manifest: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KOMPILE_ENV_LITERT", raising=False)
    monkeypatch.setenv("KOMPILE_CACHE", str(tmp_path / "empty-cache"))
    target = _litert_run(kompile_run, write_manifest)
    assert target["phase"] == "Failed" and target["reason"] == "EnvironmentMissing", target
    assert "run scripts/setup-backend-env.sh litert" in target["message"]


def test_a_run_whose_environment_crashes_fails_the_target_with_its_stderr(
    kompile_run: Any, write_manifest: Any, project_python_env: Path
) -> None:
    target = _litert_run(kompile_run, write_manifest)  # the venv's python has no litert_torch
    assert target["phase"] == "Failed" and target["reason"] == "EnvironmentFailed", target
    assert "during compile" in target["message"] and "litert_torch" in target["message"]


def test_the_setup_script_builds_an_environment_where_python_has_no_ensurepip(tmp_path: Path) -> None:
    """NVIDIA's containers (the compile-gpu-envs image's base) may ship a Python without ensurepip,
    where `python3 -m venv DIR` fails: the script makes the venv without pip and installs pip into
    it with the system's. Stand-in: a python3 on PATH that fails `-m venv` as Debian's does
    without python3-venv. The pins file holds no package (pip itself comes from PyPI)."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "scripts").mkdir()
    shutil.copy(root / "scripts" / "setup-backend-env.sh", tmp_path / "scripts")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "env-empty.txt").write_text("# no packages\n")
    shim = tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("python3")
    assert real
    (shim / "python3").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = venv ] && [ "$3" != --without-pip ]; then\n'
        '  echo "ensurepip is not available" >&2; exit 1\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    (shim / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "KOMPILE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup-backend-env.sh"), "empty"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    built = Path(done.stdout.strip().splitlines()[-1])
    assert (built / ".complete").is_file()
    pip = subprocess.run(
        [str(built / "bin" / "python"), "-m", "pip", "--version"], capture_output=True, text=True
    )
    assert pip.returncode == 0 and str(built) in pip.stdout


def test_the_environments_temporary_files_go_with_its_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TVM's builder exports each candidate to a mkdtemp() folder (tvm_tmp_mod.tar) it does not
    always remove: 128 of them were left in /tmp after two test runs. The environment's TMPDIR is
    inside its scratch folder, which goes when the process ends."""
    told = tmp_path / "tmpdir.txt"
    path = _env(tmp_path / "env", f'echo "$TMPDIR" > {told}\nexec {sys.executable} "$@"')
    monkeypatch.setenv("KOMPILE_ENV_LITERT", str(path))
    with EnvProcess("litert") as env:
        with pytest.raises(BackendError, match="no model loaded"):
            env.call({"op": "run", "feeds": "x.npz", "out": ""})
        tmpdir = Path(told.read_text().strip())
        assert tmpdir.is_dir() and tmpdir.is_relative_to(env.scratch), (tmpdir, env.scratch)
    assert not env.scratch.exists()
