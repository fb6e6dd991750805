"""XLA backend for CPUs and NVIDIA GPUs: the source module through `torch.export` here, then torchax
(torch -> StableHLO through JAX) and `jax.export` in the backend's own environment
(requirements/env-xla.txt: torchax 0.0.13 imports only with torch 2.9, the project has 2.15), run by
JAX's XLA CPU runtime, or on a GPU class exported for the cuda platform and run by JAX's CUDA plugin
(`xlaDevice`, the node's `computeCapability`; BackendUnavailable without a GPU).

How the model reaches the environment: a `torch.export.save` file, as litert's does. torch 2.9
loads the project's torch 2.15 files (checked on the small CNN, ResNet-50 and BERT-base: same
outputs, cosine 1.0 against eager), so the program needs neither ONNX (and an ONNX -> torch
converter, a less kept path) nor the source module's code in the environment. Should a newer torch
write a file 2.9 cannot read, the environment's step fails saying so, naming the file.

Steps, each recorded in the artifact's options:
- `torch.export` at a static shape in the pipeline's process: the signature's opt size for each
  dynamic dimension, as litert does (jax.export can take symbolic dimensions; this backend leaves
  them for later: one shape keeps XLA's compile at load to one); the options say `exportedStatic`
  with the shape, and status says the artifact runs only there;
- in the environment (kompile.compile_jobs.envs.xla): decomposition to the ATen ops torchax lowers,
  lowering to JAX with the weights baked in as constants, `jax.export` serialization (`model.xla`:
  StableHLO in jax.export's flatbuffer, portable across CPUs);
- `load` starts the environment's process: XLA compiles the module there for the host's CPU (its
  own ISA: no flags to choose by class), on the run's cores; validation runs the file that ships,
  and the benchmark times each call in that process.

A missing environment fails the candidate with reason EnvironmentMissing (what to run to build
it), a crashed one with EnvironmentFailed and its stderr tail. No server runs jax.export artifacts
(Triton has no JAX backend): never rolled out.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from kompile.api.catalog.xla import XlaOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    CompiledArtifact,
    CompileRequest,
    node_gpu,
    options_of,
)
from kompile.compile_jobs.backends.executorch import device_example
from kompile.compile_jobs.env_backend import (
    EnvRunner,
    built_in_environment,
    compile_in_environment,
    load_in_environment,
    save_program,
)
from kompile.compile_jobs.hardware import local_cuda_capability

ENVIRONMENT = "xla"


class XlaBackend(Backend):
    name = "xla"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        args, record = device_example(request, self.name, options_of(request, XlaOptions).intra_op_threads)
        record["xlaDevice"] = request.device
        if request.device == "cuda":
            capability = node_gpu(self.name, local_cuda_capability())
            record["computeCapability"] = f"{capability[0]}.{capability[1]}"
        out = request.out_dir / "model.xla"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="xla-", dir=request.out_dir) as tmp:
            scratch = Path(tmp)
            save_program(request, args, scratch / "program.pt2", "an XLA module")
            record.update(
                compile_in_environment(
                    ENVIRONMENT,
                    scratch,
                    args,
                    out,
                    request.target.precision,
                    options={"device": request.device},
                )
            )
        return built_in_environment(self, out, record)

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> EnvRunner:
        return load_in_environment(
            artifact, threads, ENVIRONMENT, load={"device": artifact.options.get("xlaDevice", "cpu")}
        )


BACKEND = XlaBackend()
