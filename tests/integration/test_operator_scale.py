"""The operator under load, through benchmarks/operator_scale.py (its own control plane with an audit
log, KWOK nodes only, compile pods completed by the TEST STAND-IN reporter). A reduced case runs by
default; the issue's size (1,000 CompiledModels x 5 classes on 500 nodes) only with `pytest -m scale`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("operator_scale", ROOT / "benchmarks" / "operator_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _check(doc: dict[str, Any], jobs_s: float, per_cr: str) -> None:
    """The issue's targets: Jobs created in time, a settled CompiledModel all but free, a small
    operator, and status following a Job's end within seconds."""
    assert doc["all_jobs_created_s"] < jobs_s, doc
    assert doc["settled"][per_cr] < 0.05, doc
    assert doc["operator"]["peak_rss_mb"] < 500, doc
    assert doc["job_end_to_status_s"]["n"] == doc["case"]["crs"] * doc["case"]["targets_per_cr"], doc
    assert doc["job_end_to_status_s"]["p99"] < 10, doc


def test_ten_models_settle_and_then_cost_nothing(tmp_path: Path) -> None:
    doc = _benchmark().run(crs=10, nodes=10, quiet=10.0, timeout=300.0, work=tmp_path, bystander=True)
    assert doc["bystander"]["ready_s"] >= doc["bystander"]["first_job_s"] > 0, doc  # another namespace's too
    # With 10 CompiledModels the Lease's renewals (one operator's, whatever the count) would be most
    # of the per-CompiledModel rate: left out here, counted at the size below.
    _check(doc, jobs_s=60, per_cr="operator_requests_per_cr_per_s_without_lease")


@pytest.mark.scale
def test_a_thousand_models_on_five_hundred_nodes(tmp_path: Path) -> None:
    doc = _benchmark().run(crs=1000, nodes=500, quiet=60.0, timeout=3600.0, work=tmp_path, bystander=True)
    _check(doc, jobs_s=300, per_cr="operator_requests_per_cr_per_s")
    # Namespaces take turns: another tenant's model applied after the 1,000 is not served last.
    assert doc["bystander"]["first_job_s"] < doc["all_jobs_created_s"] / 4, doc
