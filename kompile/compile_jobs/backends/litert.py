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
    options_of,
)
from kompile.compile_jobs.backends.executorch import device_example
from kompile.compile_jobs.env_backend import (
    EnvRunner,
    built_in_environment,
    compile_in_environment,
    load_in_environment,
    save_arrays,
    save_program,
)

Array = np.ndarray[Any, Any]
ENVIRONMENT = "litert"


class LiteRtRunner(EnvRunner):
    """A `.tflite` model run by the LiteRT interpreter in the environment's process."""

    environment = ENVIRONMENT


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
        out = request.out_dir / "model.tflite"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="litert-", dir=request.out_dir) as tmp:
            scratch = Path(tmp)
            save_program(request, args, scratch / "program.pt2", "a LiteRT model")
            quantization = (target.quantization or "static") if target.precision == "int8" else ""
            calibration = calibration_files(request, args, scratch) if quantization == "static" else []
            if quantization == "static" and not calibration:
                raise BackendError(
                    "litert int8 static calibrates on reference inputs at the exported shape "
                    f"{[list(a.shape) for a in args]} and the run has none; give spec.validation a "
                    "dataset at that shape, or use quantization dynamic"
                )
            reply = compile_in_environment(
                ENVIRONMENT, scratch, args, out, target.precision, quantization, calibration
            )
        record.update(reply)
        return built_in_environment(self, out, record)

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> EnvRunner:
        return load_in_environment(artifact, threads, ENVIRONMENT, LiteRtRunner)


BACKEND = LiteRtBackend()
