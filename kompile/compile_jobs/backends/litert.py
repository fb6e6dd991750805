"""LiteRT backend for CPUs of devices: the source module through `torch.export` here, then
`litert-torch` and ai-edge-quantizer in the backend's own environment (requirements/env-litert.txt:
litert-torch 0.10 needs torch < 2.15, the project has 2.15) into a `.tflite` model.

Steps, each recorded in the artifact's options:
- `torch.export` at a static shape in the pipeline's process: the signature's opt size for each
  dynamic dimension (litert-torch cannot convert a dynamic dimension: "Shapes must be 1D sequences
  of concrete values of integer type"); the options say `exportedStatic` with the shape, and status
  says the artifact runs only there. The program goes to the environment as a `torch.export.save`
  file, the example and the reference inputs as `.npz` files;
- in the environment (kompile.compile_jobs.envs.litert): conversion to an fp32 `.tflite`; int8
  static: full-integer (int8 weights, activations, inputs and outputs) calibrated on the reference
  inputs at the exported shape; int8 dynamic: int8 weights, activations quantized at run time;
- `load` starts the environment's process with the LiteRT interpreter (XNNPACK delegate, the run's
  threads): validation runs the `.tflite` that ships there, and the benchmark times each call in
  that process (its own measure, the pipe's round trip left out).

A missing environment fails the candidate with reason EnvironmentMissing (what to run to build
it), a crashed one with EnvironmentFailed and its stderr tail. Not served by KServe: devices fetch
the artifact from the store (docs/operations.md, "Device fleets").
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kompile.api.catalog.litert import LiteRtOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    options_of,
)
from kompile.compile_jobs.backends.executorch import device_example
from kompile.compile_jobs.backends.inductor import EXPORT_ERRORS, describe_export_error
from kompile.compile_jobs.benchmark import SelfTimed, available_cores
from kompile.compile_jobs.environments import EnvProcess
from kompile.compile_jobs.hardware import cpu_description

Array = np.ndarray[Any, Any]
ENVIRONMENT = "litert"


def save_arrays(path: Path, arrays: list[Array]) -> str:
    np.savez(path, **{str(i): np.ascontiguousarray(a) for i, a in enumerate(arrays)})  # type: ignore[arg-type]
    return str(path)


class LiteRtRunner:
    """A `.tflite` model run by the LiteRT interpreter in the environment's process (a subclass
    names another environment whose steps answer the same load and run requests)."""

    environment = ENVIRONMENT

    def __init__(self, path: Path, input_names: list[str], threads: int) -> None:
        self.path, self.input_names = path, input_names
        self.process = EnvProcess(self.environment)
        reply = self.process.call({"op": "load", "model": str(path.resolve()), "threads": threads})
        count = len(reply["outputs"])
        self.output_names: list[str] = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
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


def calibration_files(request: CompileRequest, args: tuple[torch.Tensor, ...], scratch: Path) -> list[str]:
    """The reference inputs at the exported shape, one npz each (static int8's calibration)."""
    shapes = [tuple(a.shape) for a in args]
    names = [s.name for s in request.signature]
    samples = [
        f
        for f in request.calibration
        if all(n in f for n in names) and [tuple(np.shape(f[n])) for n in names] == shapes
    ]
    files = enumerate(samples)
    return [save_arrays(scratch / f"calibration-{i}.npz", [f[n] for n in names]) for i, f in files]


class LiteRtBackend(Backend):
    name = "litert"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        target = request.target
        args, record = device_example(request, self.name, options_of(request, LiteRtOptions).intra_op_threads)
        label = type(request.module).__qualname__
        out = request.out_dir / "model.tflite"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="litert-", dir=request.out_dir) as tmp:
            scratch = Path(tmp)
            with contextlib.redirect_stdout(sys.stderr), torch.no_grad():
                try:
                    program = torch.export.export(request.module.eval(), args)
                except EXPORT_ERRORS as err:
                    raise BackendError(describe_export_error(err, label, "a LiteRT model")) from err
                torch.export.save(program, scratch / "program.pt2")
            quantization = (target.quantization or "static") if target.precision == "int8" else ""
            calibration = calibration_files(request, args, scratch) if quantization == "static" else []
            if quantization == "static" and not calibration:
                raise BackendError(
                    "litert int8 static calibrates on reference inputs at the exported shape "
                    f"{[list(a.shape) for a in args]} and the run has none; give spec.validation a "
                    "dataset at that shape, or use quantization dynamic"
                )
            with EnvProcess(ENVIRONMENT, scratch) as env:
                reply = env.call(
                    {
                        "op": "compile",
                        "program": str(scratch / "program.pt2"),
                        "example": save_arrays(scratch / "example.npz", [a.numpy() for a in args]),
                        "calibration": calibration,
                        "precision": target.precision,
                        "quantization": quantization,
                        "out": str(out.resolve()),
                    }
                )
        record.update(reply["record"])
        return CompiledArtifact(
            backend=self.name,
            model_path=out,
            options=record,
            toolchain={**self.installed_versions(), "cpu": cpu_description()},
        )

    def load(
        self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu"
    ) -> LiteRtRunner:
        recorded = artifact.options.get("threads", "")
        count = threads or (int(recorded) if recorded.isdigit() else available_cores())
        return LiteRtRunner(artifact.model_path, artifact.options["inputOrder"].split(","), count)


BACKEND = LiteRtBackend()
