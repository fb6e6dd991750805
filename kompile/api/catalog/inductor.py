"""Catalog entry: AOTInductor packages for CPUs and NVIDIA GPUs (compile_jobs/backends/inductor.py)."""

from __future__ import annotations

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count, Flag, Serving


class InductorOptions(BackendOptions):
    """AOTInductor options."""

    max_autotune: Flag = Field(
        default=False, description="Benchmark kernel choices at compile time (a much slower build)."
    )
    freezing: Flag = Field(
        default=True, description="Constant-fold weights and prepack them for oneDNN on the CPU."
    )
    cuda_graphs: Flag = Field(
        default=False, description="cuda only: the runner captures a CUDA graph per input shape."
    )
    intra_op_threads: Count = Field(
        default=0, description="cpu: OpenMP threads baked into the kernels; 0: the run's, else all cores."
    )
    dynamic_threads: Flag = Field(
        default=False, description="cpu: read the thread count at run time instead."
    )


ENTRY = BackendEntry(
    name="inductor",
    summary="torch.export + AOTInductor: a .pt2 package for CPUs (C++/OpenMP) or CUDA (Triton kernels).",
    devices=("cpu", "cuda"),
    precisions=frozenset({"fp32", "bf16", "fp16"}),
    consumes="torch",
    options=InductorOptions,
    extra="inductor",
    version_from=("torch",),
    # Triton's PyTorch backend serves AOTInductor packages (platform torch_aoti, libtorch of the
    # torch that built them); KServe's TorchServe runtime would claim `pytorch` without the
    # explicit kserve-tritonserver runtime.
    serving=Serving(
        kserve_format="pytorch", triton_platform="torch_aoti", files=("model.pt2",), triton_backend="pytorch"
    ),
    auto_on=("cpu", "cuda"),
    auto_rank=20,
)
