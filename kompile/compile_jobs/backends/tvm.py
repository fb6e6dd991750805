"""Apache TVM backend for CPUs and NVIDIA GPUs: the pipeline's fp32 ONNX export through TVM's Relax
ONNX frontend in the backend's own environment (requirements/env-tvm.txt: apache-tvm 0.27, no
torch), MetaSchedule tuning against the hardware class's shared tuning database, a shared library
loaded back with the Relax VM.

Steps, each recorded in the artifact's options:
- the target from the class's CPU features (kompile.compile_jobs.envs.tvm_target: `llvm -mcpu=`
  the ISA's LLVM CPU, `-num-cores=` the run's threads);
- the class's tuning database (kompile.compile_jobs.tvm_database, keyed by class, TVM version and
  target) merged from the store into the local shared folder, a private copy handed to the
  environment as the request's `state`;
- the fp32 ONNX export fixed at the signature's static (opt) shape and folded by ONNX Runtime's basic
  (standard-op) rewrites (`graphFolding`): the exporter's shape arithmetic becomes constants, which
  TVM's ONNX frontend needs (BERT-base's attention mask otherwise fails to import:
  `ConstantOfShape` of an empty shape, `Expand` to a shape holding -1);
- in the environment (kompile.compile_jobs.envs.tvm): import at that static shape, the plain 2-D
  convolutions and the ops between them in NCHW{lanes}c, the ISA's fp32 vector width
  (`activationLayout: blocked`), the weights marked layout-free (`weightLayout: prepacked`), the 3x3
  stride-1 convolutions also built as Winograd F(4x4, 3x3) (`winograd: auto`), tuning
  of the tasks the database lacks (every task, from the database's best, with `tuningScope: all`)
  within `tuningTrials` and `tuningMinutes` (the blocked convolutions first offered register-blocked
  schedules, kompile.compile_jobs.envs.tvm_templates; a first round by each task's FLOPs, the rest by
  its measured time in the model), each kernel's `tuningVerify` best records re-measured on this node
  and the fastest kept (kompile.compile_jobs.envs.tvm_verify; with `tuningInModel`, off by default,
  the fastest few of those compared in the model instead: kompile.compile_jobs.envs.tvm_inmodel),
  each 3x3 shape kept direct or Winograd by its time in the model (`winogradMeasured`;
  kompile.compile_jobs.envs.tvm_winograd_pick), the database's schedules applied and their weight
  rewrites folded into the constants, the tuned residual kernels written into their residual where
  nothing reads it after (`residualInPlace`), build and export of `model.so`; the artifact records
  how many tasks came from the shared database (`tuningDatabaseHitRate`) and the tuning's time;
- the copy merged back into the shared folder and the store (union with what others pushed);
- `load` starts the environment's process with the Relax VM on the run's threads: validation runs the
  `.so` that ships, and the benchmark times each call in that process (its own measure, the pipe's
  round trip left out; TVM's spinning thread pool stays in that process).

On a GPU class (`device: cuda`, the node's compute capability from torch): the target `cuda
-arch=sm_XY`, tuned as above against the GPU class's own shared database (each candidate measured on
the GPU, so only on the class's node), TVM's default DLight schedules for what the database lacks, the
kernels checked by NVRTC at compile and compiled by TVM's runtime at load on the GPU
(kompile.compile_jobs.envs.tvm_cuda).

A missing environment fails the candidate with reason EnvironmentMissing (what to run to build it).
Not rolled out: Triton has no TVM backend (the catalog's serving is None).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx

from kompile.api.catalog.tvm import TvmOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    node_gpu,
    options_of,
)
from kompile.compile_jobs.backends.executorch import static_example
from kompile.compile_jobs.backends.onnxruntime import optimize_and_save
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.env_backend import EnvRunner, compile_in_environment
from kompile.compile_jobs.envs import PROTOBUF_LIMIT, fix_input_dims
from kompile.compile_jobs.envs.tvm_target import target_for, target_string
from kompile.compile_jobs.export import names_for_outputs
from kompile.compile_jobs.hardware import (
    _cpuinfo,
    cpu_description,
    local_arch,
    local_cpu_class,
    local_cuda_capability,
    local_cuda_class,
)
from kompile.compile_jobs.tvm_database import shared_database

ENVIRONMENT = "tvm"
# The features the target derives from (tvm_target.mcpu_for), passed to the environment.
TARGET_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "asimddp")


class TvmRunner(EnvRunner):
    """A TVM shared library run by the Relax VM in the environment's process (the environments'
    file protocol)."""

    environment = ENVIRONMENT

    def __init__(
        self,
        path: Path,
        input_names: list[str],
        threads: int,
        outputs: int,
        shapes: list[tuple[int, ...]],
        device: str = "cpu",
    ) -> None:
        super().__init__(path, input_names, threads, load={"device": device})
        # The Relax VM knows its outputs only after a call: the count recorded at compile names them.
        self.output_names = names_for_outputs(outputs)
        self.shapes = shapes

    def check_feed(self, feeds: Feeds) -> None:
        got = [tuple(np.shape(feeds[n])) for n in self.input_names]
        if got != self.shapes:
            raise BackendError(
                f"the .so was built at the static shapes {self.shapes} and runs only those, not {got}"
            )


def folded_program(src: Path, shapes: list[tuple[int, ...]], scratch: Path, threads: int) -> Path:
    """The ONNX export with its inputs fixed at `shapes` and ONNX Runtime's basic graph rewrites
    applied (constant folding, which folds the shape arithmetic of a static graph, and redundant
    node elimination; standard ONNX ops only). TVM's Relax frontend imports what the exporter's
    dynamic-shape patterns would stop: an `Expand` to a computed shape holding -1, a
    `ConstantOfShape` of an empty shape (both in BERT-base's attention mask)."""
    model = onnx.load(str(src))
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != len(shapes):
        raise BackendError(f"the ONNX export has {len(inputs)} inputs, the signature {len(shapes)}")
    try:
        fix_input_dims(model, {inp.name: shape for inp, shape in zip(inputs, shapes, strict=True)})
    except ValueError as err:
        raise BackendError(f"the ONNX export does not take the signature's shapes: {err}") from err
    static, folded = scratch / "static.onnx", scratch / "folded.onnx"
    onnx.save_model(model, str(static), save_as_external_data=model.ByteSize() > PROTOBUF_LIMIT)
    optimize_and_save(static, folded, "basic", threads, [])
    return folded


def class_options(cores: int) -> dict[str, str]:
    """What the step needs to know of the class: its architecture, CPU features and cores."""
    flags = _cpuinfo()[1]
    return {
        "arch": local_arch(),
        "cpuFeatures": ",".join(f for f in TARGET_FLAGS if f in flags),
        "cores": str(cores),
    }


class TvmBackend(Backend):
    name = "tvm"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        opts = options_of(request, TvmOptions)
        threads = opts.intra_op_threads or request.threads or available_cores()
        args, record = static_example(request)
        record.update(
            inputDtypes=",".join(s.dtype for s in request.signature),
            threads=str(threads),
            staticShapes=json.dumps([list(a.shape) for a in args]),
        )
        wire = {**opts.record(), **class_options(threads)}
        if request.device == "cuda":
            capability = node_gpu(self.name, local_cuda_capability())
            wire.update(device="cuda", computeCapability=f"{capability[0]}.{capability[1]}")
            record.update(tvmDevice="cuda", computeCapability=wire["computeCapability"])
        try:
            target = target_string(target_for(wire))
        except ValueError as err:
            raise BackendError(str(err)) from err
        versions = self.installed_versions()
        out = request.out_dir / "model.so"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        # A GPU class tunes only on its own node (MetaSchedule measures on the GPU): without the GPU
        # here (its probe stood in, building for another node) no database is touched.
        hw_class = local_cuda_class() if request.device == "cuda" else local_cpu_class()
        database = (
            shared_database(hw_class, versions.get("apache-tvm", "unknown"), target) if hw_class else None
        )
        pulled = database.pull() if database else 0
        with tempfile.TemporaryDirectory(prefix="tvm-", dir=request.out_dir) as tmp:
            scratch = Path(tmp)
            state = database.checkout(scratch / "database") if database else None
            program = folded_program(request.onnx(), [tuple(a.shape) for a in args], scratch, threads)
            record["graphFolding"] = "onnxruntime-basic"
            try:
                reply = compile_in_environment(
                    ENVIRONMENT,
                    scratch,
                    args,
                    out,
                    request.target.precision,
                    program=program,
                    options=wire,
                    state=state,
                    progress=request.progress,
                )
            finally:
                # MetaSchedule commits each measurement as it is taken: what the tuning measured is
                # shared even when the build after it fails (or the step is stopped mid-tuning).
                added = database.checkin(state) if database and state else None
            if database and added is not None:
                record.update(
                    tuningDatabase=database.rel,
                    tuningRecordsShared=str(added),
                    tuningRecordsPulled=str(pulled),
                )
        record.update(reply)
        if not out.is_file():
            raise BackendError(f"the tvm environment reported success but wrote no {out.name}")
        return CompiledArtifact(
            backend=self.name,
            model_path=out,
            options=record,
            toolchain={**versions, "cpu": cpu_description()},
        )

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> TvmRunner:
        recorded = artifact.options.get("threads", "")
        count = threads or (int(recorded) if recorded.isdigit() else available_cores())
        outputs = int(artifact.options.get("outputCount", "1"))
        shapes = [tuple(a) for a in json.loads(artifact.options["staticShapes"])]
        return TvmRunner(
            artifact.model_path,
            artifact.options["inputOrder"].split(","),
            count,
            outputs,
            shapes,
            artifact.options.get("tvmDevice", "cpu"),
        )


BACKEND = TvmBackend()
