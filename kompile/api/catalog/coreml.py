"""Catalog entry: Core ML `.mlpackage` exports for Apple devices (compile_jobs/backends/coreml.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions


class CoreMlOptions(BackendOptions):
    """Core ML options."""

    compute_units: Literal["all", "cpu_only", "cpu_and_gpu", "cpu_and_ne"] = Field(
        default="all",
        description="The compute units the package asks Core ML for on the device (the Neural Engine "
        "with all).",
    )


ENTRY = BackendEntry(
    name="coreml",
    summary="torch.export + coremltools: a Core ML .mlpackage (ML program) per precision for Apple "
    "devices, fp32 or fp16. Export only: recorded as Exported, never validated, selected or served.",
    devices=("cpu",),
    precisions=frozenset({"fp32", "fp16"}),
    consumes="torch",
    options=CoreMlOptions,
    extra="coreml",
    version_from=("coremltools", "torch"),
    serving=None,
    for_devices=True,
    # Core ML predicts only on macOS: a class whose nodes carry kubernetes.io/os=darwin could run
    # the package and validate it like any other; the Linux classes kompile compiles on cannot.
    exported_note="not validated: no Core ML runtime on this class",
)
