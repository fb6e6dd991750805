"""Catalog entry: IREE (MLIR) `.vmfb` modules for CPUs and NVIDIA GPUs (compile_jobs/backends/iree.py),
imported from the ONNX export and compiled for `llvm-cpu` or `cuda` in the backend's own environment
(requirements/env-iree.txt: iree-base-compiler, iree-base-runtime and onnx, no torch)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count


class IreeOptions(BackendOptions):
    """IREE options."""

    case_sensitive: ClassVar[frozenset[str]] = frozenset({"extraFlags"})

    flags: Literal["tuned", "default"] = Field(
        default="tuned",
        description="Compile flags: tuned (what measured faster on CPUs: data tiling, convolutions as "
        "im2col + matmul) or default (IREE's own defaults, only the CPU named). On cuda both are IREE's "
        "defaults with the GPU's target: no flag has been measured on a GPU yet.",
    )
    target_cpu: Literal["class", "host"] = Field(
        default="class",
        description="The CPU the code is generated for: class (the hardware class's ISA, runs on every "
        "node of the class) or host (the compiling node's own CPU, LLVM's `host`). CPU classes only.",
    )
    extra_flags: str = Field(
        default="",
        description="Space-separated iree-compile flags added after the chosen set (experts): each must "
        "start with --iree-; flags that write files are refused.",
    )
    intra_op_threads: Count = Field(
        default=0,
        description="Worker threads of IREE's task executor at validation and timing; 0: the run's, else "
        "all cores.",
    )


ENTRY = BackendEntry(
    name="iree",
    summary="IREE 3.13: the ONNX export imported to MLIR and compiled into a .vmfb module run by the "
    "IREE runtime; fp32, at a static shape (the signature's opt). On CPU classes llvm-cpu (local-task), "
    "CPU and flags by the class's ISA (option flags: tuned or default); on NVIDIA GPU classes cuda, "
    "PTX for the newest CUDA target IREE 3.13 knows at or below the GPU's compute capability (sm_89 "
    "for Hopper), compiled by the driver at load. Runs in its own environment "
    "(scripts/setup-backend-env.sh iree). Not served: Triton has no IREE backend.",
    devices=("cpu", "cuda"),
    precisions=frozenset({"fp32"}),
    consumes="onnx",
    options=IreeOptions,
    extra="torch",
    version_from=("iree-base-compiler", "iree-base-runtime", "onnx"),
    serving=None,
    environment="iree",
)
