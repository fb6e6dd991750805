"""Catalog entry: ONNX Runtime on CPUs (kompile/compile_jobs/backends/onnxruntime.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count, Flag, Serving

# ONNX Runtime's transformer optimizer model types (onnxruntime.transformers.optimizer.MODEL_TYPES
# of the pinned release; a test holds the two equal).
OrtModelType = Literal[
    "auto", "none", "bart", "bert", "bert_keras", "bert_tf", "clip", "conformer", "gpt2", "gpt2_tf",
    "gpt_neox", "mmdit", "phi", "qwen3", "sam2", "swin", "t5", "tnlr", "unet", "vae", "vit",
]  # fmt: skip


class OnnxRuntimeOptions(BackendOptions):
    """ONNX Runtime options (defaults measured on a 2-core AVX2 node; see the backend's module)."""

    opt_level: Literal["extended", "all", "basic"] = Field(
        default="extended", description="Graph optimization level the saved model is optimized at."
    )
    model_type: OrtModelType = Field(
        default="auto",
        description="Transformer fusion model type; auto: detected from the graph, none: no fusion.",
    )
    num_heads: Count = Field(default=0, description="Attention heads for fusion; 0: read from the graph.")
    hidden_size: Count = Field(default=0, description="Hidden size for fusion; 0: read from the graph.")
    attention_mask: Literal["raw", "index"] = Field(
        default="raw", description="index: faster only for right-padded batches."
    )
    skip_layer_norm: Flag = Field(
        default=False, description="Fuse Add + LayerNormalization (slower on CPU, measured)."
    )
    gelu_approximation: Literal["auto", "true", "false"] = Field(
        default="auto", description="tanh GELU; auto: for int8 builds only."
    )
    per_channel: Literal["auto", "true", "false"] = Field(
        default="auto", description="Per-channel weight scales; auto: static true, dynamic false."
    )
    reduce_range: Literal["auto", "true", "false"] = Field(
        default="auto",
        description="7-bit weights; auto: static int8 on an x86 CPU without VNNI (its int8 kernels "
        "saturate on 8-bit weights), else 8-bit.",
    )
    quant_format: Literal["qdq", "qoperator"] = Field(
        default="qdq", description="Static quantization format; dynamic is always QOperator."
    )
    activation_type: Literal["uint8", "int8"] = Field(
        default="uint8", description="Static quantization activations; int8 means symmetric."
    )
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        default="minmax", description="How static quantization calibrates activation ranges."
    )
    keep_float: Literal["none", "tail", "sensitive"] = Field(
        default="none",
        description="Static int8: tail keeps in float the output's float tail (the ops after the "
        "last layers, a detector's box and class decoding); sensitive keeps it and the first and "
        "last layers, the attention output products and each layer that feeds a LayerNorm through "
        "its residual Add.",
    )
    intra_op_threads: Count = Field(
        default=0, description="Intra-op threads; 0: the run's threads, else every core."
    )
    inter_op_threads: Count = Field(default=1, description="Inter-op threads.")


ENTRY = BackendEntry(
    name="onnxruntime",
    summary="ONNX Runtime on CPUs: fp32 graph optimizations, int8 dynamic or static quantization.",
    devices=("cpu",),
    precisions=frozenset({"fp32", "int8"}),
    consumes="onnx",
    options=OnnxRuntimeOptions,
    extra="onnxruntime",
    version_from=("onnxruntime",),
    serving=Serving(kserve_format="onnx", triton_platform="onnxruntime_onnx", files=("model.onnx",)),
    auto_on=("cpu",),
    auto_rank=10,
)
