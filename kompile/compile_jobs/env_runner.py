"""The process a backend's own environment runs: `python -m kompile.compile_jobs.env_runner NAME`
serves requests (kompile.compile_jobs.env_protocol) with the steps of
`kompile.compile_jobs.envs.<NAME>` until stdin closes.

Standard library only here (the steps module brings the environment's packages): it runs under
that environment's packages, not the project's. A step raises StepFailed for a failure the user
can act on (answered with ok false); anything else is a crash: the traceback goes to stderr and
the process exits, and the pipeline reports its error line and keeps its stderr (EnvironmentFailed).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from kompile.compile_jobs.env_protocol import StepFailed, decode, encode, set_progress_sink

PARENT_ENV = "KOMPILE_ENV_PARENT"
"""The pid of the process that started this one (kompile.compile_jobs.environments.EnvProcess)."""
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """On Linux, have the kernel SIGKILL this process when the process that started it dies however
    it died (SIGKILL, the OOM killer): an idle runner ends when its stdin closes, but one in a step (a
    tvm tuning) would work on alone for up to its whole budget. The parent's thread that started it
    must outlive it (the kernel watches the thread); kompile starts environments from its main one."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(parent):  # it died before the kernel was told to watch
        os._exit(1)


def serve(name: str) -> int:
    _die_with_parent()
    # The protocol owns the real stdout; whatever libraries print (C code too) goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def tell(text: str) -> None:
        proto.write(encode({"progress": text}))

    set_progress_sink(tell)
    steps: Any = importlib.import_module(f"kompile.compile_jobs.envs.{name}").Steps()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = decode(line)
        handler = getattr(steps, f"op_{request.get('op')}", None)
        if handler is None:
            proto.write(encode({"ok": False, "error": f"unknown op {request.get('op')!r}"}))
            continue
        try:
            reply = {"ok": True, **handler(request)}
        except StepFailed as err:
            reply = {"ok": False, "error": str(err)}
        proto.write(encode(reply))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m kompile.compile_jobs.env_runner NAME")
    sys.exit(serve(sys.argv[1]))
