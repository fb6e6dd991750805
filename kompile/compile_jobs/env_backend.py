"""What the backends that run in their own environment (litert, xla, tvm, iree) share on the
pipeline's side: the source program saved for the environment, its compile step called, the
artifact it wrote recorded, and `EnvRunner`, the artifact loaded and run in that environment's
process (kompile.compile_jobs.env_protocol; arrays travel as `.npz` files by position)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kompile.compile_jobs.backends.base import Backend, BackendError, CompiledArtifact, CompileRequest, Feeds
from kompile.compile_jobs.backends.inductor import EXPORT_ERRORS, describe_export_error
from kompile.compile_jobs.benchmark import SelfTimed
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.environments import EnvProcess
from kompile.compile_jobs.export import names_for_outputs
from kompile.compile_jobs.hardware import cpu_description
from kompile.compile_jobs.quiet import output_to
from kompile.compile_jobs.source_module import in_eval_mode
from kompile.compile_jobs.sources import module_label

Array = np.ndarray[Any, Any]


def save_arrays(path: Path, arrays: list[Array]) -> str:
    np.savez(path, **{str(i): np.asarray(a, order="C") for i, a in enumerate(arrays)})  # type: ignore[arg-type]
    return str(path)


class EnvRunner:
    """An artifact loaded by its backend's environment process (its steps' `load`), run there on
    each feed (`run`); `timed` measures the call inside that process, the pipe's round trip left
    out. A subclass names its environment; `environment=` overrides it; `load` adds fields to the
    load request (IREE's device)."""

    environment = ""

    def __init__(
        self,
        path: Path,
        input_names: list[str],
        threads: int,
        environment: str = "",
        load: dict[str, str] | None = None,
    ) -> None:
        self.path, self.input_names = path, input_names
        self.process = EnvProcess(environment or self.environment)
        request = {"op": "load", "model": str(path.resolve()), "threads": threads, **(load or {})}
        reply = self.process.call(request)
        count = len(reply["outputs"])
        self.output_names: list[str] = names_for_outputs(count)
        self._files: dict[int, tuple[Feeds, str]] = {}
        self._calls = 0

    def _feed_file(self, feeds: Feeds) -> str:
        # Kept by identity (the dict held, so its id stays its own): timing sends the same feed again.
        known = self._files.get(id(feeds))
        if known is not None and known[0] is feeds:
            return known[1]
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BackendError(f"inputs {missing} missing for {self.path.name}; it takes {self.input_names}")
        self.check_feed(feeds)
        self._calls += 1
        arrays = [feeds[n] for n in self.input_names]
        path = save_arrays(self.process.scratch / f"feed-{self._calls}.npz", arrays)
        if len(self._files) >= 8:
            self._files.clear()
        self._files[id(feeds)] = (feeds, path)
        return path

    def check_feed(self, feeds: Feeds) -> None:
        """Refuse a feed the artifact cannot run (BackendError); the environment checks by default."""

    def run(self, feeds: Feeds) -> list[Array]:
        out = self.process.scratch / "outputs.npz"
        self.process.call({"op": "run", "feeds": self._feed_file(feeds), "out": str(out)})
        with np.load(out) as data:
            return [data[str(i)] for i in range(len(data.files))]

    def timed(self, feeds: Feeds) -> SelfTimed:
        """One call, timed in the environment's process."""
        reply = self.process.call({"op": "run", "feeds": self._feed_file(feeds), "out": ""})
        return SelfTimed(int(reply["ns"]))

    def close(self) -> None:
        self.process.close()


def save_program(request: CompileRequest, args: tuple[torch.Tensor, ...], path: Path, what: str) -> None:
    """`torch.export` of the source module at `args`, saved at `path` for a backend's environment;
    a BackendError naming the construct export cannot take."""
    with output_to(request.out_dir / "compile.log"), torch.no_grad():
        try:
            program = torch.export.export(in_eval_mode(request.module), args)
        except EXPORT_ERRORS as err:
            raise BackendError(describe_export_error(err, module_label(request.module), what)) from err
        torch.export.save(program, path)


def compile_in_environment(
    environment: str,
    scratch: Path,
    args: tuple[torch.Tensor, ...] | None,
    out: Path,
    precision: str,
    quantization: str = "",
    calibration: list[str] | None = None,
    *,
    program: Path | None = None,
    options: dict[str, str] | None = None,
    state: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """The environment's compile step on `program` (default: what `save_program` wrote in
    `scratch`; a backend that consumes ONNX names the export), with the export example `args`
    (None: none), the backend's `options` and its `state` folder: what the step records."""
    request: dict[str, Any] = {
        "op": "compile",
        "program": str((program or scratch / "program.pt2").resolve()),
        "example": save_arrays(scratch / "example.npz", [a.numpy() for a in args])
        if args is not None
        else "",
        "calibration": calibration or [],
        "precision": precision,
        "quantization": quantization,
        "out": str(out.resolve()),
    }
    if options is not None:
        request["options"] = options
    if state is not None:
        request["state"] = str(state)
    with EnvProcess(environment, scratch) as env:
        reply = env.call(request, progress)
    record: dict[str, str] = reply["record"]
    return record


def built_in_environment(backend: Backend, out: Path, record: dict[str, str]) -> CompiledArtifact:
    """The artifact an environment's compile step wrote at `out`, its versions read there."""
    toolchain = {**backend.installed_versions(), "cpu": cpu_description()}
    return CompiledArtifact(backend=backend.name, model_path=out, options=record, toolchain=toolchain)


def load_in_environment(
    artifact: CompiledArtifact,
    threads: int | None,
    environment: str,
    runner: type[EnvRunner] = EnvRunner,
    load: dict[str, str] | None = None,
) -> EnvRunner:
    """The artifact loaded in its environment's process, on `threads` (else the recorded count),
    with `load`'s extra fields in the load request (the device)."""
    recorded = artifact.options.get("threads", "")
    count = threads or (int(recorded) if recorded.isdigit() else available_cores())
    return runner(artifact.model_path, artifact.options["inputOrder"].split(","), count, environment, load)
