"""What wakes a reconcile, without a cluster: the fleet index reports only changes of the hardware
classes, a CompiledModel event asks for a reconcile only when its spec is unobserved, and a
CompiledModel is looked at again only while something is in flight."""

from __future__ import annotations

from typing import Any

from kompile.api.resource import CompiledModel
from kompile.api.status import CompiledModelStatus, RolloutStatus, TargetStatus
from kompile.operator.controller import job_decided, needs_reconcile
from kompile.operator.fleet_index import FleetIndex
from kompile.operator.reconcile import requeue_after
from kompile.operator.settings import Settings


def node(name: str, arch: str = "amd64", unschedulable: bool = False, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": arch}},
        "spec": {"unschedulable": unschedulable},
        "status": status,
    }


def test_the_fleet_index_reports_only_changes_of_the_classes() -> None:
    fleet = FleetIndex()
    assert fleet.upsert(node("a"))  # a first class
    assert not fleet.upsert(node("b"))  # another node of it
    assert not fleet.upsert(node("b", heartbeat="later"))  # a heartbeat is not kept
    assert fleet.upsert(node("c", arch="arm64"))  # a new class
    assert [c.name for c in fleet.classes()] == ["cpu-amd64", "cpu-arm64"]
    assert fleet.classes()[0].nodes == ("a", "b")
    assert fleet.upsert(node("c", arch="arm64", unschedulable=True))  # its only node cordoned
    assert not fleet.remove("b") and not fleet.remove("missing")
    assert fleet.remove("a") and fleet.classes() == [] and len(fleet) == 1


def model(generation: int = 1, observed: int | None = 1, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "m", "namespace": "ns", "generation": generation}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {} if observed is None else {"observedGeneration": observed}}


def test_only_an_unobserved_spec_or_a_listing_asks_for_a_reconcile() -> None:
    assert needs_reconcile(None, model())  # listed at start: resume
    assert needs_reconcile("ADDED", model(observed=None))
    assert needs_reconcile("MODIFIED", model(generation=2, observed=1))  # a new spec
    assert not needs_reconcile("MODIFIED", model())  # the operator's own status patch
    assert not needs_reconcile(None, model(deleting=True))  # going: nothing new starts for it
    assert not needs_reconcile("DELETED", model())


CM = CompiledModel.model_validate(
    {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [{"name": "x", "shape": [1, 3]}],
            "fleet": {"enabled": True},
        },
    }
)


def target(phase: str, reason: str | None = None, job: str | None = None) -> TargetStatus:
    return TargetStatus(
        name="t", backend="onnxruntime", precision="fp32", phase=phase, reason=reason, job=job
    )  # type: ignore[arg-type]


def test_a_model_is_looked_at_again_only_while_something_is_in_flight() -> None:
    s = Settings(resync_seconds=10)

    def after(*targets: TargetStatus, settings: Settings = s, **status: Any) -> float | None:
        return requeue_after(CM, CompiledModelStatus(targets=list(targets), **status), settings)

    assert after() is None
    assert after(target("Succeeded"), target("Failed")) is None
    assert after(target("Pending", "StoreUnavailable")) == 10  # no Job: nothing watched announces it
    assert after(target("Running", "AwaitingResult", job="j")) == 10  # the Job ended, the result is not in
    assert after(target("Succeeded"), target("Running", job="j")) == 60  # its end is a watched event
    assert after(target("Pending", "Suspended")) is None  # waits for a spec change
    canary = RolloutStatus(hardware_class="cpu-amd64", phase="Canary", inference_service="m")
    assert after(target("Succeeded"), rollouts=[canary]) == 10
    assert after(target("Succeeded"), rollouts=[canary.model_copy(update={"phase": "Ready"})]) is None
    # With MLflow configured, a generation not yet registered is retried.
    assert (
        after(target("Succeeded"), settings=Settings(resync_seconds=10, tracking_uri="http://mlflow:5000"))
        == 10
    )


def test_only_a_jobs_outcome_or_deletion_wakes_its_owner() -> None:
    running = {"status": {"active": 1, "ready": 1}}
    ended = {"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}}
    assert not job_decided("ADDED", {}) and not job_decided("MODIFIED", running)
    assert job_decided("MODIFIED", ended) and job_decided("DELETED", running)
    assert not job_decided("MODIFIED", {"status": {"conditions": [{"type": "Suspended", "status": "False"}]}})
