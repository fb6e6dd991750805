"""Catalog entry: TensorRT engines for NVIDIA GPU classes (compile_jobs/backends/tensorrt.py)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count, Flag, Serving

DEFAULT_PROFILE_SPLIT = 16
"""A dynamic dim whose max/min ratio exceeds this gets a second optimization profile (trt.profiles)."""


class TensorRTOptions(BackendOptions):
    """TensorRT options."""

    case_sensitive: ClassVar[frozenset[str]] = frozenset({"excludeOps", "timingCacheDir"})

    workspace_mi_b: Count = Field(
        default=4096, ge=1, alias="workspaceMiB", description="Builder workspace limit in MiB."
    )
    opt_level: Literal["0", "1", "2", "3", "4", "5"] = Field(
        default="3", description="builder_optimization_level."
    )
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] = Field(
        default="none", description="Build a plan that runs on other GPUs too (slower)."
    )
    version_compatible: Flag = Field(
        default=False, description="Build a plan later TensorRT releases can load (lean runtime)."
    )
    profile_split: Count = Field(
        default=DEFAULT_PROFILE_SPLIT,
        description="A dynamic range wider than this ratio gets a second profile; 0: one profile.",
    )
    high_precision: Literal["fp16", "fp32"] = Field(
        default="fp16", description="int8: precision of the layers left unquantized."
    )
    calibration_method: Literal["entropy", "max"] = Field(
        default="entropy", description="int8 calibration of activation ranges."
    )
    exclude_ops: str = Field(
        default="", description="Comma-separated op types kept at fp32 by AutoCast or quantization."
    )
    cpu_validation: Flag = Field(
        default=True, description="Check the prepared graph on CPU before any GPU build."
    )
    cuda_graphs: Flag = Field(default=False, description="Triton's CUDA graphs for this model.")
    timing_cache_dir: str = Field(
        default="", description="Timing cache folder; default: $KOMPILE_TIMING_CACHE_DIR."
    )


ENTRY = BackendEntry(
    name="tensorrt",
    summary="TensorRT engines for NVIDIA GPUs; graphs prepared per precision by ModelOpt, checked on CPU.",
    devices=("cuda",),
    precisions=frozenset({"fp32", "fp16", "bf16", "int8"}),
    consumes="onnx",
    options=TensorRTOptions,
    extra="tensorrt",
    # TensorRT itself comes with the compile-gpu image (settings.gpu_tensorrt_version); ModelOpt
    # prepares the graph it builds from.
    version_from=("tensorrt", "nvidia-modelopt"),
    serving=Serving(kserve_format="tensorrt", triton_platform="tensorrt_plan", files=("model.plan",)),
    auto_on=("cuda",),
    auto_rank=10,
)
