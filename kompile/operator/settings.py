"""Operator settings, read once from the environment at start-up. Each field says what it controls."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kompile.api.catalog import CATALOG
from kompile.api.toolchain import pinned_for

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _own_namespace(env: Mapping[str, str]) -> str:
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


N = TypeVar("N", int, float)


class SettingsError(ValueError):
    """A KOMPILE_* setting the operator cannot use; the message names the variable."""


def _whole(env: Mapping[str, str], key: str, default: int) -> int:
    return _parsed(env, key, default, int, "a whole number")


def _number(env: Mapping[str, str], key: str, default: float) -> float:
    return _parsed(env, key, default, float, "a number")


def _parsed(env: Mapping[str, str], key: str, default: N, kind: Callable[[str], N], what: str) -> N:
    text = env.get(key)
    try:
        return default if text is None else kind(text)
    except ValueError:
        raise SettingsError(f"{key}: expected {what}, got {text!r}") from None


def _store(env: Mapping[str, str], default: str) -> str:
    uri = env.get("KOMPILE_ARTIFACT_STORE", default)
    if not uri.startswith(("s3://", "file://")):
        raise SettingsError(
            f"KOMPILE_ARTIFACT_STORE: {uri!r} is neither s3://bucket/prefix nor file:///path (a "
            "folder every compile Job mounts)"
        )
    return uri


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def default_backend_versions(gpu_tensorrt_version: str | None = None) -> dict[str, str]:
    """Each catalog backend's version as its compile image carries it: the lock files' pins (its own
    environment's for a backend that has one), and TensorRT's from the GPU image setting."""
    gpu: dict[str, str] = {"tensorrt": gpu_tensorrt_version} if gpu_tensorrt_version else {}
    return {name: e.version_string(pinned_for(e.environment) | gpu) for name, e in CATALOG.items()}


@dataclass(frozen=True)
class Settings:
    namespaces: list[str] = field(default_factory=list)
    """KOMPILE_NAMESPACES: namespaces to watch (comma-separated); empty watches all."""
    cpu_image: str = "ghcr.io/kompile/compile-cpu:0.1.0"
    """KOMPILE_CPU_IMAGE: compile image for CPU backends; one multi-arch tag (amd64 and arm64)."""
    gpu_image: str = "ghcr.io/kompile/compile-gpu:0.1.0"
    """KOMPILE_GPU_IMAGE: compile image for GPU backends (tensorrt, inductor on CUDA)."""
    env_images: dict[str, str] = field(
        default_factory=lambda: {
            e.environment: f"ghcr.io/kompile/compile-{e.environment}:0.1.0"
            for e in CATALOG.values()
            if e.environment
        }
    )
    """KOMPILE_ENV_IMAGES: compile image per own environment (name=image pairs, comma-separated;
    given ones replace the defaults `ghcr.io/kompile/compile-<name>:0.1.0`, the Dockerfile's
    compile-<name> stage): a CPU target whose candidates include a backend with its own environment
    (litert) runs there; that image is the CPU one plus the environment (KOMPILE_ENV_<NAME>). A key
    may name several environments joined by `+` (sorted: `iree+tvm`), for the targets whose
    candidates need exactly those."""
    envs_image: str = "ghcr.io/kompile/compile-envs:0.1.0"
    """KOMPILE_ENVS_IMAGE: compile image for a CPU target whose candidates need several own
    environments and KOMPILE_ENV_IMAGES names none for that set: the Dockerfile's compile-envs stage,
    the CPU image plus every environment."""
    image_pull_policy: str = "IfNotPresent"
    """KOMPILE_IMAGE_PULL_POLICY."""
    artifact_store: str = "file:///var/lib/kompile/artifacts"
    """KOMPILE_ARTIFACT_STORE: default store root when a CompiledModel names none."""
    s3_endpoint: str | None = None
    """KOMPILE_S3_ENDPOINT: S3 endpoint URL for S3-compatible stores."""
    store_secret: str | None = None
    """KOMPILE_STORE_SECRET: Secret (in the CompiledModel's namespace) with store credentials, when
    the CompiledModel names none."""
    tracking_uri: str | None = None
    """MLFLOW_TRACKING_URI: default MLflow tracking URI."""
    allowed_endpoints: list[str] = field(default_factory=list)
    """KOMPILE_ALLOWED_ENDPOINTS: hosts (host or host:port, comma-separated) a CompiledModel may name
    as spec.registry.s3Endpoint or trackingUri besides the operator's own; empty: only its own. The
    operator's credentials never go to them (kompile.operator.tenancy)."""
    allowed_secrets: list[str] = field(default_factory=list)
    """KOMPILE_ALLOWED_SECRETS: Secret names a CompiledModel may name as credentialsSecret (the
    chart's credentialsSecret and credentialsSecrets); empty: any Secret of its namespace."""
    backend_versions: dict[str, str] = field(default_factory=default_backend_versions)
    """Versions of the backends the compile images carry, a part of the cache key: by default the
    catalog's (kompile.api.toolchain's pins, TensorRT from KOMPILE_GPU_TENSORRT_VERSION);
    KOMPILE_BACKEND_VERSIONS (backend=version pairs) overrides them, for images built otherwise."""
    job_deadline_seconds: int = 3600
    """KOMPILE_JOB_DEADLINE_SECONDS: activeDeadlineSeconds of a compile Job."""
    progress_sweep_seconds: int = 3600
    """KOMPILE_PROGRESS_SWEEP_SECONDS: how often a namespace's progress notes are looked through for
    ones no Job writes any more (untouched for twice the Job deadline; kompile.operator.progress_sweep)."""
    job_backoff_limit: int = 2
    """KOMPILE_JOB_BACKOFF_LIMIT: retries of a crashed compile pod (the only retry policy)."""
    job_ttl_seconds: int = 86400
    """KOMPILE_JOB_TTL_SECONDS: ttlSecondsAfterFinished; results are read long before."""
    scratch_size: str = "20Gi"
    """KOMPILE_SCRATCH_SIZE: sizeLimit of the compile pod's writable scratch volume."""
    runtime_class_gpu: str | None = None
    """KOMPILE_GPU_RUNTIME_CLASS: runtimeClassName for GPU compile pods (for example nvidia)."""
    health_port: int = 8080
    """KOMPILE_HEALTH_PORT: liveness endpoint port (/healthz)."""
    metrics_port: int = 9090
    """KOMPILE_METRICS_PORT: Prometheus metrics port (/metrics)."""
    kserve_namespace: str = "kserve"
    """KOMPILE_KSERVE_NAMESPACE: where KServe's inferenceservice-config ConfigMap lives."""
    resync_seconds: float = 10.0
    """KOMPILE_RESYNC_SECONDS: how soon a CompiledModel with work in flight (Jobs running, a result
    awaited, a registration or rollout under way) is looked at again; a settled one is not."""
    call_timeout_seconds: float = 10.0
    """KOMPILE_CALL_TIMEOUT_SECONDS: how long one call to MLflow or the artifact store may take (two
    tries each); after a failure the endpoint is left alone for a backoff of 5 s doubling to 120 s.
    MLFLOW_HTTP_REQUEST_TIMEOUT and KOMPILE_STORE_TIMEOUT_SECONDS, when set, win."""
    workers: int = 4
    """KOMPILE_WORKERS: reconcile worker threads (one CompiledModel is never reconciled by two)."""
    lease_name: str = "kompile"
    """KOMPILE_LEASE_NAME: the coordination.k8s.io Lease that elects the one active operator (the
    chart sets its release's full name, kompile for a release called kompile); empty disables
    leader election (one replica only)."""
    lease_namespace: str = field(default_factory=lambda: _own_namespace({}))
    """KOMPILE_LEASE_NAMESPACE: the Lease's namespace; default the pod's own (POD_NAMESPACE, else
    the service account's namespace file), else default."""
    lease_duration_seconds: float = 15.0
    """KOMPILE_LEASE_DURATION_SECONDS: how long a Lease not renewed holds; a standby takes over
    within about this long after the leader dies."""
    gpu_tensorrt_version: str | None = None
    """KOMPILE_GPU_TENSORRT_VERSION: TensorRT version the GPU compile image carries (major.minor.
    patch[.build], `python3 -c 'import tensorrt; print(tensorrt.__version__)'` in the image). A plan
    loads only on that version: tensorrt targets whose serving version differs are refused."""
    serving_tensorrt_version: str | None = None
    """KOMPILE_SERVING_TENSORRT_VERSION: TensorRT version of the Triton runtime that serves, when a
    CompiledModel names none (spec.rollout.tensorrtVersion); unset: whatever the compile image has."""
    gpu_envs_image: str = "ghcr.io/kompile/compile-gpu-envs:0.1.0"
    """KOMPILE_GPU_ENVS_IMAGE: compile image for a GPU target whose candidates include a backend with
    its own environment (iree, tvm, xla on cuda): the Dockerfile's compile-gpu-envs stage, the GPU
    image plus those environments."""
    triton_runtime_version: str | None = None
    """KOMPILE_TRITON_RUNTIME_VERSION: Triton release for TensorRT InferenceServices (runtimeVersion,
    for example 25.10-py3) where kompile.operator.tensorrt_match's table has no row for the version."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if env is None else env)
        d = cls()
        versions = default_backend_versions(e.get("KOMPILE_GPU_TENSORRT_VERSION") or None)
        env_images = dict(d.env_images)
        for pair in _csv(e.get("KOMPILE_ENV_IMAGES")):
            name, _, image = pair.partition("=")
            env_images[name.strip()] = image.strip()
        for pair in _csv(e.get("KOMPILE_BACKEND_VERSIONS")):
            name, _, version = pair.partition("=")
            versions[name.strip()] = version.strip()
        return cls(
            namespaces=_csv(e.get("KOMPILE_NAMESPACES")),
            cpu_image=e.get("KOMPILE_CPU_IMAGE", d.cpu_image),
            gpu_image=e.get("KOMPILE_GPU_IMAGE", d.gpu_image),
            env_images=env_images,
            envs_image=e.get("KOMPILE_ENVS_IMAGE") or d.envs_image,
            gpu_envs_image=e.get("KOMPILE_GPU_ENVS_IMAGE") or d.gpu_envs_image,
            image_pull_policy=e.get("KOMPILE_IMAGE_PULL_POLICY", d.image_pull_policy),
            artifact_store=_store(e, d.artifact_store),
            s3_endpoint=e.get("KOMPILE_S3_ENDPOINT") or None,
            store_secret=e.get("KOMPILE_STORE_SECRET") or None,
            tracking_uri=e.get("MLFLOW_TRACKING_URI") or None,
            allowed_endpoints=_csv(e.get("KOMPILE_ALLOWED_ENDPOINTS")),
            allowed_secrets=_csv(e.get("KOMPILE_ALLOWED_SECRETS")),
            backend_versions=versions,
            job_deadline_seconds=_whole(e, "KOMPILE_JOB_DEADLINE_SECONDS", d.job_deadline_seconds),
            progress_sweep_seconds=_whole(e, "KOMPILE_PROGRESS_SWEEP_SECONDS", d.progress_sweep_seconds),
            job_backoff_limit=_whole(e, "KOMPILE_JOB_BACKOFF_LIMIT", d.job_backoff_limit),
            job_ttl_seconds=_whole(e, "KOMPILE_JOB_TTL_SECONDS", d.job_ttl_seconds),
            scratch_size=e.get("KOMPILE_SCRATCH_SIZE", d.scratch_size),
            runtime_class_gpu=e.get("KOMPILE_GPU_RUNTIME_CLASS") or None,
            health_port=_whole(e, "KOMPILE_HEALTH_PORT", d.health_port),
            metrics_port=_whole(e, "KOMPILE_METRICS_PORT", d.metrics_port),
            kserve_namespace=e.get("KOMPILE_KSERVE_NAMESPACE", d.kserve_namespace),
            resync_seconds=_number(e, "KOMPILE_RESYNC_SECONDS", d.resync_seconds),
            call_timeout_seconds=_number(e, "KOMPILE_CALL_TIMEOUT_SECONDS", d.call_timeout_seconds),
            workers=max(1, _whole(e, "KOMPILE_WORKERS", d.workers)),
            lease_name=e.get("KOMPILE_LEASE_NAME", d.lease_name),
            lease_namespace=e.get("KOMPILE_LEASE_NAMESPACE") or _own_namespace(e),
            lease_duration_seconds=_number(e, "KOMPILE_LEASE_DURATION_SECONDS", d.lease_duration_seconds),
            gpu_tensorrt_version=e.get("KOMPILE_GPU_TENSORRT_VERSION") or None,
            serving_tensorrt_version=e.get("KOMPILE_SERVING_TENSORRT_VERSION") or None,
            triton_runtime_version=e.get("KOMPILE_TRITON_RUNTIME_VERSION") or None,
        )
