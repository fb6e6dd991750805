"""Backends' own environments, seen from the pipeline: where one is (`find_environment`), the
versions it holds, and `EnvProcess`, its python running kompile.compile_jobs.env_runner as a
subprocess that answers the requests of kompile.compile_jobs.env_protocol.

An environment is found at KOMPILE_ENV_<NAME>, else at $KOMPILE_ENVS_DIR/<name>, else in the cache
(${KOMPILE_CACHE:-~/.cache/kompile}/env-<name>-<hash of requirements/env-<name>.txt>, what
scripts/setup-backend-env.sh builds; where the requirements file is not at hand, an installed
package, the newest complete env-<name>-*). The compile-<name> image sets KOMPILE_ENV_<NAME>.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import kompile
from kompile.compile_jobs.backends.base import BackendError
from kompile.compile_jobs.env_protocol import RUNNER_MODULE, decode, encode, env_var
from kompile.compile_jobs.env_runner import PARENT_ENV

PACKAGE_DIR = Path(kompile.__file__).resolve().parent
COMPLETE = ".complete"
ENVS_DIR = "KOMPILE_ENVS_DIR"
"""A folder holding environments by name (`<dir>/<name>`): the compile-envs image's, which carries
every environment, for targets whose candidates need several."""
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Exit)\b.*|^Fatal Python error: .*")
"""A line of stderr that states what went wrong: a Python exception's last line (unindented) or
the interpreter's own fatal error (a segfault in a library)."""


class EnvironmentMissing(BackendError):
    """The backend's own environment is not built here."""

    reason = "EnvironmentMissing"


class EnvironmentFailed(BackendError):
    """The environment's process crashed or could not start; the message ends with its stderr tail."""

    reason = "EnvironmentFailed"


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    e = os.environ if env is None else env
    return Path(e["KOMPILE_CACHE"]) if e.get("KOMPILE_CACHE") else Path.home() / ".cache" / "kompile"


def requirements_file(name: str) -> Path:
    """requirements/env-<name>.txt of the checkout kompile is imported from."""
    return PACKAGE_DIR.parent / "requirements" / f"env-{name}.txt"


def setup_hint(name: str) -> str:
    return f"run scripts/setup-backend-env.sh {name} (or set {env_var(name)} to a built environment)"


def _complete(path: Path) -> bool:
    return (path / "bin" / "python").exists() and (path / COMPLETE).exists()


def find_environment(name: str, env: Mapping[str, str] | None = None) -> Path:
    """The folder of environment `name`; EnvironmentMissing saying how to build it otherwise."""
    e = os.environ if env is None else env
    override = e.get(env_var(name))
    if override:
        if not (Path(override) / "bin" / "python").exists():
            raise EnvironmentMissing(
                f"{env_var(name)}={override} has no bin/python: point it at an environment built by "
                f"scripts/setup-backend-env.sh {name}"
            )
        return Path(override)
    shelf = e.get(ENVS_DIR)
    if shelf and (Path(shelf) / name / "bin" / "python").exists():
        return Path(shelf) / name
    root = cache_root(e)
    pins = requirements_file(name)
    if pins.exists():
        key = hashlib.sha256(pins.read_bytes()).hexdigest()[:16]
        path = root / f"env-{name}-{key}"
        if _complete(path):
            return path
        stale = sorted(p.name for p in root.glob(f"env-{name}-*") if p != path)
        note = f" ({', '.join(stale)} in {root} were built from other pins)" if stale else ""
        raise EnvironmentMissing(
            f"the {name} backend runs in its own environment and {path} is not built{note}: "
            f"{setup_hint(name)}"
        )
    built = sorted((p for p in root.glob(f"env-{name}-*") if _complete(p)), key=lambda p: p.stat().st_mtime)
    if not built:
        raise EnvironmentMissing(
            f"the {name} backend runs in its own environment and none is built in {root}: {setup_hint(name)}"
        )
    return built[-1]


def installed_versions(name: str, dists: Iterable[str]) -> dict[str, str]:
    """Versions of `dists` installed in environment `name` (read from its metadata, nothing run);
    empty when the environment is missing."""
    try:
        path = find_environment(name)
    except EnvironmentMissing:
        return {}
    sites = [str(p) for p in path.glob("lib/python*/site-packages")]
    have = {_canon(d.metadata["Name"] or ""): d.version for d in metadata.distributions(path=sites)}
    return {d: have[_canon(d)] for d in dists if _canon(d) in have}


def _canon(dist: str) -> str:
    return dist.lower().replace("_", "-")


def _kompile_only_path(scratch: Path) -> Path:
    """A folder holding only `kompile` (a link to this package): the environment's python imports
    kompile from it and everything else from its own packages, never the project venv's."""
    holder = scratch / "pythonpath"
    holder.mkdir(parents=True, exist_ok=True)
    link = holder / "kompile"
    if not link.exists():
        link.symlink_to(PACKAGE_DIR, target_is_directory=True)
    return holder


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name  # SIGKILL: the kernel's OOM killer, most often
    except ValueError:
        return f"signal {number}"


class EnvProcess:
    """Environment `name`'s python serving requests until closed (or garbage collected)."""

    def __init__(self, name: str, scratch: Path | None = None) -> None:
        self.name = name
        python = find_environment(name) / "bin" / "python"
        self.scratch = Path(tempfile.mkdtemp(prefix=f"kompile-env-{name}-", dir=scratch))
        self.log_path = self.scratch / "stderr.log"
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        child_env.update(PYTHONPATH=str(_kompile_only_path(self.scratch)), PYTHONNOUSERSITE="1")
        child_env[PARENT_ENV] = str(os.getpid())  # the runner dies with this process
        # What its libraries leave in temp folders (TVM's builder: a tvm_tmp_mod.tar folder per
        # candidate, not always removed) goes with the scratch folder when the process ends.
        (self.scratch / "tmp").mkdir()
        child_env["TMPDIR"] = str(self.scratch / "tmp")
        self._log: IO[bytes] = self.log_path.open("wb")
        try:
            self.proc = subprocess.Popen(
                [str(python), "-m", RUNNER_MODULE, name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=child_env,
                cwd=self.scratch,
                text=True,
            )
        except OSError as err:
            self._log.close()
            raise EnvironmentFailed(f"cannot start the {name} environment's python {python}: {err}") from err
        self._finalizer = weakref.finalize(self, _stop, self.proc, self._log, self.scratch)

    def call(
        self, request: Mapping[str, Any], on_progress: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """Send one request; its reply (what the step says it is doing meanwhile goes to
        `on_progress`). BackendError with the step's message when it failed, EnvironmentFailed
        (with the stderr tail) when the process died."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(encode(dict(request)))
            stdin.flush()
            while True:
                line = stdout.readline()
                reply = decode(line) if line else {}
                if set(reply) != {"progress"}:
                    break
                if on_progress is not None:
                    on_progress(str(reply["progress"]))
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            code = self.proc.wait()
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            raise EnvironmentFailed(
                f"the {self.name} environment's process {how} during {request.get('op')}: "
                f"{self.stderr_error()} (its stderr is kept in {self.keep_log()})"
            )
        if not reply.get("ok"):
            raise BackendError(str(reply.get("error")))
        return reply

    def stderr_error(self) -> str:
        """What the process's stderr says went wrong: its last error line, not a traceback's frames
        (those are for a bug report: keep_log); else its last line."""
        self._log.flush()
        lines = [ln.rstrip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        found = next((ln for ln in reversed(lines) if _ERROR_LINE.match(ln)), lines[-1] if lines else "")
        return found[:500] or "no output on stderr"

    def keep_log(self) -> Path:
        """A copy of the process's stderr that outlives its scratch folder."""
        fd, kept = tempfile.mkstemp(prefix=f"kompile-{self.name}-env-", suffix=".log")
        os.close(fd)
        shutil.copyfile(self.log_path, kept)
        return Path(kept)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> EnvProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None and not issubclass(kind, Exception):
            # Interrupted (SIGTERM in a Job, Ctrl-C): the step's reply will not be read, and waiting
            # for it would spend the seconds left before the kubelet's SIGKILL.
            self.proc.kill()
        self.close()


def _stop(proc: subprocess.Popen[str], log: IO[bytes], scratch: Path) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):  # a process that died left a request unread
            proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    log.close()
    shutil.rmtree(scratch, ignore_errors=True)
