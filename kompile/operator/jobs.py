"""Compile Job manifests. Pure: (CompiledModel, resolved target, settings) in, a Job dict out.

Retry policy: the Job's backoffLimit retries crashed pods; a podFailurePolicy fails the Job at once
on exit code 2 (bad input) and 137 (OOM-killed at the container's limit): a retry cannot help. The
operator never re-creates a failed Job for the same generation, so the two never multiply.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from kompile.api.cache import prefix_root
from kompile.api.candidates import backends_of
from kompile.api.catalog import CATALOG
from kompile.api.job_contract import TIMING_CACHES, ExitCode, JobDeadline, JobSpec
from kompile.api.resource import API_VERSION, KIND, CompiledModel
from kompile.operator.settings import Settings
from kompile.operator.targets import ResolvedTarget

LABEL_NAME = "kompile.dev/compiledmodel"
LABEL_UID = "kompile.dev/uid"
LABEL_GENERATION = "kompile.dev/generation"
LABEL_TARGET = "kompile.dev/target"
LABEL_CLASS = "kompile.dev/hardware-class"
ANNOTATION_CACHE_KEY = "kompile.dev/cache-key"
ANNOTATION_PREFIX = "kompile.dev/artifact-prefix"
ANNOTATION_IMAGE_SETTING = "kompile.dev/image-setting"
CONTAINER = "compile"
SCRATCH = "/scratch"
RUN_AS = 65532


def job_name(cm_name: str, uid: str, generation: int, target: str) -> str:
    """Deterministic, so a restarted operator finds (409) rather than duplicates its Jobs."""
    digest = hashlib.sha256(f"{uid}/{generation}/{target}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]", "-", f"{cm_name}-{target}".lower())[:52].strip("-")
    return f"{stem}-{digest}"


def label_value(text: str) -> str:
    """A string made safe for a label value (63 characters, alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")


def owner_reference(cm: CompiledModel) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": cm.metadata.name,
        "uid": cm.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_spec(
    cm: CompiledModel, rt: ResolvedTarget, prefix: str, settings: Settings, created: float | None = None
) -> JobSpec:
    """What the Job is told (kompile.api.job_contract): the CompiledModel, its one target, where to
    publish, where the TensorRT timing caches are shared, and (given when it is created) when its
    deadline ends."""
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": cm.metadata.name,
            "namespace": cm.metadata.namespace,
            "uid": cm.metadata.uid,
            "generation": cm.metadata.generation,
        },
        "spec": cm.spec.to_wire(),
    }
    registry = cm.spec.registry
    root = prefix_root(prefix)
    return JobSpec(
        compiled_model=doc,
        target=rt.target,
        hardware_class=rt.hardware_class,
        device="cuda" if rt.gpu else "cpu",
        artifact_prefix=prefix,
        work_dir=SCRATCH,
        # Shared beside the cache: TensorRT timing caches per (GPU class, TensorRT version), TVM
        # tuning databases per (class, TVM version, target), so CPU Jobs get it too.
        timing_cache_uri=f"{root}/{TIMING_CACHES}",
        s3_endpoint=(registry.s3_endpoint if registry else None) or settings.s3_endpoint,
        arch=rt.arch,
        deadline=JobDeadline(created, settings.job_deadline_seconds) if created is not None else None,
    )


def compile_image(rt: ResolvedTarget, settings: Settings) -> str:
    """The compile image of a target (image_choice's image)."""
    return image_choice(rt, settings)[0]


def image_choice(rt: ResolvedTarget, settings: Settings) -> tuple[str, str]:
    """The compile image of a target and the setting that named it: the GPU one
    (KOMPILE_GPU_ENVS_IMAGE where a candidate needs an own environment); else, when its candidates
    need own environments, the image KOMPILE_ENV_IMAGES names for that environment (or that
    `+`-joined set), else for several the image that carries every environment
    (KOMPILE_ENVS_IMAGE): each of them carries the CPU image's backends too, so every candidate
    builds in one Job; else the CPU one. The CPU image is one multi-arch tag (the Dockerfile's
    compile-cpu stage, built for amd64 and arm64): each node pulls its own architecture's variant,
    and the Job's nodeSelector pins the architecture."""
    if rt.gpu:
        # TensorRT's image; with the own environments of the backends that also build for cuda
        # when a candidate needs one.
        entries = [CATALOG[b] for b in backends_of(rt.target, "cuda", rt.arch)]
        if any(e.environment and "cuda" in e.devices for e in entries):
            return settings.gpu_envs_image, "KOMPILE_GPU_ENVS_IMAGE"
        return settings.gpu_image, "KOMPILE_GPU_IMAGE"
    needed = sorted({e for b in backends_of(rt.target, "cpu", rt.arch) if (e := CATALOG[b].environment)})
    key = "+".join(needed)
    if needed and settings.env_images.get(key):
        return settings.env_images[key], f"KOMPILE_ENV_IMAGES ({key})"
    if len(needed) > 1:
        return settings.envs_image, "KOMPILE_ENVS_IMAGE"
    return settings.cpu_image, "KOMPILE_CPU_IMAGE"


def _env(
    cm: CompiledModel, rt: ResolvedTarget, prefix: str, settings: Settings, created: float | None
) -> list[dict[str, Any]]:
    pod_env = [
        {"name": "HOME", "value": SCRATCH},
        {"name": "TMPDIR", "value": SCRATCH},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    return [*job_spec(cm, rt, prefix, settings, created).to_env(), *pod_env]


def _secret_name(cm: CompiledModel, settings: Settings) -> str | None:
    registry = cm.spec.registry
    if registry and registry.credentials_secret:
        return registry.credentials_secret.name
    return settings.store_secret


def build_job(
    cm: CompiledModel,
    rt: ResolvedTarget,
    cache_key: str,
    prefix: str,
    settings: Settings,
    created: float | None = None,
) -> dict[str, Any]:
    """The compile Job for one target of one generation; `created` (unix time, the operator's clock
    when it creates the Job) tells the Job when its deadline ends."""
    uid = cm.metadata.uid or ""
    generation = cm.metadata.generation or 0
    labels = {
        LABEL_NAME: label_value(cm.metadata.name),
        LABEL_UID: uid,
        LABEL_GENERATION: str(generation),
        LABEL_TARGET: label_value(rt.name),
        LABEL_CLASS: label_value(rt.hardware_class),
        "app.kubernetes.io/managed-by": "kompile",
    }
    image, chosen_by = image_choice(rt, settings)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["kompile-job"],
        "env": _env(cm, rt, prefix, settings, created),
        "resources": rt.resources,
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}],
        # Crashes leave no termination message; the log tail then tells the user why.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    secret = _secret_name(cm, settings)
    if secret:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": settings.scratch_size}}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
    }
    if rt.node_selector:
        pod_spec["nodeSelector"] = dict(rt.node_selector)
    if rt.affinity:
        pod_spec["affinity"] = rt.affinity
    if rt.tolerations:
        pod_spec["tolerations"] = rt.tolerations
    if rt.runtime_class:
        pod_spec["runtimeClassName"] = rt.runtime_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(cm.metadata.name, uid, generation, rt.name),
            "namespace": cm.metadata.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_CACHE_KEY: cache_key, ANNOTATION_PREFIX: prefix},
            "ownerReferences": [owner_reference(cm)],
        },
        "spec": {
            "backoffLimit": settings.job_backoff_limit,
            "activeDeadlineSeconds": settings.job_deadline_seconds,
            "ttlSecondsAfterFinished": settings.job_ttl_seconds,
            "podFailurePolicy": {
                # First match wins: a disrupted pod (evicted, preempted: killed with 137 too) is
                # retried without counting; bad input and an OOM kill fail the Job at once.
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER,
                            "operator": "In",
                            "values": [int(ExitCode.BAD_INPUT), int(ExitCode.OUT_OF_MEMORY)],
                        },
                    },
                ]
            },
            "template": {
                # On the pod: what a pull error's message names as the setting to correct.
                "metadata": {"labels": labels, "annotations": {ANNOTATION_IMAGE_SETTING: chosen_by}},
                "spec": pod_spec,
            },
        },
    }
