"""Reconcile one CompiledModel: desired targets vs. Jobs and cache, results into status.

Level-triggered and idempotent: it may run from a spec change, a Job event, a change of the fleet's
hardware classes or a requeue while work is in flight, any number of times, and always converges
to the same Jobs and status. Decisions are delegated to pure modules (fleet, targets, jobs,
results); this file sequences the calls.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kompile.api.cache import progress_folder
from kompile.api.resource import CompiledModel, format_validation_error
from kompile.api.status import (
    CompiledModelStatus,
    TargetStatus,
    progress_conditions,
    set_condition,
    summarize,
)
from kompile.operator import latest, metrics, spec_limits, tenancy
from kompile.operator.crashpoints import crash_point
from kompile.operator.fleet import HardwareClass
from kompile.operator.jobs import (
    LABEL_GENERATION,
    LABEL_TARGET,
    LABEL_UID,
)
from kompile.operator.kube import JOB_NAME_LABEL, Kube
from kompile.operator.lineage import (
    REGISTERED,
    move_alias,
    register_generation,
    settle_registered,
    tracking_uri,
)
from kompile.operator.progress_sweep import SWEEP
from kompile.operator.serve import reconcile_rollouts
from kompile.operator.settings import Settings
from kompile.operator.store_access import (
    STORE_REACHABLE,
    STORE_REFUSED,
    STORE_UNAVAILABLE,
    EventFn,
    StoreAccess,
    StoreUnavailable,
    store_access,
    store_call,
    store_root,
)
from kompile.operator.target_step import TERMINAL, model_name, target_status
from kompile.operator.targets import ResolvedTarget, resolve_targets

log = logging.getLogger("kompile.operator")

ROLLOUT_WAITING = ("Pending", "Progressing", "Canary")
"""Rollout phases that change with time or with an InferenceService the operator does not watch."""


@dataclass
class Outcome:
    """What a reconcile did, for the caller to decide whether to look again soon."""

    status: CompiledModelStatus
    done: bool
    """Every target has settled (or the spec was refused)."""
    requeue_after: float | None = None
    """Seconds until it is looked at again (kompile.operator.reconcile.requeue_after); None: not."""
    patched: bool = False
    """The status differed from the one read and was written."""


def _previous(doc: Mapping[str, Any], generation: int) -> CompiledModelStatus:
    raw = doc.get("status") or {}
    try:
        status = CompiledModelStatus.model_validate(raw)
    except ValidationError:
        return CompiledModelStatus()
    if status.observed_generation != generation:
        # A new generation compiles afresh; conditions stay so lastTransitionTime stays honest.
        return CompiledModelStatus(conditions=status.conditions)
    return status


class PodsOfJobs:
    """A CompiledModel's compile pods, listed once per reconcile (by its uid label) when a Job's
    are first asked for, then handed out per Job: one call, not one per unsettled target."""

    def __init__(self, kube: Kube, namespace: str, uid: str) -> None:
        self.kube, self.namespace, self.uid = kube, namespace, uid
        self._by_job: dict[str, list[dict[str, Any]]] | None = None

    def __call__(self, job: str) -> list[dict[str, Any]]:
        if self._by_job is None:
            self._by_job = {}
            for pod in self.kube.list_pods(self.namespace, f"{LABEL_UID}={self.uid}"):
                owner = ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_NAME_LABEL, "")
                self._by_job.setdefault(owner, []).append(pod)
        return self._by_job.get(job, [])


def _write_status(
    kube: Kube, doc: Mapping[str, Any], namespace: str, name: str, status: CompiledModelStatus
) -> bool:
    """Patch the status unless it equals the one read: a settled CompiledModel costs no write (and
    no watch event that would wake anything). Reconciling and Stalled are derived here, from what
    every path before set."""
    progress_conditions(status, suspended=bool((doc.get("spec") or {}).get("suspend")))
    new = status.model_dump(by_alias=True, mode="json")
    try:
        old = CompiledModelStatus.model_validate(doc.get("status") or {}).model_dump(
            by_alias=True, mode="json"
        )
    except ValidationError:
        old = None
    if old == new and doc.get("status"):
        return False
    kube.patch_status(namespace, name, new)
    return True


JOB_WATCH_FACTOR = 6
"""A target whose Job runs is announced by the Job's watch when it ends: it is looked at only every
this many KOMPILE_RESYNC_SECONDS, as a safety net (a watch event lost across a reconnect)."""


def requeue_after(cm: CompiledModel, status: CompiledModelStatus, settings: Settings) -> float | None:
    """How soon to look at this CompiledModel again, or None when nothing is in flight.

    KOMPILE_RESYNC_SECONDS while it waits on something no watched event announces: a target with no
    Job yet (the store down) or a result awaited after its Job ended, a registration or alias move
    to retry, a rollout under way. A target whose Job runs is announced by the Job's watch, so only
    a slow safety look. A suspended target waits for a spec change, which is an event."""
    targets = status.targets
    waiting = [t for t in targets if t.phase not in TERMINAL and t.reason != "Suspended"]
    if any(t.job is None or t.reason == "AwaitingResult" for t in waiting) or _after_targets(
        cm, status, settings
    ):
        return settings.resync_seconds
    return settings.resync_seconds * JOB_WATCH_FACTOR if waiting else None


def _after_targets(
    cm: CompiledModel, status: CompiledModelStatus, settings: Settings, pointers: bool = True
) -> bool:
    """Every target settled and the registration, an alias, a rollout or (with pointers) a `latest`
    pointer still to do or under way."""
    targets = status.targets
    if not targets or any(t.phase not in TERMINAL for t in targets):
        return False
    if tracking_uri(cm, settings):
        reg = status.registry
        if reg is None or not reg.run_id or reg.pending_aliases:
            return True
        if any(t.artifact is not None and not t.registered_version for t in targets if t.phase != "Skipped"):
            return True
        rollout = cm.spec.rollout is not None and cm.spec.rollout.enabled
        if not rollout and not reg.aliases_set:
            return True
    if pointers and latest.due(targets, status.latest):
        return True
    return any(r.phase in ROLLOUT_WAITING for r in status.rollouts)


def reconcile(
    doc: Mapping[str, Any],
    kube: Kube,
    settings: Settings,
    event: EventFn,
    *,
    classes: Sequence[HardwareClass],
    quick: bool = False,
) -> Outcome:
    """One pass over a CompiledModel read just now; `classes` is the fleet as the Node watch shows it.

    quick: the pass is for a Job's outcome. When it settles the last target, the status says so at
    once and the MLflow record and rollout (seconds each on a busy registry) come in the next pass,
    asked for with requeue_after=0: a burst of Job ends then waits on API calls only."""
    meta = doc.get("metadata") or {}
    namespace, name = meta.get("namespace", "default"), meta.get("name", "")
    generation = int(meta.get("generation") or 0)
    metrics.RECONCILES.inc()
    told: set[str] = set()  # the reasons this pass posted: Ready's transition does not repeat one

    def tell(kind: str, reason: str, message: str) -> None:
        told.add(reason)
        event(kind, reason, message)

    try:
        cm = CompiledModel.model_validate({k: v for k, v in doc.items() if k != "status"})
    except ValidationError as err:
        status = _previous(doc, generation)
        msg = format_validation_error(err, f"{namespace}/{name}")
        status.conditions = set_condition(status.conditions, "Ready", "False", "InvalidSpec", msg, generation)
        status.observed_generation = generation
        return Outcome(status, done=True, patched=_write_status(kube, doc, namespace, name, status))

    status = _previous(doc, generation)
    # Before any Job, Secret read or MLflow call: nothing of the operator's goes there.
    refused, reason = spec_limits.oversized(cm), "InvalidSpec"
    if refused is None:
        refused, reason = tenancy.refusal(cm, settings), "EndpointNotAllowed"
    if refused:
        return _refuse(status, reason, refused, doc, kube, tell)
    old = {t.name: t for t in status.targets}
    uid = cm.metadata.uid or ""
    jobs = kube.list_jobs(namespace, f"{LABEL_UID}={uid}")
    for job in jobs:  # an older generation's Jobs are superseded
        labels = job["metadata"].get("labels") or {}
        if labels.get(LABEL_GENERATION) != str(generation):
            kube.delete_job(namespace, job["metadata"]["name"])
            tell(
                "Normal",
                "JobSuperseded",
                f"deleted Job {job['metadata']['name']} of generation {labels.get(LABEL_GENERATION)}",
            )
    current = {
        (j["metadata"].get("labels") or {}).get(LABEL_TARGET): j
        for j in jobs
        if (j["metadata"].get("labels") or {}).get(LABEL_GENERATION) == str(generation)
    }

    resolved = resolve_targets(cm.spec, classes, settings.runtime_class_gpu)
    too_many = spec_limits.too_many_targets(cm, len(resolved))
    if too_many:  # status could not hold them: every patch would be refused
        status.targets = []
        return _refuse(status, "TooManyTargets", too_many, doc, kube, tell)
    store = store_access(cm, kube, settings)
    SWEEP(
        progress_folder(store_root(cm, settings), namespace),
        store,
        stale_after=2 * settings.job_deadline_seconds,
        every=settings.progress_sweep_seconds,
    )
    pods = PodsOfJobs(kube, namespace, uid)
    targets: list[TargetStatus] = []
    for rt in resolved:
        prev = old.get(rt.name)
        if prev is not None and prev.phase in TERMINAL:
            targets.append(prev)
            continue
        targets.append(
            target_status(cm, rt, current.get(rt.target.name), prev, kube, settings, store, tell, pods)
        )
    status.targets = targets
    was = next((c for c in status.conditions if c.type == "Ready"), None)
    before = was.status if was else None
    summarize(status, generation)
    if not resolved:
        status.conditions = set_condition(
            status.conditions,
            "Ready",
            "False",
            "NoTargets",
            "fleet discovery found no hardware class and no target is listed",
            generation,
        )
    settled = bool(resolved) and all(t.phase in TERMINAL for t in targets)
    newly = [
        t for t in targets if t.phase in TERMINAL and (t.name not in old or old[t.name].phase not in TERMINAL)
    ]
    # A pointer alone is one small PUT per class: written in this pass, not deferred.
    deferred = settled and quick and bool(newly) and _after_targets(cm, status, settings, pointers=False)
    pointer_error = None
    if settled and not deferred:
        register_generation(cm, status, settings, tell)
        if cm.spec.rollout and cm.spec.rollout.enabled:
            reconcile_rollouts(cm, status, resolved, kube, settings, tell)
        else:
            _alias_winners(cm, status, settings, tell, resolved)
        pointer_error = _write_latest(cm, status, settings, store, generation)
    settle_registered(cm, status, settings)
    _not_ready_while_unregistered(status, generation)
    if deferred:
        _registering(cm, status, settings, generation)
    _store_reachable(status, generation, tell, pointer_error)
    ready = next(c for c in status.conditions if c.type == "Ready")
    if was is not None and ready.status == was.status:
        # A refusal after summarize (registry, GitOps) may have flipped Ready and back: unchanged.
        ready.last_transition_time = was.last_transition_time
    if (
        ready.status != before
        and ready.status in ("True", "False")
        and all(t.phase in TERMINAL for t in targets)
        and ready.reason not in told  # a refusal that turned Ready False posted its own Warning
    ):
        event("Normal" if ready.status == "True" else "Warning", ready.reason, ready.message or ready.reason)
    crash_point("before-status-patch")
    patched = _write_status(kube, doc, namespace, name, status)
    done = all(t.phase in TERMINAL for t in targets)
    again = 0.0 if deferred else requeue_after(cm, status, settings)
    return Outcome(status, done=done, requeue_after=again, patched=patched)


def _store_reachable(
    status: CompiledModelStatus, generation: int, event: EventFn, pointer_error: str | None = None
) -> None:
    """StoreReachable=False (and Ready's reason) while a target or a class's `latest` pointer waits
    on the artifact store; True again once none does. One Warning per outage, not one per reconcile."""
    # Pending only: a Job that the store refused ends Failed with StoreRefused, and waits on nothing.
    waiting = [
        t for t in status.targets if t.phase == "Pending" and t.reason in (STORE_UNAVAILABLE, STORE_REFUSED)
    ]
    before = next((c for c in status.conditions if c.type == STORE_REACHABLE), None)
    if not waiting and pointer_error is None:
        if before is not None:
            status.conditions = set_condition(
                status.conditions, STORE_REACHABLE, "True", "Reachable", "", generation
            )
        return
    reason = (waiting[0].reason if waiting else None) or STORE_UNAVAILABLE
    if waiting:
        message = f"{len(waiting)} target(s) wait on the artifact store: {waiting[0].message}"
    else:
        message = f"the latest pointers wait on the artifact store: {pointer_error}"
    status.conditions = set_condition(
        status.conditions, STORE_REACHABLE, "False", reason, message[:1000], generation
    )
    status.conditions = set_condition(status.conditions, "Ready", "False", reason, message[:1000], generation)
    if before is None or before.status != "False" or before.reason != reason:
        event("Warning", reason, message)


def _write_latest(
    cm: CompiledModel, status: CompiledModelStatus, settings: Settings, store: StoreAccess, generation: int
) -> str | None:
    """Point each class's `latest` at its winner (kompile.operator.latest), once per winner per
    generation; the store's error while one is left to write (retried at the next reconcile)."""

    def put(uri: str, doc: Mapping[str, Any]) -> None:
        store_call(uri, store, lambda: latest.write_pointer(uri, doc, store.endpoint, store.credentials))

    try:
        latest.write_due(
            status,
            store_root(cm, settings),
            namespace=cm.metadata.namespace or "default",
            compiled_model=cm.metadata.name,
            model_name=model_name(cm),
            generation=generation,
            put=put,
        )
    except StoreUnavailable as err:
        return str(err)
    return None


def _registering(cm: CompiledModel, status: CompiledModelStatus, settings: Settings, generation: int) -> None:
    """Validated, its MLflow record due in the next pass: Ready waits for it (Unknown, no Event), as
    whoever waits on Ready reads the winner from MLflow next."""
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    registered = next((c for c in status.conditions if c.type == REGISTERED), None)
    if tracking_uri(cm, settings) is None or ready is None or ready.status != "True":
        return
    if registered is not None and registered.status != "Unknown":
        return  # recorded already, or refused/unavailable (Ready is False then)
    status.conditions = set_condition(
        status.conditions,
        "Ready",
        "Unknown",
        "Registering",
        f"{ready.message}; recording in MLflow",
        generation,
    )


def _not_ready_while_unregistered(status: CompiledModelStatus, generation: int) -> None:
    """Validated but not in MLflow (an outage, a refusal) is not Ready: the promise includes the
    record, and whoever waits on Ready reads the winner from MLflow next."""
    registered = next((c for c in status.conditions if c.type == REGISTERED), None)
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    if registered is None or registered.status != "False" or ready is None or ready.status != "True":
        return
    status.conditions = set_condition(
        status.conditions,
        "Ready",
        "False",
        registered.reason,
        f"{ready.message}, not yet recorded in MLflow: {registered.message}",
        generation,
    )


def _refuse(
    status: CompiledModelStatus,
    reason: str,
    message: str,
    doc: Mapping[str, Any],
    kube: Kube,
    event: EventFn,
) -> Outcome:
    """Ready=False with the reason, written and (on a change of reason) told in an Event."""
    meta = doc.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    before = next((c.reason for c in status.conditions if c.type == "Ready"), None)
    status.conditions = set_condition(status.conditions, "Ready", "False", reason, message, generation)
    status.observed_generation = generation
    patched = _write_status(kube, doc, meta.get("namespace", "default"), meta.get("name", ""), status)
    if before != reason:
        event("Warning", reason, message)
    return Outcome(status, done=True, patched=patched)


def _alias_winners(
    cm: CompiledModel,
    status: CompiledModelStatus,
    settings: Settings,
    event: EventFn,
    resolved: list[ResolvedTarget],
) -> None:
    """Without a rollout, each class's alias points at its fastest validated version, set once."""
    if status.registry is None or status.registry.aliases_set:
        return
    done = True
    for cls in sorted({r.hardware_class for r in resolved}):
        valid = [
            t
            for t in status.targets
            if t.hardware_class == cls
            and t.phase == "Succeeded"
            and t.validation
            and t.validation.passed
            and t.latency
            and t.registered_version
        ]
        if valid:
            moved = move_alias(
                cm, status, settings, cls, min(valid, key=lambda t: t.latency[0].p50_ms), event
            )
            done = done and moved
    status.registry.aliases_set = done  # a failed move is retried at the next reconcile
