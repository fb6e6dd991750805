"""CompiledModel spec: what to compile, for which hardware, how to check it and where it goes.

Every field carries a description: the CRD (and so `kubectl explain`) is generated from these.
Cross-field rules are written twice on purpose: as CEL (`x-kubernetes-validations`, enforced by the
API server) and as pydantic validators (enforced by `kompile run` without a cluster). A test keeps
both in step by feeding the same invalid manifests to each.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kompile.api.base import ApiModel

Backend = Literal["onnxruntime", "tensorrt", "inductor"]
# auto: the hardware class's default candidates (CPU: onnxruntime and inductor; GPU: tensorrt and
# inductor), each compiled, validated and timed; the fastest validated one is the target's result.
TargetBackend = Literal["auto", "onnxruntime", "tensorrt", "inductor"]
SelectionPolicy = Literal["minLatency", "maxThroughput"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
DType = Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"]
SourceFormat = Literal["auto", "pt2", "torchscript", "onnx", "mlflow", "python"]
Quantization = Literal["dynamic", "static"]
TaskKind = Literal["auto", "classification", "none"]
DeploymentMode = Literal["Serverless", "RawDeployment", "Standard"]

# A source URI: a local path, file://, s3://, models:/ or runs:/ (MLflow), or python://module:factory.
# A relative path may not hold a colon, so an unsupported scheme (https://) is refused.
SOURCE_URI_PATTERN = r"^(s3://|file://|models:/|runs:/|python://|/|\./|\.\./|[A-Za-z0-9_.-][^:]*$)"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX = 63


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


class Source(ApiModel):
    """Where the trained model comes from."""

    uri: str = Field(
        description=(
            "Location of the trained model: a local path, file://, s3://bucket/key, an MLflow model "
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
            "python, or auto to infer it from the URI."
        ),
    )
    digest: str | None = Field(
        default=None,
        description="Expected sha256 of the source file as sha256:<hex>; a mismatch fails the run.",
        pattern=r"^sha256:[0-9a-f]{64}$",
    )


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
        pattern=r"^[A-Za-z_][A-Za-z0-9_.:/-]*$",
    )
    dtype: DType = Field(default="float32", description="Element type of the input tensor.")
    shape: Annotated[list[Annotated[int, Field(ge=-1)]], Field(min_length=1, max_length=16)] = Field(
        description="Shape of the input; -1 marks a dynamic dimension described in dynamicDims.",
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
        description="Upper bound (exclusive) for generated reference values.",
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


class Resources(ApiModel):
    """Compute resources of the compile Job's container (Kubernetes quantities)."""

    requests: dict[str, str] | None = Field(default=None, description="Resource requests.")
    limits: dict[str, str] | None = Field(default=None, description="Resource limits.")


class Toleration(ApiModel):
    """A Kubernetes toleration for the compile Job's pod."""

    key: str | None = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for the Equal operator.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty tolerates every effect."
    )


class Hardware(ApiModel):
    """Where a target's compile Job runs: it must run on the hardware the artifact is built for."""

    node_selector: dict[str, str] | None = Field(
        default=None, description="Node labels the compile Job's pod must match."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=16, description="Tolerations added to the compile Job's pod."
    )
    resources: Resources | None = Field(default=None, description="Container resources.")
    runtime_class_name: str | None = Field(
        default=None, description="RuntimeClass of the pod (for example nvidia)."
    )


class Tolerances(ApiModel):
    """Validation thresholds. Unset fields take the defaults of the target's precision."""

    max_abs_error: float | None = Field(
        default=None, ge=0, description="Largest allowed absolute difference of any output element."
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
                )
            ]
        }
    }

    name: str | None = Field(
        default=None,
        max_length=NAME_MAX,
        pattern=DNS_LABEL_PATTERN,
        description="Candidate name, unique in the target; default <backend>-<precision>.",
    )
    backend: Backend = Field(description="Compiler that builds this candidate.")
    precision: Precision | None = Field(
        default=None, description="Precision of this candidate; default: the target's precision."
    )
    quantization: Quantization | None = Field(
        default=None, description="int8 only: dynamic (weights) or static (calibrated)."
    )
    options: dict[str, str] | None = Field(
        default=None, description="Options of this candidate's backend (see docs/backends.md)."
    )

    @model_validator(mode="after")
    def _quantization_needs_int8(self) -> Candidate:
        if self.quantization is not None and self.precision not in (None, "int8"):
            raise ValueError(
                f"candidate {self.name or self.backend!r}: quantization applies only to precision int8"
            )
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
                    "!has(self.quantization) || self.precision == 'int8'",
                    "quantization applies only to precision int8",
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
            ]
        }
    }

    name: str = Field(
        description="Target name, unique in the CompiledModel (a DNS label).",
        min_length=1,
        max_length=NAME_MAX,
        pattern=DNS_LABEL_PATTERN,
    )
    backend: TargetBackend = Field(
        default="auto",
        description=(
            "Compiler that builds the artifact, or auto: the hardware class's default candidates "
            "(CPU: onnxruntime and inductor; GPU: tensorrt and inductor) that support the precision."
        ),
    )
    precision: Precision = Field(default="fp32", description="Numeric precision of the artifact.")
    quantization: Quantization | None = Field(
        default=None,
        description="int8 only: dynamic (weights) or static (calibrated on reference inputs).",
    )
    hardware: Hardware | None = Field(
        default=None, description="Node selection and resources for this target's compile Job."
    )
    options: dict[str, str] | None = Field(
        default=None, description="Backend options (for example intraOpThreads, optLevel)."
    )
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
        if self.quantization is not None and self.precision != "int8":
            raise ValueError(
                f"target {self.name!r}: quantization applies only to precision int8 "
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
        return self


class Fleet(ApiModel):
    """Fleet discovery: one target per hardware class found among the cluster's Nodes."""

    enabled: bool = Field(default=False, description="Discover targets from the fleet's Nodes.")
    gpu_backend: TargetBackend = Field(
        default="auto", description="Backend for NVIDIA GPU classes; auto: tensorrt and inductor candidates."
    )
    cpu_backend: TargetBackend = Field(
        default="auto", description="Backend for CPU classes; auto: onnxruntime and inductor candidates."
    )
    precisions: list[Precision] = Field(
        default_factory=lambda: ["fp32"],  # type: ignore[arg-type]
        min_length=1,
        max_length=4,
        description="Precisions to build for each discovered class.",
    )
    selection: Selection | None = Field(
        default=None, description="How each fleet target's winner among candidates is chosen."
    )


class Validation(ApiModel):
    """How each artifact is checked against the source model."""

    dataset: str | None = Field(
        default=None,
        max_length=2048,
        description="Reference inputs: an .npz file keyed by input name (path, file:// or s3://).",
    )
    samples: int = Field(
        default=4, ge=1, le=1024, description="Number of generated samples when no dataset is given."
    )
    seed: int = Field(default=0, ge=0, description="Seed for generated reference inputs.")
    task: TaskKind = Field(
        default="auto",
        description="classification adds top-k agreement; auto decides from the output's shape.",
    )
    tolerances: Tolerances | None = Field(
        default=None, description="Thresholds for every target; unset fields use precision defaults."
    )


class Benchmark(ApiModel):
    """How the artifacts and the eager source model are timed."""

    batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1],
        min_length=1,
        max_length=8,
        description="Batch sizes to time (batch is the first dynamic dimension, when there is one).",
    )
    warmup: int = Field(default=3, ge=0, le=1000, description="Untimed iterations first.")
    iterations: int = Field(default=20, ge=1, le=10000, description="Timed iterations per batch size.")
    threads: int | None = Field(
        default=None, ge=1, le=256, description="Intra-op threads for every runtime; default: all cores."
    )
    torch_compile: bool = Field(
        default=False, description="Also time torch.compile of the source model as a baseline."
    )


class SecretRef(ApiModel):
    """A reference to a Secret in the CompiledModel's namespace."""

    name: str = Field(description="Name of the Secret.", min_length=1, max_length=253)


class Registry(ApiModel):
    """Where artifacts and their lineage are recorded."""

    tracking_uri: str | None = Field(
        default=None,
        max_length=2048,
        description="MLflow tracking URI; default: a local SQLite store under .kompile/.",
    )
    model_name: str | None = Field(
        default=None,
        max_length=256,
        description="Registered model name; default: the CompiledModel's name.",
    )
    artifact_store: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^(s3://|file://|/|\./|[A-Za-z0-9_.-])",
        description="Root for artifacts (s3://bucket/prefix or a local folder); default .kompile/artifacts.",
    )
    s3_endpoint: str | None = Field(
        default=None, max_length=2048, description="S3 endpoint URL for S3-compatible stores."
    )
    credentials_secret: SecretRef | None = Field(
        default=None, description="Secret holding AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and such."
    )


class RolloutGate(ApiModel):
    """What an artifact must show before it may serve."""

    require_validation: bool = Field(
        default=True, description="Only validated artifacts roll out (turning this off is refused)."
    )
    min_speedup: float | None = Field(
        default=None, ge=0, description="Smallest speedup over eager that may roll out."
    )
    max_abs_error: float | None = Field(
        default=None, ge=0, description="Largest validation error that may roll out."
    )


class GitOps(ApiModel):
    """Write InferenceService manifests for Argo CD or Flux to apply, instead of applying them."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "has(self.configMap) != has(self.directory)",
                    "set exactly one of rollout.gitops.configMap and rollout.gitops.directory",
                )
            ]
        }
    }

    config_map: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="ConfigMap (in the CompiledModel's namespace) that receives the manifests.",
    )
    directory: str | None = Field(
        default=None,
        max_length=1024,
        description="Folder the manifests are written to (kompile run, or a volume a GitOps agent syncs).",
    )

    @model_validator(mode="after")
    def _one(self) -> GitOps:
        if (self.config_map is None) == (self.directory is None):
            raise ValueError("set exactly one of rollout.gitops.configMap and rollout.gitops.directory")
        return self


class Rollout(ApiModel):
    """Serving the validated winner through KServe."""

    model_config = ApiModel.model_config | {  # type: ignore[assignment]
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _rule(
                    "!has(self.gate) || !has(self.gate.requireValidation) || self.gate.requireValidation",
                    "rollout.gate.requireValidation cannot be false: unvalidated artifacts never serve",
                    ".gate.requireValidation",
                )
            ]
        }
    }

    enabled: bool = Field(default=False, description="Roll the winner out to KServe.")
    inference_service: str | None = Field(
        default=None,
        max_length=NAME_MAX,
        pattern=DNS_LABEL_PATTERN,
        description=(
            "InferenceService name when one hardware class is served; with several, the prefix of "
            "<name>-<hardware class>. Default: the CompiledModel's name."
        ),
    )
    deployment_mode: DeploymentMode | None = Field(
        default=None, description="KServe deployment mode; default: read from the cluster."
    )
    canary_traffic_percent: int | None = Field(
        default=None, ge=0, le=100, description="Traffic to a new revision before promotion."
    )
    adopt: bool = Field(
        default=False,
        description="Adopt an existing InferenceService of that name instead of owning a new one.",
    )
    gate: RolloutGate | None = Field(default=None, description="What must hold before rollout.")
    canary_timeout_seconds: int = Field(
        default=600, ge=10, le=86400, description="A canary not Ready within this time is rolled back."
    )
    runtime: str = Field(
        default="kserve-tritonserver",
        max_length=253,
        description="KServe ServingRuntime (set explicitly: otherwise OpenVINO's runtime may claim onnx).",
    )
    gitops: GitOps | None = Field(
        default=None, description="Write manifests for a GitOps agent instead of applying them."
    )
    tensorrt_version: str | None = Field(
        default=None,
        max_length=32,
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(\.[0-9]+)?$",
        description=(
            "TensorRT version (major.minor.patch[.build]) of the runtime that serves TensorRT plans: "
            "a plan loads only on the release that built it, so targets using tensorrt are refused "
            "before any Job when the GPU compile image carries another. Default: the operator's "
            "KOMPILE_SERVING_TENSORRT_VERSION."
        ),
    )

    @model_validator(mode="after")
    def _gate(self) -> Rollout:
        if self.gate is not None and not self.gate.require_validation:
            raise ValueError(
                "rollout.gate.requireValidation cannot be false: unvalidated artifacts never serve"
            )
        return self


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
