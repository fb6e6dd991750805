"""The Argo CD health check, run by a real Lua interpreter (lupa) as Argo CD would run it."""

from __future__ import annotations

from typing import Any

import pytest
from lupa import LuaRuntime

from kompile.api.status import CompiledModelStatus, TargetStatus, progress_conditions, summarize
from kompile.gitops import HEALTH_LUA


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """Evaluate health.lua on obj the way Argo CD does: `obj` is a global table."""
    lua = LuaRuntime(unpack_returned_tuples=True)

    def to_lua(value: Any) -> Any:
        if isinstance(value, dict):
            return lua.table_from({k: to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return lua.table_from([to_lua(v) for v in value])
        return value

    lua.globals().obj = to_lua(obj)
    result = lua.execute(HEALTH_LUA.read_text())
    return result["status"], result["message"]


def cm(generation: int, status: CompiledModelStatus | None, suspend: bool = False) -> dict[str, Any]:
    """The object as a GitOps tool reads it: its status as the operator writes it (Reconciling and
    Stalled derived last, kompile.operator.reconcile._write_status)."""
    doc: dict[str, Any] = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m", "generation": generation},
        "spec": {"suspend": suspend},
    }
    if status is not None:
        progress_conditions(status, suspend)
        doc["status"] = status.to_wire()
    return doc


def target(name: str, phase: str, passed: bool | None = None) -> TargetStatus:
    t = TargetStatus(name=name, backend="onnxruntime", precision="fp32", phase=phase)  # type: ignore[arg-type]
    if passed is not None:
        from kompile.api.status import Thresholds, ValidationResult

        t.validation = ValidationResult(
            passed=passed, samples=1, thresholds=Thresholds(min_cosine=0.9, top_k=1)
        )
        t.reason = None if passed else "ValidationFailed"
    return t


SCENARIOS: list[tuple[dict[str, Any], str]] = [
    (cm(1, None), "Progressing"),
    (cm(2, summarize(CompiledModelStatus(targets=[target("a", "Succeeded", True)]), 1)), "Progressing"),
    (cm(1, summarize(CompiledModelStatus(targets=[target("a", "Running")]), 1)), "Progressing"),
    (
        cm(1, summarize(CompiledModelStatus(targets=[target("a", "Pending")]), 1), suspend=True),
        "Suspended",
    ),
    (cm(1, summarize(CompiledModelStatus(targets=[target("a", "Succeeded", True)]), 1)), "Healthy"),
    (
        cm(
            1,
            summarize(
                CompiledModelStatus(targets=[target("a", "Succeeded", True), target("b", "Failed", False)]),
                1,
            ),
        ),
        "Degraded",
    ),
]
SCENARIO_IDS = ["no-status", "stale-generation", "running", "suspended", "ready", "failed-target"]


@pytest.mark.parametrize(("doc", "expected"), SCENARIOS, ids=SCENARIO_IDS)
def test_health(doc: dict[str, Any], expected: str) -> None:
    status, message = health(doc)
    assert status == expected, message
    assert message


def progress(status: CompiledModelStatus, suspended: bool = False) -> tuple[str, str]:
    """(Reconciling, Stalled) statuses as the operator writes them: what kstatus (Flux's health
    check, cli-utils) reads (tests/integration/test_flux_health.py runs kstatus itself)."""
    progress_conditions(status, suspended)
    conds = {c.type: c.status for c in status.conditions}
    return conds["Reconciling"], conds["Stalled"]


def test_flux_sees_the_same_verdicts_as_argo_cd() -> None:
    """Flux (kstatus) tells failed from in progress only by the Stalled condition: without it a
    CompiledModel whose targets failed read as InProgress until the wait timed out. Reconciling and
    Stalled give the health.lua verdicts."""
    compiling = summarize(CompiledModelStatus(targets=[target("a", "Running")]), 1)
    assert progress(compiling) == ("True", "False")
    assert health(cm(1, compiling))[0] == "Progressing"
    held = summarize(CompiledModelStatus(targets=[target("a", "Pending")]), 1)
    assert progress(held, suspended=True) == ("True", "False")
    assert next(c for c in held.conditions if c.type == "Reconciling").reason == "Suspended"
    healthy = summarize(CompiledModelStatus(targets=[target("a", "Succeeded", True)]), 1)
    assert progress(healthy) == ("False", "False")
    assert health(cm(1, healthy))[0] == "Healthy"
    failed = summarize(
        CompiledModelStatus(targets=[target("a", "Succeeded", True), target("b", "Failed", False)]), 1
    )
    assert progress(failed) == ("False", "True")
    stalled = next(c for c in failed.conditions if c.type == "Stalled")
    assert stalled.reason == "ValidationFailed" and "b: ValidationFailed" in (stalled.message or "")
    assert health(cm(1, failed))[0] == "Degraded"
    # Validated, its MLflow record due next pass (Ready Unknown): still reconciling.
    from kompile.api.status import set_condition

    healthy.conditions = set_condition(healthy.conditions, "Ready", "Unknown", "Registering", "", 1)
    assert progress(healthy) == ("True", "False")
    # Written again with nothing changed: the same conditions, so no status write.
    before = [c.model_dump() for c in failed.conditions]
    progress(failed)
    assert [c.model_dump() for c in failed.conditions] == before
