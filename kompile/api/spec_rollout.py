"""Where artifacts go and how the winner serves: the registry and artifact store, the rollout gate,
GitOps output and the KServe rollout."""

from __future__ import annotations

from pydantic import Field, model_validator

from kompile.api.base import ApiModel
from kompile.api.vocabulary import DNS_LABEL_PATTERN, NAME_MAX, DeploymentMode, _rule


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
        # MLflow refuses '/' and ':' (only at registration, after every compile); the name is also
        # a path segment of the store's latest/<namespace>/<modelName>/: no '\\', '.' or '..'.
        pattern=r"^[^/:\\]*[^/:\\.][^/:\\]*$",
        description=(
            "Registered model name, also the folder of the artifact store's latest/ pointers: no '/', "
            "':' or '\\', not only dots; default: the CompiledModel's name."
        ),
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
