"""Compilers that print pages on their way: their output into a log file beside the build.

torch's exporters print the graph they traced when they fail (from Python, and from C++ straight
to the process's file descriptors: "Torch IR graph at exception", a GraphModule's code), pages of
IR ahead of kompile's one-line error, and on stdout, amid what `kompile run --json` prints there.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Everything printed meanwhile (Python's sys.stdout and sys.stderr, and file descriptors 1 and 2
    that C++ code writes to) goes to `log`, appended."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with log.open("a", encoding="utf-8", errors="replace") as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    yield
            finally:
                sink.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for fd in saved:
            os.close(fd)


@contextlib.contextmanager
def output_held(into: list[str]) -> Iterator[None]:
    """As output_to, into a temporary file whose text is appended to `into` afterwards: for what
    prints before any build folder exists (a compiler package's notes as it is imported)."""
    with tempfile.TemporaryDirectory(prefix="kompile-output-") as tmp:
        log = Path(tmp) / "output.log"
        try:
            with output_to(log):
                yield
        finally:
            into.append(log.read_text(encoding="utf-8", errors="replace") if log.exists() else "")
