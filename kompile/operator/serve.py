"""Rollout side effects: per hardware class, pick the validated winner, and drive its
InferenceService one step (create, canary, promote, roll back) or write it for a GitOps agent.
Decisions live in rollout.py and rollout_state.py; this module reads the cluster and applies them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from kompile.api.resource import CompiledModel
from kompile.api.spec import Rollout
from kompile.api.status import READY, CompiledModelStatus, RolloutStatus, set_condition
from kompile.operator import tensorrt_match
from kompile.operator.kube import Kube
from kompile.operator.lineage import EventFn, move_alias
from kompile.operator.rollout import (
    cluster_mode,
    crd_supports_spec_canary,
    device_winner,
    gitops_configmap,
    gitops_files,
    inference_service,
    service_name,
    storage_uri,
    winner,
)
from kompile.operator.rollout_state import step
from kompile.operator.settings import Settings
from kompile.operator.targets import ResolvedTarget

ISVC_CRD = "inferenceservices.serving.kserve.io"
CONFIG_MAP_NOT_OWNED = "ConfigMapNotOwned"


def _owned_by(isvc: dict[str, Any], cm: CompiledModel) -> bool:
    refs = (isvc.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == cm.metadata.uid for r in refs)


def reconcile_rollouts(
    cm: CompiledModel,
    status: CompiledModelStatus,
    resolved: list[ResolvedTarget],
    kube: Kube,
    settings: Settings,
    event: EventFn,
) -> None:
    """One rollout step per hardware class; status.rollouts records where each stands."""
    spec = cm.spec.rollout
    if spec is None or not spec.enabled:
        status.rollouts = []
        return
    by_class: dict[str, ResolvedTarget] = {}
    for rt in resolved:
        by_class.setdefault(rt.hardware_class, rt)
    previous = {r.hardware_class: r for r in status.rollouts}
    mode = cluster_mode(
        kube.get_config_map(settings.kserve_namespace, "inferenceservice-config"), spec.deployment_mode
    )
    spec_canary = crd_supports_spec_canary(kube.get_crd(ISVC_CRD))
    now = datetime.now(UTC)
    out: list[RolloutStatus] = []
    manifests: list[dict[str, Any]] = []
    for cls, rt in sorted(by_class.items()):
        name = service_name(cm.metadata.name, spec.inference_service, cls, len(by_class))
        best, why = winner(status.targets, cls, spec.gate)
        if best is None or best.artifact is None:
            device = device_winner(status.targets, cls)
            if device is not None:
                # Nothing for KServe; the class alias is the devices' pointer to their winner.
                move_alias(cm, status, settings, cls, device, event)
                why = f"{why}; the class alias points at {device.name} for devices to fetch"
            out.append(
                RolloutStatus(hardware_class=cls, phase="Blocked", inference_service=name, message=why)
            )
            continue
        desired = inference_service(
            cm,
            rt,
            best,
            name,
            mode,
            None,
            owned=not spec.adopt and spec.gitops is None,
            runtime_version=_triton_release(spec, settings),
        )
        if spec.gitops is not None:
            manifests.append(desired)
            out.append(
                RolloutStatus(
                    hardware_class=cls,
                    phase="Written",
                    inference_service=name,
                    target=best.name,
                    storage_uri=storage_uri(best.artifact.uri),
                    deployment_mode=mode,
                    message=f"manifest written for GitOps ({why})",
                )
            )
            continue
        out.append(
            _one(
                cm,
                status,
                rt,
                name,
                desired,
                previous.get(cls),
                mode,
                spec_canary,
                now,
                kube,
                settings,
                event,
            )
        )
    if manifests and spec.gitops is not None:
        refused = _write_gitops(cm, manifests, kube, event)
        if refused:
            out = _config_map_refused(cm, status, out, previous, refused, event)
    status.rollouts = out


def _triton_release(spec: Rollout, settings: Settings) -> str | None:
    """The Triton release whose TensorRT matches the plans (the runtime's default when unknown)."""
    version = spec.tensorrt_version or settings.serving_tensorrt_version or settings.gpu_tensorrt_version
    if version is None:
        return settings.triton_runtime_version
    try:
        return tensorrt_match.triton_runtime_version(version, settings.triton_runtime_version)
    except ValueError:
        return settings.triton_runtime_version


def _one(
    cm: CompiledModel,
    status: CompiledModelStatus,
    rt: ResolvedTarget,
    name: str,
    desired: dict[str, Any],
    current: RolloutStatus | None,
    mode: str,
    spec_canary: bool,
    now: datetime,
    kube: Kube,
    settings: Settings,
    event: EventFn,
) -> RolloutStatus:
    spec = cm.spec.rollout
    assert spec is not None
    namespace = cm.metadata.namespace or "default"
    cls = rt.hardware_class
    isvc = kube.get_inference_service(namespace, name)
    if isvc is not None and not spec.adopt and not _owned_by(isvc, cm):
        return RolloutStatus(
            hardware_class=cls,
            phase="Failed",
            inference_service=name,
            message=f"InferenceService {name} exists and is not owned by this CompiledModel: "
            "set spec.rollout.adopt: true to take it over, or choose another name",
        )
    uri = desired["spec"]["predictor"]["model"]["storageUri"]
    d = step(
        current,
        uri,
        isvc,
        mode,
        spec.canary_traffic_percent,
        spec.canary_timeout_seconds,
        now,
        desired=desired,
        spec_canary=spec_canary,
        hardware_class=cls,
    )
    try:
        if d.action == "create" and d.body is not None:
            kube.create_inference_service(namespace, d.body)
        elif d.action in ("update", "promote", "rollback") and d.body is not None:
            kube.patch_inference_service(namespace, name, d.body)
    except ApiException as err:
        event("Warning", "RolloutFailed", f"{name}: {d.action}: {err.status} {err.reason}")
        return d.status.model_copy(update={"phase": "Failed", "message": f"{d.action} refused: {err.reason}"})
    if d.action not in ("none", "wait"):
        kind = "Warning" if d.action == "rollback" else "Normal"
        event(kind, f"Rollout{d.action.capitalize()}", f"{name}: {d.message}")
    # Each reconcile of a Ready rollout checks the class's alias (move_alias does nothing when it
    # already points at the served version), so a move MLflow refused is retried until it lands.
    if d.status.phase == "Ready":
        served = next((t for t in status.targets if t.name == d.status.target), None)
        if served is not None and served.validation is not None and served.validation.passed:
            move_alias(cm, status, settings, cls, served, event)
    return d.status


def _config_map_refused(
    cm: CompiledModel,
    status: CompiledModelStatus,
    out: list[RolloutStatus],
    previous: dict[str, RolloutStatus],
    refused: str,
    event: EventFn,
) -> list[RolloutStatus]:
    """The written manifests went nowhere: each such rollout Failed, Ready False, one Event."""
    failed = [
        r.model_copy(update={"phase": "Failed", "message": refused}) if r.phase == "Written" else r
        for r in out
    ]
    status.conditions = set_condition(
        status.conditions, READY, "False", CONFIG_MAP_NOT_OWNED, refused, cm.metadata.generation
    )
    told = [p.message for p in previous.values()]  # the rollouts of the last reconcile
    if refused not in told:
        event("Warning", CONFIG_MAP_NOT_OWNED, refused)
    return failed


def write_gitops_config_map(cm: CompiledModel, manifests: list[dict[str, Any]], kube: Kube) -> str | None:
    """Create the GitOps ConfigMap, or update it when this CompiledModel owns it; None when written,
    else why not. A ConfigMap someone else made is never changed, adopted or (through ownership)
    deleted with the CompiledModel."""
    spec = cm.spec.rollout
    assert spec is not None and spec.gitops is not None and spec.gitops.config_map
    namespace, name = cm.metadata.namespace or "default", spec.gitops.config_map
    body = gitops_configmap(cm, manifests, name)
    current = kube.get_config_map(namespace, name)
    if current is None:
        try:
            kube.create_config_map(namespace, body)
            return None
        except ApiException as err:
            if err.status != 409:
                raise
            # Made meanwhile (or unreadable to us): someone else's until it shows it is ours.
    if current is None or not _owned_by(current, cm):
        return (
            f"ConfigMap {name} exists and is not owned by this CompiledModel: kompile leaves it as it "
            "is; set spec.rollout.gitops.configMap to a name no ConfigMap has yet"
        )
    # The version read: a change made meanwhile fails the replace (409) rather than being lost.
    body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
    kube.replace_config_map(namespace, name, body)
    return None


def _write_gitops(
    cm: CompiledModel, manifests: list[dict[str, Any]], kube: Kube, event: EventFn
) -> str | None:
    spec = cm.spec.rollout
    assert spec is not None and spec.gitops is not None
    if spec.gitops.config_map:
        refused = write_gitops_config_map(cm, manifests, kube)
        if refused:
            return refused
        event(
            "Normal",
            "GitOpsWritten",
            f"ConfigMap {spec.gitops.config_map}: {len(manifests)} InferenceService(s)",
        )
    elif spec.gitops.directory:
        folder = Path(spec.gitops.directory)
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, text in gitops_files(manifests).items():
            (folder / file_name).write_text(text)
        event("Normal", "GitOpsWritten", f"{folder}: {len(manifests)} InferenceService(s)")
    return None
