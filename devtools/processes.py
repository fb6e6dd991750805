"""Server processes on loopback, for the dev cluster and the tests' servers (S3, MLflow, the operator).

Each process runs in its own session (so it leads a process group that holds its children too), its
output goes to a log file, readiness is an HTTP(S) health URL answering 200, and stopping never
signals a group whose leader has already been reaped: until it is reaped, its pid (the group's id)
cannot be reused, so a SIGKILL to the group reaches only what this process started.

Standard library only.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

LOG_TAIL_LINES = 40
POLL_SECONDS = 0.05
PROBE_TIMEOUT = 5.0
PORT_ATTEMPTS = 3  # a free port can be taken between picking it and the server binding it
# A direct opener: an http_proxy in the environment must not intercept loopback health checks.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ProcessError(RuntimeError):
    """A server process failed to start, exited, or did not answer its health URL in time."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; a tiny race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, or a note that it is missing."""
    if not path.is_file():
        return f"(no log at {path})"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def probe(url: str, tls: ssl.SSLContext | None = None, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when url answers 200 right now, else why not (never through a proxy)."""
    opener = _DIRECT
    if tls is not None:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls)
        )
    try:
        with opener.open(url, timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, half-started
        return str(err) or type(err).__name__


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group led by pid; a group that is gone already is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def exited(pid: int) -> bool:
    """Whether the child pid has exited, leaving it unreaped (a zombie keeps its pid taken)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def wait_unreaped(pid: int, timeout: float) -> None:
    """Wait up to timeout for the child pid to exit, leaving it unreaped."""
    deadline = time.monotonic() + timeout
    while not exited(pid):
        if time.monotonic() > deadline:
            return
        time.sleep(POLL_SECONDS)


class ManagedProcess:
    """One server process in its own session, its output appended to a log file.

    health_url answers 200 once the server is ready (tls: how to connect to it; None for plain http
    or the default certificate checks). env None inherits this process's environment. failure()
    builds errors of type `error`, so each caller raises its own kind.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        health_url: str = "",
        tls: ssl.SSLContext | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        grace: float = 10.0,
        error: type[ProcessError] = ProcessError,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.health_url = health_url
        self.tls = tls
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self.grace = grace
        self.error = error
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        with self.log_path.open("ab") as log:
            # A new session makes the process a group leader, so stop() reaches its children too.
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def exit_status(self) -> int | None:
        """The exit status once the process has exited, else None; never reaps it (see stop())."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return None if proc is None else proc.returncode
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return None if info is None else info.si_status

    def running(self) -> bool:
        return self._proc is not None and self.exit_status() is None

    def wait_healthy(self, timeout: float, *, since: float | None = None, poll: float = POLL_SECONDS) -> None:
        """Poll health_url until it answers 200; raise early when the process exits, or once timeout
        seconds have passed since `since` (a time.monotonic() value; default now)."""
        if not self.health_url:
            raise ValueError(f"{self.name} has no health URL to wait on")
        deadline = (time.monotonic() if since is None else since) + timeout
        while (not_ready := probe(self.health_url, self.tls)) is not None:
            if not self.running():
                raise self.failure("exited during start-up")
            if time.monotonic() > deadline:
                raise self.failure(f"not ready at {self.health_url} after {timeout:.0f}s (last: {not_ready})")
            time.sleep(poll)

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM to the process group, SIGKILL to what is left of it after grace seconds."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        signal_group(proc.pid, signal.SIGTERM)
        wait_unreaped(proc.pid, self.grace if grace is None else grace)
        # The leader is not reaped yet (alive or a zombie), so its pid, the group's id, cannot have
        # been reused: this SIGKILL reaches only what this process started (e.g. a stuck child).
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()

    def kill(self) -> None:
        """SIGKILL to the process group at once (a crash, as a test wants one), then reap."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()

    def failure(self, what: str) -> ProcessError:
        """An error naming this process, its exit status and the tail of its log."""
        status = "not started" if self._proc is None else f"exit status {self.exit_status()}"
        return self.error(
            f"{self.name} {what} ({status}); log {self.log_path}, last lines:\n{log_tail(self.log_path)}"
        )


def start_on_free_port(
    name: str,
    argv_for: Callable[[int], list[str]],
    log_path: Path,
    health_path: str,
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    grace: float = 10.0,
    error: type[ProcessError] = ProcessError,
) -> tuple[ManagedProcess, int]:
    """Start a plain-http server on a free loopback port and wait until it answers health_path;
    start it again on another port when the one picked was taken in between."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}{health_path}"
        proc = ManagedProcess(
            name, argv_for(port), log_path, health_url=url, env=env, cwd=cwd, grace=grace, error=error
        )
        proc.start()
        try:
            proc.wait_healthy(timeout)
            return proc, port
        except ProcessError:
            proc.stop()
            lost_port = "address already in use" in log_tail(log_path, 5).lower()
            if not lost_port or attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")
