"""Where in the user's code an error was raised: the line a message should point at.

A user's model fails inside torch, transformers or kompile's own calls; the frame worth naming is
the innermost one in code the user wrote (their model file, their factory), which is the one
outside torch, kompile and the standard library. Installed packages other than torch count as the
user's: a transformers model's forward() is where its error is."""

from __future__ import annotations

import re
import sys
import sysconfig
import traceback
from pathlib import Path


def user_frame(err: BaseException) -> traceback.FrameSummary | None:
    """The innermost traceback frame outside torch, kompile and the standard library, across the
    error's cause chain."""
    paths = {k: str(Path(v).resolve()) for k, v in sysconfig.get_paths().items()}
    torch = sys.modules.get("torch")  # no torch frames to skip where torch was never imported
    ours = [str(Path(__file__).resolve().parents[1])]
    torch_file: str | None = getattr(torch, "__file__", None)
    if torch_file:
        ours.append(str(Path(torch_file).resolve().parent))
    libraries = (paths["purelib"], paths["platlib"])  # user models may live there (transformers)

    def internal(filename: str) -> bool:
        path = str(Path(filename).resolve())
        stdlib = path.startswith(paths["stdlib"]) and not path.startswith(libraries)
        return "<" in filename or stdlib or path.startswith(tuple(ours))

    found: traceback.FrameSummary | None = None
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:  # the cause chain, outermost first
        seen.add(id(current))
        for frame in traceback.extract_tb(current.__traceback__):
            if not internal(frame.filename):
                found = frame
        current = current.__cause__ or current.__context__
    return found


def where(err: BaseException) -> str:
    """'nets.py:12' for the user's frame (a SyntaxError's own file and line), else ''."""
    if isinstance(err, SyntaxError) and err.filename:
        return f"{Path(err.filename).name}:{err.lineno}"
    frame = user_frame(err)
    return f"{Path(frame.filename).name}:{frame.lineno}" if frame is not None else ""


# OpenVINO's errors open with the C++ source locations that relayed them, one per line, and put
# the check that failed after the node it names; neither says what is wrong.
_RELAY = re.compile(r"^Exception from \S+:\d+:$")
_CHECK = re.compile(r"\s*Check '.*' failed at \S+:\d+:$")
# ONNX Runtime quotes the failed C++ check (file:line, function, condition) before its reason.
_ORT_CHECK = re.compile(r"/onnxruntime_src/\S+:\d+ .*? was false\. ")


def first_line(err: BaseException) -> str:
    """An error's first line of text, or its type and where it was raised where it says nothing:
    what a one-line message quotes of a library's pages. Where the line names a failed C++ check
    (OpenVINO), the node it names and the reason, which the message's last line gives."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not _RELAY.match(ln.strip())]
    if not lines:  # a bare assert in a library: say where it sits
        frames = traceback.extract_tb(err.__traceback__)
        at = f" in {Path(frames[-1].filename).name}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
        return type(err).__name__ + at
    head, checks = _CHECK.subn("", _ORT_CHECK.sub("", lines[0]))
    return f"{head}: {lines[-1]}" if checks and len(lines) > 1 else head
