"""A Job's outcome is shown in status without waiting on MLflow: the pass taken for it (the work
queue's urgent lane) settles the target, holds Ready at Unknown (Registering) and asks for another
pass at once; that ordinary pass records the generation in MLflow and only then is Ready True, with
one Event. The cluster is stood in at the edge (tests.unit.test_tenant_isolation.RecordingKube),
the store is a real file store and MLflow a real server."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from kompile.operator.jobs import ANNOTATION_PREFIX
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings
from tests.support.servers import MlflowServer
from tests.unit.test_tenant_isolation import RecordingKube, _validated_entry, doc


def _condition(patch: dict[str, object], type_: str) -> tuple[str, str]:
    (cond,) = [c for c in patch["conditions"] if c["type"] == type_]  # type: ignore[attr-defined]
    return cond["status"], cond["reason"]


def test_the_outcome_pass_leaves_mlflow_to_the_next_one(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    settings = Settings(artifact_store=(tmp_path / "store").as_uri(), tracking_uri=mlflow_server.tracking_uri)
    spec = {"registry": {"modelName": "quick-outcome"}}
    first = RecordingKube()
    reconcile(doc("team-q", "u-q", **spec), first, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
    (job,) = first.jobs
    _validated_entry(job["metadata"]["annotations"][ANNOTATION_PREFIX])  # the compile pod's result

    # The outcome's pass (here the result is found as a cache hit: the same first settling).
    kube, events = RecordingKube(), []
    quick = reconcile(
        doc("team-q", "u-q2", **spec),
        kube,  # type: ignore[arg-type]
        settings,
        lambda *e: events.append(e),
        classes=[],
        quick=True,
    )
    patch = kube.patches[-1]
    assert patch["targets"][0]["phase"] == "Succeeded"
    assert _condition(patch, "Ready") == ("Unknown", "Registering")
    assert _condition(patch, "Registered") == ("Unknown", "Pending")
    assert quick.requeue_after == 0.0
    assert [e[1] for e in events] == ["CacheHit"]  # the target's; no Ready transition to announce yet
    client = MlflowClient(mlflow_server.tracking_uri)
    assert not client.search_registered_models(filter_string="name = 'quick-outcome'")

    # The ordinary pass right after, on the status the quick one wrote.
    again = doc("team-q", "u-q2", **spec) | {"status": patch}
    kube = RecordingKube()
    outcome = reconcile(again, kube, settings, lambda *e: events.append(e), classes=[])  # type: ignore[arg-type]
    patch = kube.patches[-1]
    assert _condition(patch, "Registered") == ("True", "Registered")
    assert _condition(patch, "Ready") == ("True", "Validated")
    assert [e[1] for e in events if e[1] == "Validated"] == ["Validated"]
    assert outcome.status.registry is not None and outcome.status.registry.run_id
    assert client.get_run(outcome.status.registry.run_id).data.tags["kompile.run"] == "generation"


def test_a_quick_pass_with_nothing_newly_settled_registers_as_usual(
    tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    """A retry (a Job deleted, the registry back) settles nothing new: nothing to show first."""
    settings = Settings(artifact_store=(tmp_path / "store").as_uri(), tracking_uri=mlflow_server.tracking_uri)
    spec = {"registry": {"modelName": "quick-retry"}}
    first = RecordingKube()
    reconcile(doc("team-r", "u-r", **spec), first, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
    _validated_entry(first.jobs[0]["metadata"]["annotations"][ANNOTATION_PREFIX])
    kube = RecordingKube()
    reconcile(doc("team-r", "u-r2", **spec), kube, settings, lambda *e: None, classes=[], quick=True)  # type: ignore[arg-type]
    settled = doc("team-r", "u-r2", **spec) | {"status": kube.patches[-1]}
    kube = RecordingKube()
    outcome = reconcile(settled, kube, settings, lambda *e: None, classes=[], quick=True)  # type: ignore[arg-type]
    assert outcome.requeue_after != 0.0
    assert _condition(kube.patches[-1], "Ready") == ("True", "Validated")
