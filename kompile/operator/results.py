"""Turn a compile Job (and its pods) into a target's status. Pure functions over API objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kompile.api.job_contract import JobProgress, parse_compact
from kompile.api.status import TargetPhase, TargetStatus
from kompile.operator.jobs import ANNOTATION_IMAGE_SETTING
from kompile.operator.targets import ResolvedTarget

MESSAGE_TAIL = 1000


def job_state(job: Mapping[str, Any]) -> tuple[str, str | None]:
    """(Running | Complete | Failed, reason of the final condition)."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Complete", cond.get("reason")
        if cond.get("type") in ("Failed", "FailureTarget"):
            return "Failed", cond.get("reason")
    return "Running", None


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term  # type: ignore[no-any-return]
    return None


def latest_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The most recent attempt: its message is the one that explains the outcome."""
    if not pods:
        return None
    return max(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")


def node_of(pods: Sequence[Mapping[str, Any]]) -> str | None:
    pod = latest_pod(pods)
    return ((pod or {}).get("spec") or {}).get("nodeName")


def _base(rt: ResolvedTarget, job_name: str, node: str | None) -> dict[str, Any]:
    return {
        "name": rt.name,
        "backend": rt.target.backend,
        "precision": rt.target.precision,
        "hardware_class": rt.hardware_class,
        "job": job_name,
        "node": node,
    }


# How long after a Job's success its result may stay unreadable (store down, termination message
# lost with the pod) before the target is reported NoResult; until then status says it is awaited.
RESULT_WAIT_SECONDS = 600


def _seconds_since(stamp: str | None, now: datetime) -> float | None:
    """Seconds from an RFC 3339 stamp to now; None when there is none or it does not parse."""
    if not stamp:
        return None
    try:
        then = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (now - then).total_seconds()


def _ended_seconds_ago(job: Mapping[str, Any], now: datetime) -> float | None:
    return _seconds_since((job.get("status") or {}).get("completionTime"), now)


def from_job(
    rt: ResolvedTarget,
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    stored_result: TargetStatus | None,
    now: datetime | None = None,
) -> tuple[TargetStatus, str | None]:
    """The target's status from its Job; returns it with the source digest the Job reported."""
    name = (job.get("metadata") or {}).get("name", "")
    state, reason = job_state(job)
    node = node_of(pods)
    base = _base(rt, name, node)
    if state == "Running":
        stuck = _cannot_start(rt, latest_pod(pods))
        if stuck is not None:
            return TargetStatus(**base, phase="Pending", reason=stuck[0], message=stuck[1]), None
        phase: TargetPhase = "Running" if node else "Pending"
        return TargetStatus(
            **base, phase=phase, message="compile Job running" if node else "waiting for a node"
        ), None
    pod = latest_pod(pods)
    term = _terminated(pod) if pod else None
    message = (term or {}).get("message") or ""
    parsed: TargetStatus | None = None
    digest: str | None = None
    try:
        parsed, digest, _ = parse_compact(message) if message else (None, None, None)
    except (ValueError, ValidationError):
        parsed = None
    if state == "Complete":
        result = stored_result or parsed
        if result is None:
            ago = _ended_seconds_ago(job, now or datetime.now(UTC))
            if ago is not None and ago < RESULT_WAIT_SECONDS:
                return TargetStatus(
                    **base,
                    phase="Running",
                    reason="AwaitingResult",
                    message=f"the compile Job succeeded {ago:.0f} s ago and its result is not readable yet "
                    f"(artifact store unreachable?): retrying for up to {RESULT_WAIT_SECONDS} s",
                ), None
            return TargetStatus(
                **base,
                phase="Failed",
                reason="NoResult",
                message="the compile Job succeeded but its result could not be read from the artifact "
                f"store or its termination message within {RESULT_WAIT_SECONDS} s",
            ), None
        return result.model_copy(
            update={k: v for k, v in base.items() if v is not None or k == "node"}
        ), digest
    # Failed: a compact result (bad input) explains itself; otherwise the log tail does.
    if parsed is not None:
        return parsed.model_copy(update=base | {"phase": "Failed"}), digest
    if (term or {}).get("reason") == "OOMKilled":
        return TargetStatus(
            **base, phase="Failed", reason="OutOfMemory", message=_out_of_memory(rt, pod)
        ), None
    exit_code = (term or {}).get("exitCode")
    why = f"compile Job failed ({reason or 'Failed'}"
    why += f", exit code {exit_code})" if exit_code is not None else ")"
    if reason == "DeadlineExceeded":
        # The bound is the operator's, not the spec's: say where it is set.
        seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
        why += (
            f": it ran past its deadline of {seconds} s (the operator's KOMPILE_JOB_DEADLINE_SECONDS, "
            "chart value jobs.deadlineSeconds) while one candidate was building; raise it, or lower "
            "that candidate's tuning budget. Its log ends"
        )
    tail = message[-MESSAGE_TAIL:].strip()
    return TargetStatus(
        **base, phase="Failed", reason=reason or "JobFailed", message=f"{why}: {tail}" if tail else why
    ), None


def with_progress(
    ts: TargetStatus, progress: JobProgress | None, now: datetime | None = None
) -> TargetStatus:
    """A running target's message with what its Job last told: "compile Job running" said nothing
    for the minutes (up to most of an hour, tuning) a Job runs."""
    if progress is None or ts.phase != "Running" or ts.reason is not None:
        return ts
    now = now or datetime.now(UTC)
    ago = _seconds_since(progress.at, now)
    ran = _seconds_since(progress.started, now)
    when = f"{max(ago, 0.0):.0f} s ago" if ago is not None else "at an unknown time"
    since = f" for {ran / 60:.0f} min" if ran is not None and ran >= 60 else ""
    ts.message = f"compile Job running{since}: {progress.line} ({when})"
    return ts


# Container waiting reasons that do not clear by themselves: the kubelet retries, and the Job waits
# for its deadline, until someone fixes the image setting, the registry or the Secret.
_IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError")
HELD_UP = frozenset(("Unschedulable", *_IMAGE_REASONS, *_CONFIG_REASONS))
"""Reasons of a target whose compile pod cannot start (_cannot_start): each told once in an Event."""


def held_up_anew(before: str | None, now: str | None) -> bool:
    """Whether `now` is a new hold-up rather than the same one: the kubelet alternates ErrImagePull
    and ImagePullBackOff while it retries a pull, which is one."""

    def family(reason: str | None) -> str | None:
        return "image" if reason in _IMAGE_REASONS else reason

    return now in HELD_UP and family(before) != family(now)


def _cannot_start(rt: ResolvedTarget, pod: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) while the compile pod cannot start: the scheduler cannot place it or the
    node cannot run its container. Neither fails the Job (it waits for its deadline), so without this
    the target said only "waiting for a node" while the scheduler said what was missing."""
    if pod is None:
        return None
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if not spec.get("nodeName"):
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                said = cond.get("message") or "no reason given"
                return "Unschedulable", (
                    f"the scheduler cannot place the compile pod: {said} ({_placement_fix(rt, said)})"
                )
        return None
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, said = waiting.get("reason"), waiting.get("message") or ""
        if reason in _IMAGE_REASONS:
            image = next((c.get("image") for c in spec.get("containers") or []), None)
            setting = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_IMAGE_SETTING)
            # A Job made by an operator before the annotation: every setting that names an image.
            check = (
                f"check the operator's setting of it, {setting}"
                if setting
                else "check the operator's image settings, KOMPILE_CPU_IMAGE, KOMPILE_GPU_IMAGE, "
                "KOMPILE_ENV_IMAGES"
            )
            return reason, (
                f"node {spec['nodeName']} cannot pull the compile image {image}"
                f"{f' (set by {setting})' if setting else ''}: {said} ({check}, and the node's access "
                "to the registry: a pull secret of the namespace's service account)"
            )
        if reason in _CONFIG_REASONS:
            return reason, (
                f"node {spec['nodeName']} cannot create the compile container: {said} (a Secret or "
                "ConfigMap the pod names is missing: the Secret that spec.registry.credentialsSecret or the "
                "operator's KOMPILE_STORE_SECRET names must exist in this namespace)"
            )
    return None


def _placement_fix(rt: ResolvedTarget, said: str) -> str:
    """What to change, read from the scheduler's per-node verdicts: room where some node has the
    labels but not the room; else the labels (no node has them) and the tolerations (the nodes that
    have them are tainted)."""
    if "Insufficient" in said or not ("didn't match" in said or "untolerated taint" in said):
        return (
            f"lower {rt.resources_field or 'the target resources'}.requests, or free or add a node of "
            f"hardware class {rt.hardware_class} with that much room"
        )
    labels = ", ".join(f"{k}={v}" for k, v in sorted(rt.node_selector.items()))
    fixes = []
    if "didn't match" in said:
        fixes.append(
            f"no node has the labels of {rt.hardware_field}.nodeSelector ({labels}): correct them "
            "(`kubectl get nodes --show-labels`) or label the nodes meant"
            if rt.hardware_field
            else f"no node of hardware class {rt.hardware_class} ({labels}) is left to run it: its nodes "
            "were removed or relabelled"
        )
    if "untolerated taint" in said:
        where = f"{rt.hardware_field}.tolerations" if rt.hardware_field else "a target's hardware.tolerations"
        which = "where the nodes meant are tainted" if fixes else "every node it may run on is tainted"
        fixes.append(f"{which}: add the taint's toleration to {where}")
    return "; ".join(fixes)


def _out_of_memory(rt: ResolvedTarget, pod: Mapping[str, Any] | None) -> str:
    """Exit code 137 says only "killed": name the limit hit and the field that raises it."""
    containers = ((pod or {}).get("spec") or {}).get("containers") or [{}]
    limit = ((containers[0].get("resources") or {}).get("limits") or {}).get("memory")
    at = f"its memory limit of {limit}" if limit else "the node's memory"
    return (
        f"the compile Job ran out of memory (OOMKilled at {at}; not retried, it would be killed "
        "again at the same limit): a build holds the source model, its "
        "export and a compile's working copies, at least 3.5x the model's size; raise "
        f"{rt.resources_field or 'the target resources'}.limits.memory (and requests.memory, for a "
        "node with that much free), or name fewer candidates"
    )
