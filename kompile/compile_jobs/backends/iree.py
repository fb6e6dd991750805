"""IREE backend for CPUs and NVIDIA GPUs: the pipeline's fp32 ONNX export, imported to MLIR by IREE's
ONNX importer and compiled by `iree-compile` for `llvm-cpu` (CPU classes) or `cuda` (GPU classes)
into a `.vmfb` module, in the backend's own environment (requirements/env-iree.txt: no torch there,
the ONNX export is all it takes).

Steps, each recorded in the artifact's options:
- the ONNX export with every dynamic dimension fixed at the signature's opt size: IREE compiles
  dynamic dimensions, but its CPU code generation picks tile sizes and data-tiled layouts from
  static shapes; the options say `exportedStatic` with the shape, and status says the artifact runs
  only there;
- the CPU code is generated for: the hardware class's ISA (an LLVM CPU level and features, so
  the module runs on every node of the class) or, with option targetCpu host, the compiling node's
  CPU; IREE's default (a generic x86-64 without AVX) ran ResNet-50 several times slower;
- the flag set (option flags): `tuned` adds what measured faster (data tiling, im2col convolutions
  into those data-tiled matmuls; docs/backends.md has the figures), `default` is IREE's own
  defaults; `extraFlags` come last. The whole command line is recorded in `compileFlags`;
- on a GPU class: `--iree-hal-target-device=cuda` and `--iree-cuda-target=` the newest CUDA target
  IREE 3.13 knows at or below the GPU's compute capability (`cudaTarget`; it has no sm_90 or
  sm_100: "missing GPU target", iree-org/iree#22147): IREE embeds PTX, which the driver compiles
  for the GPU at load, so an H100 runs sm_89's PTX. No flag set is measured on a GPU yet: `flags`
  changes nothing there;
- `load` starts the environment's process with the IREE runtime (`local-task`, the run's thread
  count as its worker count; `cuda` on a GPU class, `halDevice`): validation runs the `.vmfb` that
  ships, and the benchmark times each call in that process.

A missing environment fails the candidate with reason EnvironmentMissing, a crashed one with
EnvironmentFailed and its stderr tail. Not served by KServe: Triton has no IREE backend.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from kompile.api.catalog.iree import IreeOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    node_gpu,
    options_of,
)
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.env_backend import EnvRunner, built_in_environment, compile_in_environment
from kompile.compile_jobs.hardware import local_cpu_class, local_cuda_capability

Array = np.ndarray[Any, Any]
ENVIRONMENT = "iree"
CPU = "--iree-llvmcpu-target-cpu="
FEATURES = "--iree-llvmcpu-target-cpu-features="
# LLVM CPU levels and features by the class's ISA (kompile.compile_jobs.hardware.cpu_isa): what
# every CPU of that class has, no more (LLVM's own tuning of each level kept: dropping x86-64-v4's
# prefer-256-bit gave -9% in one run and +2% in the next).
CLASS_TARGETS: dict[str, tuple[str, str]] = {
    # No AMX features: IREE's x86 microkernels have AVX2, AVX-512, VNNI and BF16 variants and none for
    # AMX tiles, so AMX machines get the BF16 ones (measured on a Xeon with AMX: LLVM's `host`, AMX
    # on, ran ResNet-50 and BERT-base no faster; docs/backends.md, "iree").
    "amx": ("x86-64-v4", "+avx512vnni,+avx512bf16"),
    "avx512bf16": ("x86-64-v4", "+avx512vnni,+avx512bf16"),
    "avx512vnni": ("x86-64-v4", "+avx512vnni"),
    "avx512": ("x86-64-v4", ""),
    "avxvnni": ("x86-64-v3", "+avxvnni"),
    "avx2": ("x86-64-v3", ""),
    "sse": ("x86-64-v2", ""),
    "dotprod": ("generic", "+neon,+dotprod"),
    "neon": ("generic", "+neon"),
}
# What measured faster on top of IREE's defaults (docs/backends.md, "iree"): data tiling (packed
# matmul layouts) and convolutions as im2col + matmul so they share those kernels. Not O3: it
# failed BERT-base's LayerNorm ("exceeded stack allocation limit"); not ukernels=all: -10% to +19%
# across three runs, no steady gain.
TUNED = ("--iree-opt-data-tiling", "--iree-global-opt-use-im2col-for-convs")
# An expert's extra flags: iree-compile options only, none that writes or reads a file.
_EXTRA = re.compile(r"--iree-[a-z0-9-]+(=[A-Za-z0-9_.,+=-]*)?")
# A flag is refused where a word of its name says it touches files (--iree-hal-dump-executable-files-to);
# whole words, since "dir" is also the start of "direct" (--iree-codegen-llvmgpu-use-direct-convolution).
_FILE_FLAG = re.compile(
    r"(?:^|-)(?:dump|output|export|save|paths?|files?|dirs?|directory|import|link|linker|plugins?|tools?)(?:-|$)",
    re.IGNORECASE,
)


# The CUDA targets IREE 3.13 has GPU details for (`--iree-cuda-target=sm_90` and sm_100 to sm_110
# fail "missing GPU target in #hal.executable.target"; measured with iree-compile 3.13.0).
CUDA_TARGETS: tuple[tuple[int, int], ...] = (
    (12, 1), (12, 0), (8, 9), (8, 7), (8, 6), (8, 0), (7, 5), (7, 2), (7, 0), (6, 1), (6, 0),
)  # fmt: skip


def cuda_target(capability: tuple[int, int]) -> str:
    """The newest CUDA target IREE knows at or below the GPU's compute capability: its PTX runs on
    the GPU (the driver compiles PTX forward, never back)."""
    for known in CUDA_TARGETS:
        if known <= capability:
            return f"sm_{known[0]}{known[1]}"
    raise BackendError(
        f"IREE 3.13 generates CUDA code for compute capability 6.0 and newer, not "
        f"{capability[0]}.{capability[1]}: build this target for cpu or with another backend"
    )


def class_isa(hardware_class: str) -> str:
    """The ISA part of a CPU class name (cpu-amd64-avx512vnni -> avx512vnni)."""
    return hardware_class.rsplit("-", 1)[-1]


def target_flags(isa: str, target_cpu: str) -> list[str]:
    """The llvm-cpu target: the class's ISA as an LLVM CPU level and features, or the host's."""
    if target_cpu == "host":
        return [CPU + "host"]
    if isa not in CLASS_TARGETS:
        raise BackendError(f"iree knows no LLVM CPU for ISA {isa!r}; set option targetCpu host")
    cpu, features = CLASS_TARGETS[isa]
    return [CPU + cpu] + ([FEATURES + features] if features else [])


def extra_flags(text: str) -> list[str]:
    """The option extraFlags as a list; BackendError naming a flag it refuses."""
    flags = text.split()
    for flag in flags:
        if not _EXTRA.fullmatch(flag):
            raise BackendError(
                f"option extraFlags: {flag!r} is not an iree-compile flag (--iree-name or --iree-name=value)"
            )
        if _FILE_FLAG.search(flag.split("=", 1)[0]):
            raise BackendError(
                f"option extraFlags: {flag!r} reads or writes files, which a compile Job refuses"
            )
    return flags


def compile_flags(opts: IreeOptions, isa: str) -> list[str]:
    chosen = list(TUNED) if opts.flags == "tuned" else []
    return target_flags(isa, opts.target_cpu) + chosen + extra_flags(opts.extra_flags)


def cuda_flags(opts: IreeOptions, target: str) -> list[str]:
    """The cuda device and its target; IREE's defaults otherwise (TUNED was measured on CPUs only)."""
    return ["--iree-hal-target-device=cuda", f"--iree-cuda-target={target}", *extra_flags(opts.extra_flags)]


class IreeRunner(EnvRunner):
    """A `.vmfb` module run by the IREE runtime in the iree environment's process (the same load and
    run requests as LiteRT's), at the static shapes it was compiled for."""

    environment = ENVIRONMENT

    def __init__(
        self,
        path: Path,
        input_names: list[str],
        shapes: dict[str, list[int]],
        threads: int,
        hal_device: str = "local-task",
    ) -> None:
        self.shapes = shapes
        super().__init__(path, input_names, threads, load={"device": hal_device})

    def check_feed(self, feeds: Feeds) -> None:
        got = {n: list(np.shape(feeds[n])) for n in self.input_names}
        if got != self.shapes:
            raise BackendError(
                f"the .vmfb was compiled at the static shapes {self.shapes} and runs only those, not {got}"
            )


class IreeBackend(Backend):
    name = "iree"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        opts = options_of(request, IreeOptions)
        device: dict[str, str]
        if request.device == "cuda":
            capability = node_gpu(self.name, local_cuda_capability())
            target = cuda_target(capability)
            flags = cuda_flags(opts, target)
            device = {
                # What was applied: the CPU flag sets are not, whatever the option says.
                "flags": "default",
                "halDevice": "cuda",
                "computeCapability": f"{capability[0]}.{capability[1]}",
                "cudaTarget": target,
            }
        else:
            isa = class_isa(local_cpu_class())
            flags = compile_flags(opts, isa)
            device = {
                "flags": opts.flags,
                "halDevice": "local-task",
                "targetCpu": opts.target_cpu,
                "isa": isa,
            }
        signature = request.signature
        shapes = {s.name: [int(d) for d in s.concrete_shape()] for s in signature}
        threads = opts.intra_op_threads or request.threads or available_cores()
        record = {
            "precision": request.target.precision,
            "inputOrder": ",".join(s.name for s in signature),
            "staticShapes": json.dumps(shapes, separators=(",", ":")),
            **device,
            "compileFlags": " ".join(flags),
            "threads": str(threads),
        }
        if any(s.dynamic_dims for s in signature):
            record["exportedStatic"] = ";".join(f"{n}={shape}" for n, shape in shapes.items())
        out = request.out_dir / "model.vmfb"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        reply = compile_in_environment(
            ENVIRONMENT,
            request.out_dir,
            None,
            out,
            request.target.precision,
            program=request.onnx(),
            options={**opts.record(), **record},
        )
        return built_in_environment(self, out, record | reply)

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> IreeRunner:
        """A runner with `threads` workers, else the compile's recorded count."""
        options = artifact.options
        shapes: dict[str, list[int]] = json.loads(options["staticShapes"])
        count = threads or int(options["threads"])
        hal = options.get("halDevice", "local-task")
        return IreeRunner(artifact.model_path, options["inputOrder"].split(","), shapes, count, hal)


BACKEND = IreeBackend()
