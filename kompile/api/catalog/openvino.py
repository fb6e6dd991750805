"""Catalog entry: OpenVINO on CPUs (kompile/compile_jobs/backends/openvino.py)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from kompile.api.catalog.base import BackendEntry, BackendOptions, Count, Flag, Serving


class OpenVinoOptions(BackendOptions):
    """OpenVINO options."""

    case_sensitive: ClassVar[frozenset[str]] = frozenset({"ignoredTypes"})

    performance_hint: Literal["latency", "throughput"] = Field(
        default="latency", description="OpenVINO's PERFORMANCE_HINT: one request at a time, or many."
    )
    intra_op_threads: Count = Field(
        default=0, description="INFERENCE_NUM_THREADS; 0: the run's threads, else every core."
    )
    model_type: Literal["auto", "transformer", "none"] = Field(
        default="auto",
        description="int8: NNCF's transformer-aware quantization; auto: NNCF's defaults first (the "
        "fastest int8), transformer mode as the first remedy when a transformer's int8 fails validation.",
    )
    preset: Literal["auto", "performance", "mixed"] = Field(
        default="auto",
        description="int8: symmetric (performance) or asymmetric activations (mixed); auto: mixed for "
        "transformers, performance otherwise.",
    )
    fast_bias_correction: Flag = Field(
        default=True, description="int8: NNCF's fast bias correction (the slow one is more exact)."
    )
    ignored_types: str = Field(
        default="", description="int8: comma-separated OpenVINO op types NNCF keeps in float."
    )
    keep_float: Literal["none", "sensitive"] = Field(
        default="none",
        description="int8: sensitive keeps in float the first and last MatMuls, attention's "
        "softmax-times-values product and every MatMul that feeds a LayerNorm through its residual Add.",
    )
    accuracy_control: Flag = Field(
        default=False,
        description="int8: NNCF's quantization with accuracy control: each quantized layer's effect "
        "on the gate's verdict (cosine, top-k, under task detection the detections) is measured and "
        "the most harmful go back to float until a fifth of the gate's room is left.",
    )
    float_precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="int8: the precision the layers left in float run at; bf16 makes a mixed "
        "int8/bf16 artifact (CPUs with AVX-512 BF16 or AMX only); auto: bf16 where the CPU has it "
        "(OpenVINO's own default there), else fp32; fp32 under accuracyControl, which measures there.",
    )
    activation_group_size: Literal["auto", "off", "16", "32", "64", "128", "256"] = Field(
        default="auto",
        description="int8 weights only (quantization dynamic): OpenVINO's DYNAMIC_QUANTIZATION_GROUP_SIZE, "
        "how many activation values share one int8 scale when the CPU quantizes activations on the "
        "fly for its int8 weights; larger groups run faster and lose more accuracy; off: activations "
        "stay in float; auto: OpenVINO's default for the CPU.",
    )

    @model_validator(mode="after")
    def _measured_precision(self) -> OpenVinoOptions:
        # NNCF's accuracy control compiles its checks at f32: a bf16 artifact would ship float
        # layers it never measured (NudeNet on AVX-512 BF16: one detection added at bf16).
        if self.accuracy_control and self.float_precision == "bf16":
            raise ValueError(
                "accuracyControl with floatPrecision bf16: accuracy control measures each layer at fp32 "
                "(NNCF compiles its checks so), and a bf16 artifact would ship what it did not measure; "
                "leave floatPrecision auto (fp32 under accuracy control) or set fp32"
            )
        return self

    def floats(self, fast_bf16: bool) -> Literal["fp32", "bf16"]:
        """The precision an int8 artifact's float layers run at: floatPrecision, auto resolved (bf16
        where the CPU has it fast, fp32 under accuracy control, which measures at fp32)."""
        if self.float_precision != "auto":
            return self.float_precision
        return "bf16" if fast_bf16 and not self.accuracy_control else "fp32"


ENTRY = BackendEntry(
    name="openvino",
    summary="OpenVINO IR for CPUs: fp32, bf16 (where the CPU has it), NNCF int8 post-training quantization "
    "(static; dynamic: int8 weights only).",
    devices=("cpu",),
    precisions=frozenset({"fp32", "bf16", "int8"}),
    consumes="onnx",
    options=OpenVinoOptions,
    extra="openvino",
    version_from=("openvino", "nncf"),
    # Triton's OpenVINO backend (config.pbtxt `backend: "openvino"`, no platform) reads model.xml and
    # model.bin; KServe's kserve-tritonserver runtime takes it as modelFormat triton (a repository).
    serving=Serving(
        kserve_format="triton",
        triton_platform=None,
        files=("model.xml", "model.bin"),
        triton_backend="openvino",
    ),
    auto_on=("cpu",),
    auto_rank=15,
)
