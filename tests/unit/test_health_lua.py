"""The Argo CD health check, run by a real Lua interpreter (lupa) as Argo CD would run it."""

from __future__ import annotations

from typing import Any

import pytest
from lupa import LuaRuntime

from kompile.api.status import CompiledModelStatus, TargetStatus, summarize
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
    doc: dict[str, Any] = {"metadata": {"name": "m", "generation": generation}, "spec": {"suspend": suspend}}
    if status is not None:
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


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
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
                    CompiledModelStatus(
                        targets=[target("a", "Succeeded", True), target("b", "Failed", False)]
                    ),
                    1,
                ),
            ),
            "Degraded",
        ),
    ],
    ids=["no-status", "stale-generation", "running", "suspended", "ready", "failed-target"],
)
def test_health(doc: dict[str, Any], expected: str) -> None:
    status, message = health(doc)
    assert status == expected, message
    assert message
