"""CompiledModel spec: what to compile, for which hardware, how to check it and where it goes.

Every field carries a description: the CRD (and so `kubectl explain`) is generated from these.
Cross-field rules are written twice on purpose: as CEL (`x-kubernetes-validations`, enforced by the
API server) and as pydantic validators (enforced by `kompile run` without a cluster). A test keeps
both in step by feeding the same invalid manifests to each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from kompile.api.base import ApiModel
from kompile.api.spec_rollout import GitOps, Registry, Rollout, RolloutGate, SecretRef
from kompile.api.spec_targets import (
    Candidate,
    Fleet,
    Hardware,
    Resources,
    Selection,
    Target,
    Tolerances,
    Toleration,
)
from kompile.api.vocabulary import (
    NAME_MAX,
    SOURCE_URI_PATTERN,
    DetectionHead,
    DType,
    Precision,
    SourceFormat,
    TaskKind,
    _rule,
)

# The spec's parts live in topic modules; they are re-exported here, the API's one import path.
__all__ = [
    "Benchmark",
    "Candidate",
    "CompiledModelSpec",
    "DType",
    "DynamicDim",
    "Fleet",
    "GitOps",
    "Hardware",
    "InputSpec",
    "Precision",
    "Registry",
    "Resources",
    "Rollout",
    "RolloutGate",
    "SecretRef",
    "Selection",
    "Source",
    "Target",
    "Tolerances",
    "Toleration",
    "Validation",
]


class Source(ApiModel):
    """Where the trained model comes from."""

    uri: str = Field(
        description=(
            "Location of the trained model: a local path (a file or a Hugging Face model folder), "
            "file://, s3://bucket/key, an MLflow model "
            "(models:/name/version or runs:/run-id/path) or python://package.module:factory for a "
            "factory that returns an nn.Module."
        ),
        min_length=1,
        max_length=2048,
        pattern=SOURCE_URI_PATTERN,
    )
    format: SourceFormat = Field(
        default="auto",
        description=(
            "Format of the source: pt2 (torch.export archive), torchscript (.pt), onnx, mlflow, "
            "python, huggingface (a model folder: config.json beside its weights; local, in the "
            "compile image, or s3://bucket/prefix/), or auto to infer it from the URI (a folder: "
            "detected locally, on S3 by the trailing /)."
        ),
    )
    digest: str | None = Field(
        default=None,
        description=(
            "Expected sha256 of the source file as sha256:<hex>; a mismatch fails the run. For an "
            "ONNX model with external data files, the digest over the graph and those files that "
            "status.sourceDigest reports."
        ),
        pattern=r"^sha256:[0-9a-f]{64}$",
    )

    @property
    def s3_folder(self) -> bool:
        """An s3:// source naming a folder (a Hugging Face model folder): format huggingface, or a
        URI ending in /."""
        return self.uri.startswith("s3://") and (self.format == "huggingface" or self.uri.endswith("/"))


class DynamicDim(ApiModel):
    """A dimension whose size varies at run time, with the range a compiler must support."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule("self.min <= self.opt && self.opt <= self.max", "need min <= opt <= max")
            ]
        }
    }

    axis: int = Field(description="Index of the dynamic dimension in the input's shape.", ge=0, le=15)
    name: str = Field(
        description="Symbolic name; inputs that share a name share the size (for example batch).",
        min_length=1,
        max_length=NAME_MAX,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
    )
    min: int = Field(description="Smallest size the compiled model must accept.", ge=1)
    opt: int = Field(description="Size the compiler optimizes for.", ge=1)
    max: int = Field(description="Largest size the compiled model must accept.", ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> DynamicDim:
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"dynamic dim {self.name!r}: need min <= opt <= max")
        return self


INPUT_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$"
"""What an input name may hold: an identifier, or an ONNX tensor name as exporters write them
(input.1, input:0, and the bare numbers older exporters gave: 0)."""


class InputSpec(ApiModel):
    """One model input: name, element type and shape."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.dynamicDims) || self.dynamicDims.all(d, d.axis < size(self.shape) "
                    "&& self.shape[d.axis] == -1)",
                    "each dynamicDims entry must point at a -1 in shape",
                    ".dynamicDims",
                ),
                _rule(
                    "size(self.shape.filter(s, s == -1)) == "
                    "(has(self.dynamicDims) ? size(self.dynamicDims) : 0)",
                    "every -1 in shape needs its range in dynamicDims (min, opt, max)",
                    ".shape",
                ),
            ]
        }
    }

    name: str = Field(
        description="Input name as the model sees it (ONNX input name, forward() argument).",
        min_length=1,
        max_length=NAME_MAX,
        pattern=INPUT_NAME_PATTERN,
    )
    dtype: DType = Field(default="float32", description="Element type of the input tensor.")
    shape: Annotated[list[Annotated[int, Field(ge=-1)]], Field(max_length=16)] = Field(
        description=(
            "Shape of the input; -1 marks a dynamic dimension described in dynamicDims; [] a scalar "
            "(a sample rate, a temperature), the same value for every sample of a batch."
        ),
    )
    dynamic_dims: list[DynamicDim] | None = Field(
        default=None,
        max_length=16,
        description="Range of each dynamic dimension (the -1 entries of shape).",
    )
    low: float | None = Field(
        default=None,
        description="Lower bound for generated reference values (integers: token ids and such).",
    )
    high: float | None = Field(
        default=None,
        description=(
            "Upper bound (exclusive) for generated reference values. Unset: 2 for int64/int32 "
            "(ids, indices), 256 for uint8 (image bytes); floats are drawn from a standard normal. "
            "A 2-D attention_mask (or key_padding_mask) of 0/1 integers, booleans or unbounded "
            "floats gets rows right-padded as a tokenizer pads a batch."
        ),
    )

    @model_validator(mode="after")
    def _dynamic_dims_cover_shape(self) -> InputSpec:
        dims = self.dynamic_dims or []
        for d in dims:
            if d.axis >= len(self.shape) or self.shape[d.axis] != -1:
                raise ValueError(
                    f"input {self.name!r}: dynamicDims axis {d.axis} must point at a -1 in shape"
                )
        if sum(1 for s in self.shape if s == -1) != len(dims):
            raise ValueError(
                f"input {self.name!r}: every -1 in shape needs its range in dynamicDims (min, opt, max)"
            )
        return self

    def concrete_shape(self, overrides: dict[str, int] | None = None, which: str = "opt") -> list[int]:
        """The shape with each dynamic dim replaced by its min/opt/max (or an override by name)."""
        shape = list(self.shape)
        for d in self.dynamic_dims or []:
            if overrides and d.name in overrides:
                shape[d.axis] = overrides[d.name]
            else:
                shape[d.axis] = {"min": d.min, "opt": d.opt, "max": d.max}[which]
        return shape


def leading(signature: Sequence[InputSpec]) -> InputSpec:
    """The input whose axis 0 is the batch: the first that is not a scalar (a 0-d input, Silero
    VAD's sample rate, has no batch axis wherever it is listed)."""
    return next((s for s in signature if s.shape), signature[0])


def batch_dim(signature: Sequence[InputSpec]) -> str | None:
    """Name of the batch dimension: the dynamic dim on axis 0 of the leading input, if any."""
    for d in leading(signature).dynamic_dims or []:
        if d.axis == 0:
            return d.name
    return None


def batch_axis(spec: InputSpec, name: str | None) -> int | None:
    """The axis of `spec` that holds the dim named `name` (the batch: axis 1 of an RNN's state
    [layers, batch, hidden]), None where the input has no such dim."""
    return next((d.axis for d in spec.dynamic_dims or [] if name is not None and d.name == name), None)


def batch_max(signature: Sequence[InputSpec]) -> int | None:
    """The largest batch the signature declares (its batch dim's max); None without a batch dim."""
    return next((d.max for d in leading(signature).dynamic_dims or [] if d.axis == 0), None)


def static_batch(signature: Sequence[InputSpec]) -> int | None:
    """The one batch a signature without a dynamic batch dim runs at: its leading input's first dim
    (1 for a single vector or a scalar). None when the batch is dynamic."""
    if batch_dim(signature) is not None:
        return None
    shape = leading(signature).shape
    return int(shape[0]) if len(shape) >= 2 and shape[0] > 0 else 1


class Validation(ApiModel):
    """How each artifact is checked against the source model."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.labelsKey) || has(self.dataset)",
                    "labelsKey names an array of spec.validation.dataset: set dataset too",
                    ".labelsKey",
                )
            ]
        }
    }

    dataset: str | None = Field(
        default=None,
        max_length=2048,
        description=(
            "Reference inputs: an .npz file keyed by input name (path, file:// or s3://), the samples "
            "along each input's batch axis (axis 1 of an RNN state [layers, batch, hidden]). Static "
            "int8 calibrates on all but every fourth sample (the last of two or three), which the "
            "gate judges as input calibration never saw."
        ),
    )
    samples: int = Field(
        default=4, ge=1, le=1024, description="Number of generated samples when no dataset is given."
    )
    seed: int = Field(default=0, ge=0, description="Seed for generated reference inputs.")
    task: TaskKind = Field(
        default="auto",
        description="classification adds top-k agreement; detection decodes a YOLO head "
        "([batch, 4 + classes, anchors], sigmoid scores) and holds the artifact's detections to the "
        "source's (tolerances.minDetectionAgreement); auto decides from the output's shape.",
    )
    detection_head: DetectionHead = Field(
        default="yolov8",
        description="task detection: how the head is laid out. yolov8: [batch, 4 + classes, anchors] "
        "or its transpose, each class's score in [0, 1] (Ultralytics' YOLOv8, v9, v11 exports); "
        "yolov5: [batch, anchors, 5 + classes] or its transpose, an objectness column after the box "
        "and each class's score objectness x its probability (YOLOv5, YOLOv7, a YOLOX export with "
        "its decoding).",
    )
    labels_key: str | None = Field(
        default=None,
        max_length=253,
        description="Key of the dataset's integer class labels (one per sample, axis 0; class "
        "indices from 0): task accuracy of the source and of each artifact is computed on them "
        "(read from the output of class scores whose argmax the source's predictions match them on "
        "most often: a net with several heads answers them with one), and the drop is gated by "
        "tolerances.maxAccuracyDrop (default: 1 point for int8, 0.5 for fp16/bf16, 0.1 for fp32).",
    )
    tolerances: Tolerances | None = Field(
        default=None, description="Thresholds for every target; unset fields use precision defaults."
    )

    @model_validator(mode="after")
    def _labels_need_dataset(self) -> Validation:
        if self.labels_key is not None and self.dataset is None:
            raise ValueError("spec.validation.labelsKey names an array of the dataset: set dataset too")
        return self


class Benchmark(ApiModel):
    """How the artifacts and the eager source model are timed."""

    batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1],
        min_length=1,
        max_length=8,
        description="Batch sizes to time, along the dynamic dim on axis 0 of the first input. Inputs "
        "without one are timed at their own batch (the first input's leading dim) only.",
    )
    warmup: int = Field(default=3, ge=0, le=1000, description="Untimed iterations first.")
    iterations: int = Field(
        default=20,
        ge=1,
        le=10000,
        description="Timed iterations per batch size on a steady machine (in two windows of half each).",
    )
    settle_tolerance: float = Field(
        default=0.10,
        gt=0,
        le=1,
        description="A figure is stable when the medians of its last two timing windows differ by at "
        "most this share; timing goes on until every figure is, up to maxIterations. Figures that never "
        "settle are marked unstable.",
    )
    max_iterations: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description="Bound on timed iterations per batch size; default 4x iterations.",
    )
    threads: int | None = Field(
        default=None, ge=1, le=256, description="Intra-op threads for every runtime; default: all cores."
    )
    torch_compile: bool = Field(
        default=False, description="Also time torch.compile of the source model as a baseline."
    )


class CompiledModelSpec(ApiModel):
    """Desired state: compile one trained model for each target and keep the validated winners."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "(has(self.targets) && size(self.targets) > 0)"
                    " || (has(self.fleet) && self.fleet.enabled)",
                    "list spec.targets or set spec.fleet.enabled: true (one of them is needed)",
                ),
                _rule(
                    "!has(self.rollout) || !self.rollout.enabled || has(self.registry)",
                    "spec.rollout.enabled needs spec.registry (the artifact store it serves from)",
                    ".rollout",
                ),
            ]
        }
    }

    source: Source = Field(description="The trained model to compile.")
    inputs: list[InputSpec] = Field(
        min_length=1,
        max_length=32,
        description="The model's input signature, in forward() order.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    targets: list[Target] | None = Field(
        default=None,
        max_length=32,
        description="Artifacts to build. Either targets or fleet.enabled is required.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    fleet: Fleet | None = Field(default=None, description="Derive targets from the fleet's hardware.")
    validation: Validation = Field(
        default_factory=Validation, description="How artifacts are checked against the source."
    )
    benchmark: Benchmark = Field(default_factory=Benchmark, description="How artifacts are timed.")
    registry: Registry | None = Field(default=None, description="Artifact store and MLflow registry.")
    rollout: Rollout | None = Field(default=None, description="Rollout of the winner to KServe.")
    suspend: bool = Field(default=False, description="Start no new compile Jobs while true.")

    @field_validator("inputs")
    @classmethod
    def _shared_dims_agree(cls, inputs: list[InputSpec]) -> list[InputSpec]:
        # A dim name is one size in every input that has it (the batch of an RNN's tokens and of
        # its state): reference inputs, batches and profiles are built per name.
        first: dict[str, tuple[str, DynamicDim]] = {}
        for spec in inputs:
            for d in spec.dynamic_dims or []:
                seen, other = first.setdefault(d.name, (spec.name, d))
                if (other.min, other.opt, other.max) != (d.min, d.opt, d.max):
                    raise ValueError(
                        f"dim {d.name!r} is {other.min}:{other.opt}:{other.max} in input {seen!r} and "
                        f"{d.min}:{d.opt}:{d.max} in input {spec.name!r} (min:opt:max): inputs that share "
                        "a dim name share its size, so give it one range in both (or name the dims apart)"
                    )
        return inputs

    @model_validator(mode="after")
    def _targets_or_fleet(self) -> CompiledModelSpec:
        if not self.targets and not (self.fleet and self.fleet.enabled):
            raise ValueError("list spec.targets or set spec.fleet.enabled: true (one of them is needed)")
        if self.rollout and self.rollout.enabled and self.registry is None:
            raise ValueError("spec.rollout.enabled needs spec.registry (the artifact store it serves from)")
        names = [t.name for t in self.targets or []]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"spec.targets: duplicate name(s) {sorted(dup)}")
        inames = [i.name for i in self.inputs]
        idup = {n for n in inames if inames.count(n) > 1}
        if idup:
            raise ValueError(f"spec.inputs: duplicate name(s) {sorted(idup)}")
        return self
