"""Catalog entry: LiteRT `.tflite` models for CPUs of devices (compile_jobs/backends/litert.py), built
and run in the backend's own environment (requirements/env-litert.txt: litert-torch 0.10 needs
torch < 2.15)."""

from __future__ import annotations

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count


class LiteRtOptions(BackendOptions):
    """LiteRT options."""

    intra_op_threads: Count = Field(
        default=0,
        description="Threads of the LiteRT interpreter (XNNPACK delegate) at validation and timing; 0: "
        "the run's, else all cores.",
    )


ENTRY = BackendEntry(
    name="litert",
    summary="litert-torch + the LiteRT interpreter with XNNPACK: a .tflite model for CPUs of devices; fp32, "
    "int8 (ai-edge-quantizer; static: full-integer, int8 inputs and outputs, calibrated on the "
    "reference inputs; dynamic: int8 weights, activations quantized at run time). Converted at a "
    "static shape (the signature's opt). Runs in its own environment (scripts/setup-backend-env.sh "
    "litert). Not served by KServe: devices fetch it from the store.",
    devices=("cpu",),
    precisions=frozenset({"fp32", "int8"}),
    consumes="torch",
    options=LiteRtOptions,
    extra="torch",
    version_from=("litert-torch", "ai-edge-litert", "ai-edge-quantizer", "torch"),
    serving=None,
    for_devices=True,
    environment="litert",
    # In auto on arm64 edge classes (the runtime their devices run), as issue 15 asks; not on
    # x86-64 ones, where its int8 ResNet-50 matched ONNX Runtime's int8 static (12.3 vs 12.5 ms),
    # nor on a class KServe serves (a device-only artifact must not win there).
    auto_on=("cpu",),
    auto_rank=31,
    auto_arches=("arm64",),
    auto_arches_why="auto offers it on arm64 CPU classes only: on x86-64 its int8 ran within noise of "
    "ONNX Runtime int8 static (ResNet-50 batch 1: 12.3 vs 12.5 ms); name it in candidates to build it here",
)
