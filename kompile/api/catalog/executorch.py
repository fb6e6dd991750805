"""Catalog entry: ExecuTorch `.pte` programs for CPUs of devices (compile_jobs/backends/executorch.py)."""

from __future__ import annotations

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count, Flag


class ExecuTorchOptions(BackendOptions):
    """ExecuTorch options."""

    intra_op_threads: Count = Field(
        default=0,
        description="Threads of XNNPACK's pool at validation and timing; 0: the run's, else all cores.",
    )
    per_channel: Flag = Field(
        default=True, description="int8: one weight scale per output channel (per tensor otherwise)."
    )


ENTRY = BackendEntry(
    name="executorch",
    summary="torch.export + ExecuTorch with the XNNPACK delegate: a .pte program for CPUs of devices; fp32, "
    "int8 (PT2E with the XNNPACK quantizer; static: calibrated on the reference inputs, dynamic: "
    "activations quantized at run time). Not served by KServe: devices fetch it from the store.",
    devices=("cpu",),
    precisions=frozenset({"fp32", "int8"}),
    consumes="torch",
    options=ExecuTorchOptions,
    extra="executorch",
    version_from=("executorch", "torch", "torchao"),
    serving=None,
    for_devices=True,
    # On x86-64 its int8 is within noise of ONNX Runtime int8 static (ResNet-50 batch 1: 11.9 vs
    # 12.5 ms), not worth a compile per class; on arm64 edge classes it is the runtime devices use.
    auto_on=("cpu",),
    auto_rank=30,
    auto_arches=("arm64",),
    auto_arches_why="auto offers it on arm64 CPU classes only: on x86-64 its int8 ran within noise of "
    "ONNX Runtime int8 static (ResNet-50 batch 1: 11.9 vs 12.5 ms); name it in candidates to build it here",
)
