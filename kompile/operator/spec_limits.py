"""What the CRD schema cannot bound, refused before any Job with a reason rather than failing every
reconcile: a spec too large for the compile Job to carry, more targets than status holds, tuning
budgets a compile Job's deadline cannot hold, and a compile Job the API server itself refuses (a
request above its limit). Pure."""

from __future__ import annotations

import json

from kompile.api.candidates import candidate_targets
from kompile.api.catalog import entry
from kompile.api.resource import CompiledModel
from kompile.api.spec import Target
from kompile.api.status import TARGETS_MAX

# The compile Job carries the whole CompiledModel in one environment variable (Linux refuses one
# over 128 KiB at exec) and Kopf keeps the last handled spec in an annotation (256 KiB for all of
# them): half the first leaves room for the rest.
SPEC_MAX_BYTES = 64 * 1024


def oversized(cm: CompiledModel) -> str | None:
    """Why the spec is too large to compile, naming its largest part, or None."""
    wire = cm.spec.to_wire()
    size = len(json.dumps(wire, separators=(",", ":")))
    if size <= SPEC_MAX_BYTES:
        return None
    field, part = max(wire.items(), key=lambda kv: len(json.dumps(kv[1], separators=(",", ":"))))
    return (
        f"spec is {size / 1024:.0f} KiB of JSON, more than the {SPEC_MAX_BYTES // 1024} KiB a compile "
        f"Job can carry (largest: spec.{field}, {len(json.dumps(part)) / 1024:.0f} KiB): split the "
        "targets over several CompiledModels or drop what they repeat"
    )


def too_many_targets(cm: CompiledModel, count: int) -> str | None:
    """Why `count` resolved targets (listed plus one per hardware class and fleet precision) are
    more than status can report, or None."""
    if count <= TARGETS_MAX:
        return None
    fleet = cm.spec.fleet
    precisions = len(fleet.precisions) if fleet and fleet.enabled else 0
    return (
        f"{count} targets ({len(cm.spec.targets or [])} listed, {precisions} per discovered hardware "
        f"class), more than the {TARGETS_MAX} status can report: list fewer spec.fleet.precisions, "
        "narrow spec.targets, or split the fleet over several CompiledModels"
    )


SEARCH_SHARE = 0.75
"""Of a compile Job's deadline, what its candidates' tuning may take: the rest exports, builds,
validates and times them."""


def search_over_deadline(target: Target, device: str, arch: str | None, deadline_seconds: int) -> str | None:
    """Why the target's candidates' tuning budgets (tvm's tuningMinutes) cannot fit in its compile
    Job's deadline, or None: the deadline would stop the Job mid-tuning, and what it tuned with it."""
    asks: list[tuple[str, float]] = []
    for t in candidate_targets(target, device, arch):
        backend = entry(t.backend)
        minutes = backend.parse_options(t.options).search_minutes()
        if minutes and t.precision in backend.precisions:
            asks.append((t.name, minutes))
    total, room = sum(m for _, m in asks), deadline_seconds * SEARCH_SHARE / 60
    if total <= room:
        return None
    listed = ", ".join(f"{name} {minutes:g}" for name, minutes in asks)
    return (
        f"its candidates' tuning budgets add up to {total:g} minutes ({listed}), more than the "
        f"{room:g} a compile Job may spend tuning ({SEARCH_SHARE:.0%} of its {deadline_seconds} s "
        "deadline, the operator's KOMPILE_JOB_DEADLINE_SECONDS, chart value jobs.deadlineSeconds): "
        "the deadline would stop it mid-tuning. Lower their tuningMinutes, split the candidates over "
        "several targets, or raise the operator's deadline"
    )


def job_refusal(cm: CompiledModel, target: str, api_message: str) -> str:
    """The API server refused a target's compile Job: its message, and the part of the spec that
    shaped the Job's pod."""
    names = [t.name for t in cm.spec.targets or []]
    where = (
        f"spec.targets[{names.index(target)}].hardware (resources, nodeSelector, tolerations, "
        "runtimeClassName)"
        if target in names
        else "the operator's settings for fleet targets"
    )
    return f"the API server refused the compile Job: {api_message[:1500]}; check {where}"
