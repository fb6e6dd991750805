"""What to build and where: targets, their candidates and selection, the hardware a compile Job runs
on, validation thresholds, and fleet discovery."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kompile.api.base import ApiModel
from kompile.api.catalog import (
    BackendName,
    OptionsError,
    TargetBackendName,
    auto_summary,
    check_options,
)
from kompile.api.catalog.cel import option_rules
from kompile.api.vocabulary import (
    DNS_LABEL_PATTERN,
    LABEL_KEY_MAX,
    LABEL_VALUE_MAX,
    NAME_MAX,
    QUANTITY_PATTERN,
    Precision,
    Quantization,
    SelectionPolicy,
    TargetPrecision,
    _rule,
)

# Backend options travel as a map of strings; each backend's typed model (kompile.api.catalog)
# decides which keys and values it takes. Bounded so the API server can cost the CEL rules.
Options = dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=1024)]]
_OPTIONS_MAX = 32
_OPTIONS_HELP = (
    "Options of the backend, a map of strings; each backend's keys and values are listed in "
    "docs/reference.md (Backend options). An unknown key or a bad value is refused."
)


_AUTO_HELP = f"CPU: {auto_summary('cpu')}; GPU: {auto_summary('cuda')}"


def _check_options(owner: str, backend: str, options: dict[str, str] | None) -> None:
    try:
        check_options(backend, options)
    except OptionsError as err:
        raise ValueError(f"{owner}: {err}") from None


# A quantity is an integer or a string such as 500m or 4Gi (x-kubernetes-int-or-string in the CRD).
Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(max_length=64, pattern=QUANTITY_PATTERN)],
    Field(description="A Kubernetes quantity: 2, 500m, 4Gi."),
]
ResourceList = dict[Annotated[str, Field(max_length=LABEL_KEY_MAX)], Quantity]  # cpu, nvidia.com/gpu
LabelKey = Annotated[str, Field(max_length=LABEL_KEY_MAX)]
LabelMap = dict[LabelKey, Annotated[str, Field(max_length=LABEL_VALUE_MAX)]]


class Resources(ApiModel):
    """Compute resources of the compile Job's container (Kubernetes quantities)."""

    requests: ResourceList | None = Field(
        default=None, max_length=16, description="Resource requests, name -> quantity (cpu: 500m)."
    )
    limits: ResourceList | None = Field(
        default=None, max_length=16, description="Resource limits, name -> quantity (memory: 16Gi)."
    )


class Toleration(ApiModel):
    """A Kubernetes toleration for the compile Job's pod."""

    key: str | None = Field(
        default=None, max_length=LABEL_KEY_MAX, description="Taint key the toleration applies to."
    )
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(
        default=None, max_length=LABEL_VALUE_MAX, description="Taint value for the Equal operator."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty tolerates every effect."
    )


class Hardware(ApiModel):
    """Where a target's compile Job runs: it must run on the hardware the artifact is built for."""

    node_selector: LabelMap | None = Field(
        default=None, max_length=32, description="Node labels the compile Job's pod must match."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=16, description="Tolerations added to the compile Job's pod."
    )
    resources: Resources | None = Field(
        default=None,
        description="Container resources of the compile Job, merged over the defaults (requests cpu "
        "1, memory 4Gi; limits memory 16Gi; one nvidia.com/gpu for a GPU target). Memory: at least "
        "3.5x the model's size; 6x keeps every candidate loaded for the benchmark.",
    )
    runtime_class_name: str | None = Field(
        default=None, max_length=253, description="RuntimeClass of the pod (for example nvidia)."
    )


class Tolerances(ApiModel):
    """Validation thresholds. Unset fields take the defaults of the target's precision."""

    max_abs_error: float | None = Field(
        default=None,
        ge=0,
        description="Largest allowed absolute difference of any output element. Set alone, it "
        "replaces maxScaledError's default: the limit is then this value whatever the output's size.",
    )
    max_scaled_error: float | None = Field(
        default=None,
        ge=0,
        description="Largest allowed absolute difference of any output element per unit of the "
        "output's scale, max(1, its largest |value| in the source's outputs): rounding error grows "
        "with the values, so logits near 20 may move 20 times as far as values within 1. Default: "
        "1e-3 at fp32, 5e-2 at fp16, 0.2 at bf16, unset at int8.",
    )
    max_rel_error: float | None = Field(
        default=None, ge=0, description="Largest allowed relative difference (|a-b| / (|b| + eps))."
    )
    min_cosine: float | None = Field(
        default=None, ge=-1, le=1, description="Smallest allowed cosine similarity per output."
    )
    min_top_k_agreement: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest share of samples whose top-k classes match (classifier outputs).",
    )
    top_k: int | None = Field(default=None, ge=1, le=100, description="k for top-k agreement.")
    max_accuracy_drop: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="With labelled reference data (spec.validation.labelsKey): the largest allowed drop "
        "of task accuracy from the source model's, in percentage points.",
    )
    min_detection_agreement: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="spec.validation.task detection: the smallest allowed share of detections the "
        "artifact and the source agree on, found / (the source's confident detections + the "
        "artifact's extra ones). Default: 1.0 at fp32, 0.98 at fp16 and bf16, 0.95 at int8.",
    )
    detection_score: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="spec.validation.task detection: the class score a detection needs (the "
        "threshold the model is deployed at). Default 0.25.",
    )
    detection_margin: float | None = Field(
        default=None,
        ge=0,
        lt=0.5,
        description="spec.validation.task detection: scores within this of detectionScore are "
        "borderline (at most half of it): a detection must be found where the source scores it "
        "above detectionScore + margin, at any score above detectionScore - margin. Default 0.05.",
    )


class Candidate(ApiModel):
    """One way to build a target: a backend at a precision with options. Compiled, validated and
    timed beside the target's other candidates."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.quantization) || !has(self.precision) || self.precision == 'int8'",
                    "quantization applies only to precision int8",
                    ".quantization",
                ),
                *option_rules(auto=False),
            ]
        }
    }

    name: str | None = Field(
        default=None,
        max_length=NAME_MAX,
        pattern=DNS_LABEL_PATTERN,
        description="Candidate name, unique in the target; default <backend>-<precision>.",
    )
    backend: BackendName = Field(description="Compiler that builds this candidate.")
    precision: Precision | None = Field(
        default=None, description="Precision of this candidate; default: the target's precision."
    )
    quantization: Quantization | None = Field(
        default=None, description="int8 only: dynamic (weights) or static (calibrated)."
    )
    options: Options | None = Field(default=None, max_length=_OPTIONS_MAX, description=_OPTIONS_HELP)

    @model_validator(mode="after")
    def _quantization_needs_int8(self) -> Candidate:
        if self.quantization is not None and self.precision not in (None, "int8"):
            raise ValueError(
                f"candidate {self.name or self.backend!r}: quantization applies only to precision int8"
            )
        _check_options(f"candidate {self.name or self.backend!r}", self.backend, self.options)
        return self


class Selection(ApiModel):
    """How the winner among a target's candidates is chosen (only validated candidates compete)."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "self.policy != 'maxThroughput' || has(self.latencyBudgetMs)",
                    "policy maxThroughput needs latencyBudgetMs",
                    ".latencyBudgetMs",
                )
            ]
        }
    }

    policy: SelectionPolicy = Field(
        default="minLatency",
        description=(
            "minLatency: lowest median latency at batchSize. maxThroughput: highest throughput at "
            "any timed batch size whose p90 latency stays within latencyBudgetMs."
        ),
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="minLatency: batch size compared (timed even if not in benchmark.batchSizes); "
        "default: the first of benchmark.batchSizes.",
    )
    latency_budget_ms: float | None = Field(
        default=None, gt=0, description="maxThroughput: the p90 latency a batch size must stay within."
    )
    time_budget_seconds: int = Field(
        default=600,
        ge=1,
        le=86400,
        description="Bound on the time spent building and validating the target's candidates (the "
        "precision ladder and int8 remedies included): once spent, candidates not yet started are "
        "skipped with reason BudgetSpent.",
    )
    remedies: bool = Field(
        default=True,
        description="When a generated int8 candidate (backend or precision auto) fails validation, try "
        "its backend's remedies in order (per-channel weights, calibrated static QDQ, sensitive layers "
        "kept in float, mixed int8/bf16), each a candidate of its own, and keep the first that passes. "
        "An explicit candidates list is built as written.",
    )

    @model_validator(mode="after")
    def _budget(self) -> Selection:
        if self.policy == "maxThroughput" and self.latency_budget_ms is None:
            raise ValueError("selection policy maxThroughput needs latencyBudgetMs")
        return self


class Target(ApiModel):
    """One compiled artifact to produce: a backend at a precision, for one class of hardware."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.quantization) || self.precision == 'int8' || self.precision == 'auto'",
                    "quantization applies only to precision int8 (or auto, for its int8 rung)",
                    ".quantization",
                ),
                _rule(
                    "!has(self.candidates) || self.backend == 'auto'",
                    "with candidates, set backend to auto (or leave it unset): each candidate names "
                    "its own backend",
                    ".backend",
                ),
                _rule(
                    "!has(self.candidates) || self.candidates.all(c, !has(c.name) || "
                    "self.candidates.exists_one(d, has(d.name) && d.name == c.name))",
                    "candidate names must be unique in a target",
                    ".candidates",
                ),
                *option_rules(auto=True),
            ]
        }
    }

    name: str = Field(
        description="Target name, unique in the CompiledModel (a DNS label).",
        min_length=1,
        max_length=NAME_MAX,
        pattern=DNS_LABEL_PATTERN,
    )
    backend: TargetBackendName = Field(
        default="auto",
        description=(
            "Compiler that builds the artifact, or auto: the hardware class's default candidates "
            f"({_AUTO_HELP}) that support the precision."
        ),
    )
    precision: TargetPrecision = Field(
        default="fp32",
        description="Numeric precision of the artifact; auto: the fastest candidate of any precision "
        "that passes this target's tolerances, tried int8 (with its remedies), bf16, fp16, then fp32, "
        "stopping at the first precision that passes.",
    )
    quantization: Quantization | None = Field(
        default=None,
        description="int8 only: dynamic (weights) or static (calibrated on reference inputs).",
    )
    hardware: Hardware | None = Field(
        default=None, description="Node selection and resources for this target's compile Job."
    )
    options: Options | None = Field(default=None, max_length=_OPTIONS_MAX, description=_OPTIONS_HELP)
    tolerances: Tolerances | None = Field(
        default=None, description="Validation thresholds for this target; override spec.validation."
    )
    candidates: list[Candidate] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description=(
            "Ways to build this target, each compiled, validated and timed; the fastest validated "
            "one (per selection) is the target's artifact. Needs backend auto."
        ),
    )
    selection: Selection | None = Field(
        default=None, description="How the winner among candidates is chosen; default minLatency."
    )

    @model_validator(mode="after")
    def _quantization_needs_int8(self) -> Target:
        if self.quantization is not None and self.precision not in ("int8", "auto"):
            raise ValueError(
                f"target {self.name!r}: quantization applies only to precision int8 (or auto) "
                f"(precision is {self.precision})"
            )
        if self.candidates and self.backend != "auto":
            raise ValueError(
                f"target {self.name!r}: with candidates, set backend to auto (or leave it unset): "
                "each candidate names its own backend"
            )
        names = [c.name for c in self.candidates or [] if c.name]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"target {self.name!r}: candidate names must be unique, repeated: {dup}")
        _check_options(f"target {self.name!r}", self.backend, self.options)
        return self


class Fleet(ApiModel):
    """Fleet discovery: one target per hardware class found among the cluster's Nodes."""

    enabled: bool = Field(default=False, description="Discover targets from the fleet's Nodes.")
    gpu_backend: TargetBackendName = Field(
        default="auto",
        description=f"Backend for NVIDIA GPU classes; auto: {auto_summary('cuda')}.",
    )
    cpu_backend: TargetBackendName = Field(
        default="auto",
        description=f"Backend for CPU classes; auto: {auto_summary('cpu')}.",
    )
    precisions: list[TargetPrecision] = Field(
        default_factory=lambda: ["fp32"],  # type: ignore[arg-type]
        min_length=1,
        max_length=5,
        description="Precisions to build for each discovered class (auto: the fastest that passes).",
    )
    selection: Selection | None = Field(
        default=None, description="How each fleet target's winner among candidates is chosen."
    )
    resources: Resources | None = Field(
        default=None,
        description="Container resources of every fleet compile Job, merged over the defaults "
        "(requests cpu 1, memory 4Gi; limits memory 16Gi; one nvidia.com/gpu on GPU classes). "
        "Memory: at least 3.5x the model's size; 6x keeps every candidate loaded for the benchmark.",
    )
