"""CUDA for the `tvm` environment's steps on GPU classes (kompile.compile_jobs.envs.tvm).

TVM 0.27 ships a library's CUDA kernels as CUDA C: its runtime compiles them with NVRTC when the
library is loaded (the `tvm_callback_cuda_compile` global, which `device` binds to the GPU's arch), and
its CUDA runtime module (libtvm_runtime_cuda.so, loaded by `import tvm` where it can be) links
libcudart.so.13 and the driver's libcuda.so.1. The environment brings CUDA 13.0's runtime, NVRTC
and CCCL headers as NVIDIA's wheels (requirements/env-tvm.in), which nothing finds by itself: this
module points TVM at them before `tvm` is imported.

Imports only the standard library and this environment's packages.
"""

from __future__ import annotations

import ctypes
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from kompile.compile_jobs.env_protocol import StepFailed


def toolkit() -> Path:
    """The CUDA 13 folder the wheels install (nvidia/cu13: include/, lib/)."""
    try:
        root = Path(str(metadata.distribution("nvidia-cuda-runtime").locate_file("nvidia/cu13")))
    except metadata.PackageNotFoundError:
        root = Path("/nonexistent")
    if not (root / "include" / "cuda_runtime.h").is_file():
        raise StepFailed(
            "the tvm environment has no CUDA 13 toolkit wheels (nvidia-cuda-runtime, -nvrtc, -cccl): "
            "rebuild it with scripts/setup-backend-env.sh tvm"
        )
    return root


def cccl_include(root: Path) -> Path:
    """CCCL's headers: the nvidia-cuda-cccl wheel's include/cccl, which is `root`'s where both wheels
    are installed in one environment, and elsewhere where the wheels sit in different folders (a
    GPU node's own CUDA runtime with CCCL carried beside it)."""
    try:
        found = Path(str(metadata.distribution("nvidia-cuda-cccl").locate_file("nvidia/cu13/include/cccl")))
    except metadata.PackageNotFoundError:
        found = root / "include" / "cccl"
    return found if found.is_dir() else root / "include" / "cccl"


def prepare() -> Path:
    """Point TVM at the wheels' CUDA before `import tvm`: CUDA_PATH and CCCL's headers for NVRTC,
    NVRTC's builtins and libcudart.so.13 loaded process-wide (their folder is on no search path,
    and libtvm_runtime_cuda.so finds libcudart by its soname), and that folder on LD_LIBRARY_PATH
    for the processes this one starts (MetaSchedule's builder and runner workers). Idempotent."""
    root = toolkit()
    os.environ["CUDA_PATH"] = str(root)
    # TVM looks for CCCL only under targets/<triple>/include; the wheel puts it at include/cccl.
    os.environ["TVM_CUDA_NVRTC_EXTRA_OPTS"] = f"-I{cccl_include(root)}"
    lib = root / "lib"
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if str(lib) not in paths:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([str(lib), *paths])
    for name in ("libnvrtc-builtins.so.13.0", "libcudart.so.13"):
        ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)
    return root


# MetaSchedule's GPU schedule rules and its check of each candidate (VerifyGPUCode) read the per-block
# limits from the target, which a bare `cuda -arch=sm_XY` leaves out. They are the same on every GPU
# CUDA 13 builds for (compute capability 7.5 and newer): 1024 threads, 48 KiB of static shared memory
# and 64 Ki registers a block, warps of 32.
BLOCK_LIMITS = {
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 49152,
    "registers_per_block": 65536,
    "thread_warp_size": 32,
}


def build_target(target: dict[str, Any]) -> dict[str, Any]:
    """The target a GPU class's library is built and tuned for: the class's `cuda -arch=sm_XY` with
    the per-block limits (the artifact and the database key record the class's target alone)."""
    return {**target, **BLOCK_LIMITS}


def runner_worker() -> None:
    """MetaSchedule's runner worker (a new process, which loads each candidate on the GPU): CUDA
    prepared and TVM's NVRTC callback bound to this GPU, as `load` does."""
    prepare()
    device()


def device() -> Any:
    """TVM's cuda device 0, or StepFailed saying why there is none (call after `prepare`)."""
    import tvm
    from tvm.base import _LOADED_LIBS

    if "tvm_runtime_cuda" not in _LOADED_LIBS:
        # `import tvm` skips its CUDA module silently where it cannot load: load it again for the reason.
        lib = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent / "libtvm_runtime_cuda.so"
        try:
            _LOADED_LIBS["tvm_runtime_cuda"] = ctypes.CDLL(str(lib), mode=ctypes.RTLD_LOCAL)
        except OSError as err:
            raise StepFailed(
                f"the TVM runtime has no cuda device here: its CUDA module does not load ({err}); "
                "run this target on a GPU node (the NVIDIA driver provides libcuda.so.1)"
            ) from err
    dev = tvm.cuda(0)
    if not dev.exist:
        raise StepFailed("the TVM runtime has no cuda device here: the driver sees no GPU")
    compile_for(dev.compute_version)
    return dev


def compile_for(compute_version: str) -> None:
    """Bind the runtime's NVRTC callback to this GPU's sm_XY. TVM's own callback asks the compiler
    library's current Target for the arch first, so a runtime-only install (TVM without its 259 MB
    libtvm_compiler.so, what loading an artifact needs) failed every CUDA library's load on an H100
    with "module 'tvm.target._ffi_api' has no attribute 'TargetCurrent'"."""
    import tvm_ffi
    from tvm.support import nvcc

    arch = "sm_" + compute_version.replace(".", "")

    def compile_cuda(code: str) -> bytes:
        return bytes(nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc"))

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)


def check_kernels(executable: Any, arch: str) -> dict[str, str]:
    """Compile the library's CUDA source with NVRTC for `arch` now, as the runtime will at load on
    the class's GPU: a kernel that would not build there fails the compile step, not the rollout.
    Needs no GPU. Returns what the artifact records."""
    from tvm.support import nvcc

    sources = [m.inspect_source("cuda") for m in _modules(executable.mod) if m.kind == "cuda"]
    if not sources:
        return {"cudaKernels": "0"}
    try:
        cubins = [nvcc.compile_cuda(src, target_format="cubin", arch=arch) for src in sources]
    except (RuntimeError, ValueError) as err:
        last = [ln for ln in str(err).splitlines() if "error" in ln.lower()][:3]
        raise StepFailed(
            f"NVRTC could not compile the model's CUDA kernels for {arch}: {'; '.join(last) or err}"
        ) from err
    return {
        "cudaKernels": str(sum(src.count('extern "C" __global__') for src in sources)),
        "cudaCubinBytes": str(sum(len(c) for c in cubins)),
    }


def _modules(mod: Any) -> list[Any]:
    found = [mod]
    for sub in mod.imports:
        found.extend(_modules(sub))
    return found
