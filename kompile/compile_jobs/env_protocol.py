"""The contract between the pipeline and a backend's own environment, used by both sides: the
pipeline (kompile.compile_jobs.environments, in the project venv) starts
`<env>/bin/python -m kompile.compile_jobs.env_runner NAME` and sends it one JSON request per line on
stdin; the runner answers one JSON line per request on its stdout (whatever libraries print goes to
its stderr). Arrays travel as `.npz` files whose keys are positions ("0", "1", ...: the artifact's
input or output order), models as files.

Standard library only: this module runs under the environment's packages too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal, NotRequired, TypedDict

RUNNER_MODULE = "kompile.compile_jobs.env_runner"
ENV_PREFIX = "KOMPILE_ENV_"
"""KOMPILE_ENV_<NAME> (upper case): an environment's folder, over the cached one."""

Op = Literal["compile", "load", "run"]


class CompileRequest(TypedDict):
    """Build the artifact `out` from the model file at `program`."""

    op: Literal["compile"]
    program: str
    """The model: a `torch.export.save`d ExportedProgram at static shapes for a backend whose catalog
    entry consumes torch, the ONNX export for one that consumes onnx."""
    example: str
    """The export example (npz, one array per input)."""
    calibration: list[str]
    """Reference inputs at the exported shapes (npz each) for static int8; empty otherwise."""
    precision: str
    quantization: str
    """static or dynamic (int8); empty for other precisions."""
    out: str
    options: NotRequired[dict[str, str]]
    """The backend's options as the wire spells them (its catalog options model's `record()`), plus
    what the step needs to know of the class (e.g. `cpuFeatures`); absent: defaults."""
    state: NotRequired[str]
    """A folder the step reads and extends across compiles (a tuning database the pipeline keeps in
    step with the artifact store); absent: none."""


class LoadRequest(TypedDict):
    """Open the artifact at `model` with `threads` threads; later `run`s use it."""

    op: Literal["load"]
    model: str
    threads: int


class RunRequest(TypedDict):
    """Run the loaded artifact once on `feeds` (npz, kept in memory by path: timing sends the same
    file again); its outputs go to `out` (npz) unless out is empty."""

    op: Literal["run"]
    feeds: str
    out: str


class Reply(TypedDict, total=False):
    progress: str
    """A line with only this is not the reply but what a long step is doing (a tuning's round and
    trials); any number of them may come before the reply."""
    ok: bool
    error: str
    """Set when ok is false: a failure the user can act on (what to change)."""
    record: dict[str, str]
    """compile: what the artifact records (options)."""
    inputs: list[str]
    """load: the artifact's inputs in order."""
    outputs: list[str]
    """load: the artifact's outputs in order."""
    ns: int
    """run: nanoseconds of the call itself, measured in the environment's process."""


class StepFailed(Exception):
    """Raised by a step (kompile.compile_jobs.envs.<NAME>) for a failure the user can act on (a
    model the converter cannot take): answered with ok false and this message."""


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper().replace("-", "_")


def encode(message: Any) -> str:
    return json.dumps(message, separators=(",", ":")) + "\n"


def decode(line: str) -> dict[str, Any]:
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {line[:80]!r}")
    return value


_progress_sink: Callable[[str], None] | None = None


def set_progress_sink(sink: Callable[[str], None] | None) -> None:
    """Where `progress` goes: the runner's protocol stream (kompile.compile_jobs.env_runner)."""
    global _progress_sink
    _progress_sink = sink


def progress(text: str) -> None:
    """Tell the pipeline what a long step is doing now; nothing outside a runner."""
    if _progress_sink is not None:
        _progress_sink(text)
