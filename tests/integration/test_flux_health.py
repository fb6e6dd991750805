"""Flux's health check (kstatus, run for real) reads a CompiledModel as Argo CD's health.lua does:
InProgress while it compiles or waits, Failed when it settled short of Ready, Current when Ready.
Before, kstatus read a failed CompiledModel as InProgress (its Ready False alone says "not yet"),
so a Kustomization with `wait: true` waited out its timeout and then said nothing of why; and one
the operator had not written yet as Current, so the wait could pass before anything compiled."""

from __future__ import annotations

from typing import Any

import pytest

from kompile.api.crd import build_crd
from tests.support.kstatus import kstatus
from tests.unit.test_health_lua import SCENARIO_IDS, SCENARIOS


def build_crd_status_default() -> dict[str, Any]:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    default: dict[str, Any] = schema["properties"]["status"]["default"]
    return default


# health.lua's verdict -> kstatus'.
FLUX = {"Progressing": "InProgress", "Suspended": "InProgress", "Healthy": "Current", "Degraded": "Failed"}


@pytest.mark.parametrize(("doc", "argo"), SCENARIOS, ids=SCENARIO_IDS)
def test_flux_reads_each_state_as_argo_cd_does(doc: dict[str, Any], argo: str) -> None:
    # Before the operator's first write the API server serves the CRD's default status
    # (test_crd.py holds a real API server to that).
    served = doc if "status" in doc else {**doc, "status": build_crd_status_default()}
    status, message = kstatus(served)
    assert status == FLUX[argo], (argo, status, message)
