"""One target's step in a reconcile: its status read from its Job, refused before any Job runs,
reused from the content-addressed cache, or a compile Job launched for it, in that order."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from kompile.api.cache import artifact_prefix, cache_key
from kompile.api.candidates import backends_of
from kompile.api.resource import CompiledModel
from kompile.api.status import TargetStatus
from kompile.operator import metrics, spec_limits, tensorrt_match
from kompile.operator.crashpoints import crash_point
from kompile.operator.jobs import ANNOTATION_CACHE_KEY, ANNOTATION_PREFIX, build_job, compile_image
from kompile.operator.kube import Kube, api_message
from kompile.operator.results import from_job, held_up_anew, with_progress
from kompile.operator.settings import Settings
from kompile.operator.store_access import (
    STORE_REFUSED,
    STORE_UNAVAILABLE,
    EventFn,
    StoreAccess,
    StoreRefused,
    StoreUnavailable,
    entry_complete,
    forget_progress,
    read_progress,
    read_stored_result,
    source_fingerprint,
    store_root,
)
from kompile.operator.targets import ResolvedTarget

log = logging.getLogger("kompile.operator")

TERMINAL = ("Succeeded", "Failed", "Skipped", "Exported")


def model_name(cm: CompiledModel) -> str:
    return (cm.spec.registry.model_name if cm.spec.registry else None) or cm.metadata.name


def tensorrt_refusal(cm: CompiledModel, rt: ResolvedTarget, settings: Settings) -> str | None:
    """A plan only loads on the TensorRT release that built it: refuse before any Job runs when
    the GPU compile image's TensorRT is not the serving runtime's."""
    if not rt.gpu or "tensorrt" not in backends_of(rt.target, "cuda"):
        return None
    serving = (
        cm.spec.rollout.tensorrt_version if cm.spec.rollout else None
    ) or settings.serving_tensorrt_version
    return tensorrt_match.refusal(serving, settings.gpu_tensorrt_version, settings.gpu_image)


def target_status(
    cm: CompiledModel,
    rt: ResolvedTarget,
    job: Mapping[str, Any] | None,
    prev: TargetStatus | None,
    kube: Kube,
    settings: Settings,
    store: StoreAccess,
    event: EventFn,
    pods: Callable[[str], list[dict[str, Any]]] | None = None,
) -> TargetStatus:
    """One target's status this reconcile: read from its Job, refused, reused from the cache, or a
    Job launched for it, in that order. `pods` gives a Job's pods (default: one list per Job)."""
    if job is not None:
        # The Job's own key and prefix: where it wrote, whatever a recomputed key would say now.
        notes = (job.get("metadata") or {}).get("annotations") or {}
        if notes.get(ANNOTATION_CACHE_KEY) and notes.get(ANNOTATION_PREFIX):
            key, prefix = notes[ANNOTATION_CACHE_KEY], notes[ANNOTATION_PREFIX]
            return _from_job(cm, rt, job, prev, kube, store, prefix, key, event, pods)
    try:
        key = target_cache_key(cm, rt, settings, store)
    except StoreUnavailable as err:
        return _store_unavailable(rt, "", err)
    prefix = artifact_prefix(store_root(cm, settings), cm.metadata.namespace or "default", key)
    if job is not None:
        return _from_job(cm, rt, job, prev, kube, store, prefix, key, event, pods)
    refused = tensorrt_refusal(cm, rt, settings)
    if refused:
        event("Warning", "TensorRTVersionMismatch", f"target {rt.name}: {refused}")
        return _status(rt, key, phase="Failed", reason="TensorRTVersionMismatch", message=refused)
    try:
        cached = _cache_hit(cm, rt, store, prefix, key, event)
    except StoreUnavailable as err:
        # Launching on a miss we could not see would compile again what may be there.
        return _store_unavailable(rt, key, err)
    if cached is not None:
        return cached
    return _launch_job(cm, rt, kube, settings, key, prefix, event)


def _store_unavailable(rt: ResolvedTarget, key: str, err: StoreUnavailable) -> TargetStatus:
    reason = STORE_REFUSED if isinstance(err, StoreRefused) else STORE_UNAVAILABLE
    return _status(rt, key, phase="Pending", reason=reason, message=f"{err}; retrying")


def _status(rt: ResolvedTarget, key: str | None, **fields: Any) -> TargetStatus:
    return TargetStatus(
        name=rt.name,
        backend=rt.target.backend,
        precision=rt.target.precision,
        hardware_class=rt.hardware_class,
        cache_key=key,
        **fields,
    )


def target_cache_key(cm: CompiledModel, rt: ResolvedTarget, settings: Settings, store: StoreAccess) -> str:
    """The content address of what this target would build. Every backend the target's candidates
    use shapes the artifact: all their versions key it."""
    version = ",".join(
        f"{b}={settings.backend_versions.get(b, 'unknown')}"
        for b in backends_of(rt.target, "cuda" if rt.gpu else "cpu", rt.arch)
    )
    return cache_key(
        source_fingerprint(cm, store, compile_image(rt, settings)),
        rt.target,
        version,
        rt.hardware_class,
        cm.spec.inputs,
        cm.spec.validation,
        model_name(cm),
    )


def _from_job(
    cm: CompiledModel,
    rt: ResolvedTarget,
    job: Mapping[str, Any],
    prev: TargetStatus | None,
    kube: Kube,
    store: StoreAccess,
    prefix: str,
    key: str,
    event: EventFn,
    pods: Callable[[str], list[dict[str, Any]]] | None = None,
) -> TargetStatus:
    """The target's status from its Job, its pods and the result it stored; metrics and an Event
    once it has settled."""
    namespace = cm.metadata.namespace or "default"
    try:
        stored = read_stored_result(prefix, store)
    except StoreUnavailable as err:
        # The termination message may carry the result; else the target awaits the store.
        log.warning("target %s: %s", rt.name, err)
        stored = None
    name = job["metadata"]["name"]
    job_pods = pods(name) if pods is not None else kube.job_pods(namespace, name)
    ts, _digest = from_job(rt, job, job_pods, stored.target if stored else None)
    if ts.phase == "Running" and ts.reason is None:
        ts = with_progress(ts, read_progress(prefix, store))
    ts.cache_key = key
    if ts.node is None and prev is not None:
        ts.node = prev.node  # the pod may be gone; the node it ran on was seen earlier
    if ts.phase not in TERMINAL:
        if held_up_anew(prev.reason if prev else None, ts.reason):
            # Once as it starts (kubectl describe, alerts on Events), not at every look.
            event("Warning", ts.reason or "", f"target {rt.name}: {ts.message}")
        return ts
    forget_progress(prefix, store)
    metrics.JOBS.labels(outcome=ts.phase).inc()
    if ts.compile_seconds is not None:
        metrics.COMPILE_SECONDS.observe(ts.compile_seconds)
    if ts.validation_seconds is not None:
        metrics.VALIDATION_SECONDS.observe(ts.validation_seconds)
    if ts.speedup is not None:
        metrics.SPEEDUP.labels(namespace=namespace, name=cm.metadata.name, target=rt.name).set(ts.speedup)
    kind = "Normal" if ts.phase == "Succeeded" else "Warning"
    event(kind, ts.reason or ts.phase, f"target {rt.name}: {ts.message or ts.phase}")
    return ts


def _cache_hit(
    cm: CompiledModel, rt: ResolvedTarget, store: StoreAccess, prefix: str, key: str, event: EventFn
) -> TargetStatus | None:
    """A validated artifact already at this content address (for the pinned source digest)."""
    cached = read_stored_result(prefix, store)
    validation = cached.target.validation if cached else None
    if not (cached and validation and validation.passed and _digest_ok(cm, cached.source_digest)):
        return None
    if not entry_complete(prefix, cached, store):
        return None
    ts = cached.target.model_copy(
        update={
            "name": rt.name,
            "cached": True,
            "cache_key": key,
            "job": None,
            "hardware_class": rt.hardware_class,
            "reason": "CacheHit",
            "message": f"reused validated artifact {prefix}",
        }
    )
    event("Normal", "CacheHit", f"target {rt.name}: reused validated artifact {key[:12]}")
    metrics.JOBS.labels(outcome="Cached").inc()
    return ts


def _launch_job(
    cm: CompiledModel,
    rt: ResolvedTarget,
    kube: Kube,
    settings: Settings,
    key: str,
    prefix: str,
    event: EventFn,
) -> TargetStatus:
    """Create the target's compile Job (a 409 means it exists: deterministic name), unless suspended."""
    base = _status(rt, key, phase="Pending")
    if cm.spec.suspend:
        base.reason, base.message = "Suspended", "spec.suspend is true: no new compile Job"
        return base
    device = "cuda" if rt.gpu else "cpu"
    over = spec_limits.search_over_deadline(rt.target, device, rt.arch, settings.job_deadline_seconds)
    if over:
        event("Warning", "TuningOverDeadline", f"target {rt.name}: {over}")
        return _status(rt, key, phase="Failed", reason="TuningOverDeadline", message=over)
    manifest = build_job(cm, rt, key, prefix, settings, created=time.time())
    try:
        created = kube.create_job(cm.metadata.namespace or "default", manifest)
    except ApiException as err:
        if err.status not in (400, 422):
            raise
        why = spec_limits.job_refusal(cm, rt.target.name, api_message(err))
        event("Warning", "JobRefused", f"target {rt.name}: {why}")
        return _status(rt, key, phase="Failed", reason="JobRefused", message=why)
    if created:
        crash_point("after-job-create")
    base.job = manifest["metadata"]["name"]
    base.message = "compile Job created"
    if created:
        event(
            "Normal", "JobCreated", f"target {rt.name}: created Job {base.job} on class {rt.hardware_class}"
        )
    return base


def _digest_ok(cm: CompiledModel, digest: str | None) -> bool:
    return cm.spec.source.digest is None or digest == cm.spec.source.digest
