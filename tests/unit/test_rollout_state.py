"""The rollout state machine: each transition, in Serverless (canaryTrafficPercent) and Standard
(spec.canary, or a direct rollout where KServe has no traffic splitting) modes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from kompile.api.status import RolloutStatus
from kompile.operator import rollout
from kompile.operator.rollout_state import canary_predictor_name
from tests.unit.test_rollout import GPU_CLASS, NEW, NEW_T, NOW, OLD, gpu_rt, model


def desired(mode: str = "Serverless") -> dict[str, Any]:
    return rollout.inference_service(model(), gpu_rt(), NEW_T, "resnet", mode, None, True)


def isvc_doc(
    uri: str,
    *,
    mode: str = "Knative",
    generation: int = 1,
    observed: int | None = 1,
    ready: bool = True,
    created: int = 1,
    latest_ready: int = 1,
    canary: int | None = None,
    spec_canary: list[dict[str, Any]] | None = None,
    canary_ready: bool | None = None,
    predictor_reason: str = "NewReplicaSetAvailable",
) -> dict[str, Any]:
    """An InferenceService as KServe reports it (Knative revisions only in Serverless modes)."""
    predictor: dict[str, Any] = {"model": {"modelFormat": {"name": "tensorrt"}, "storageUri": uri}}
    if canary is not None:
        predictor["canaryTrafficPercent"] = canary
    spec: dict[str, Any] = {"predictor": predictor}
    status: dict[str, Any] = {
        "observedGeneration": observed,
        "deploymentMode": mode,
        "conditions": [
            {"type": "Ready", "status": "True" if ready else "False", "reason": "R", "message": "m"},
            {"type": "PredictorReady", "status": "True" if ready else "False", "reason": predictor_reason},
        ],
    }
    if mode == "Knative":
        status["components"] = {
            "predictor": {
                "latestCreatedRevision": f"resnet-predictor-{created:05d}",
                "latestReadyRevision": f"resnet-predictor-{latest_ready:05d}",
            }
        }
    if spec_canary is not None:
        spec["canary"] = spec_canary
        name = spec_canary[0]["predictor"]["name"]
        status["canaryStatuses"] = [{"name": name, "ready": bool(canary_ready), "trafficPercent": 10}]
    meta = {"name": "resnet", "generation": generation}
    return {"metadata": meta, "spec": spec, "status": status}


def ready_status(uri: str = OLD, mode: str = "Knative") -> RolloutStatus:
    return RolloutStatus(
        hardware_class=GPU_CLASS,
        phase="Ready",
        storage_uri=uri,
        deployment_mode=mode,
        started_at="2026-05-01T11:00:00Z",
        message="Ready",
    )


def test_first_rollout_creates_without_canary_then_turns_ready() -> None:
    with_canary = rollout.inference_service(model(), gpu_rt(), NEW_T, "resnet", "Serverless", 20, True)
    d = rollout.step(
        None, NEW, None, "Serverless", 20, 600, NOW, desired=with_canary, hardware_class=GPU_CLASS
    )
    assert d.action == "create" and d.status.phase == "Progressing" and d.body is not None
    assert "canaryTrafficPercent" not in d.body["spec"]["predictor"]  # nothing to compare a canary with
    assert d.status.started_at == "2026-05-01T12:00:00Z" and d.status.hardware_class == GPU_CLASS
    assert d.status.target == "new" and d.status.inference_service == "resnet" and d.status.storage_uri == NEW
    pending = isvc_doc(NEW, observed=None, ready=False)
    d = rollout.step(d.status, NEW, pending, "Serverless", 20, 600, NOW + timedelta(seconds=5))
    assert d.action == "wait" and d.status.phase == "Progressing" and "not observed" in d.message
    d = rollout.step(d.status, NEW, isvc_doc(NEW), "Serverless", 20, 600, NOW + timedelta(seconds=9))
    assert d.action == "none" and d.status.phase == "Ready" and d.status.deployment_mode == "Knative"
    again = rollout.step(d.status, NEW, isvc_doc(NEW), "Serverless", 20, 600, NOW + timedelta(seconds=30))
    assert again.action == "none" and again.status == d.status


def test_first_rollout_never_ready_fails_with_nothing_to_roll_back() -> None:
    d = rollout.step(None, NEW, None, "Serverless", None, 60, NOW, desired=desired())
    d = rollout.step(
        d.status,
        NEW,
        isvc_doc(NEW, ready=False, latest_ready=0),
        "Serverless",
        None,
        60,
        NOW + timedelta(seconds=61),
    )
    assert d.action == "wait" and d.status.phase == "Failed" and "nothing to roll back to" in d.message


def test_serverless_canary_is_promoted_once_its_revision_is_ready() -> None:
    d = rollout.step(ready_status(), NEW, isvc_doc(OLD), "Serverless", 10, 600, NOW, desired=desired())
    assert d.action == "update" and d.status.phase == "Canary" and d.body is not None
    assert d.body["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert d.body["spec"]["predictor"]["model"]["storageUri"] == NEW
    assert d.body["spec"]["predictor"]["model"]["runtime"] == "kserve-tritonserver"
    assert d.status.previous_storage_uri == OLD and d.status.canary_traffic_percent == 10
    started = d.status.started_at
    split = isvc_doc(NEW, canary=10, generation=2, observed=2, ready=False, created=2, latest_ready=1)
    d = rollout.step(d.status, NEW, split, "Serverless", 10, 600, NOW + timedelta(seconds=60))
    assert d.action == "wait" and d.status.phase == "Canary" and d.status.started_at == started
    assert "resnet-predictor-00002 is not Ready" in d.message
    good = isvc_doc(NEW, canary=10, generation=2, observed=2, created=2, latest_ready=2)
    d = rollout.step(
        d.status, NEW, good, "Serverless", 10, 600, NOW + timedelta(seconds=90), desired=desired()
    )
    assert d.action == "promote" and d.status.phase == "Ready" and d.body is not None
    assert d.body["spec"] == {"predictor": {"canaryTrafficPercent": None}}  # null deletes: 100% latest
    assert d.body["metadata"]["labels"]["kompile.dev/target"] == "new"
    unseen = isvc_doc(NEW, generation=3, observed=2, created=2, latest_ready=2)
    waiting = rollout.step(d.status, NEW, unseen, "Serverless", 10, 600, NOW + timedelta(seconds=91))
    assert waiting.action == "wait" and waiting.status.phase == "Ready"
    seen = isvc_doc(NEW, generation=3, observed=3, created=2, latest_ready=2)
    assert (
        rollout.step(d.status, NEW, seen, "Serverless", 10, 600, NOW + timedelta(seconds=95)).action == "none"
    )


def test_serverless_canary_not_ready_in_time_is_rolled_back_and_not_retried() -> None:
    d = rollout.step(ready_status(), NEW, isvc_doc(OLD), "Serverless", 10, 600, NOW, desired=desired())
    split = isvc_doc(NEW, canary=10, generation=2, observed=2, ready=False, created=2, latest_ready=1)
    d = rollout.step(d.status, NEW, split, "Serverless", 10, 600, NOW + timedelta(seconds=600))
    assert d.action == "rollback" and d.status.phase == "RolledBack" and d.body is not None
    assert d.body["spec"]["predictor"] == {"canaryTrafficPercent": None, "model": {"storageUri": OLD}}
    assert "not Ready within 600s" in d.message and OLD in d.message
    assert d.status.storage_uri == NEW and d.status.previous_storage_uri == OLD
    restored = isvc_doc(OLD, generation=3, observed=3, created=3, latest_ready=3)
    later = rollout.step(d.status, NEW, restored, "Serverless", 10, 600, NOW + timedelta(seconds=700))
    assert later.action == "none" and later.status.phase == "RolledBack"
    retry = rollout.step(None, NEW, restored, "Serverless", 10, 600, NOW + timedelta(seconds=800))
    assert retry.action == "update" and retry.status.phase == "Canary"


def test_canary_with_unknown_previous_model_rolls_back_the_kserve_way() -> None:
    current = RolloutStatus(
        hardware_class=GPU_CLASS, phase="Canary", storage_uri=NEW, started_at="2026-05-01T11:00:00Z"
    )
    split = isvc_doc(NEW, canary=10, ready=False, created=2, latest_ready=1)
    d = rollout.step(current, NEW, split, "Serverless", 10, 600, NOW)
    assert d.action == "rollback" and d.body == {"spec": {"predictor": {"canaryTrafficPercent": 0}}}


def test_the_mode_recorded_on_the_inference_service_wins() -> None:
    d = rollout.step(ready_status(), NEW, isvc_doc(OLD, mode="Knative"), "Standard", 10, 600, NOW)
    assert d.status.phase == "Canary" and d.status.deployment_mode == "Knative"
    assert d.body is not None and d.body["spec"]["predictor"]["canaryTrafficPercent"] == 10


def test_standard_mode_without_spec_canary_rolls_out_directly_and_says_so() -> None:
    old = isvc_doc(OLD, mode="Standard")
    d = rollout.step(
        ready_status(mode="Standard"), NEW, old, "Standard", 10, 600, NOW, desired=desired("Standard")
    )
    assert d.action == "update" and d.status.phase == "Progressing" and d.body is not None
    assert "canaryTrafficPercent" not in d.body["spec"]["predictor"] and "canary" not in d.body["spec"]
    assert d.body["spec"]["predictor"]["model"]["storageUri"] == NEW
    assert "no canary" in d.message and d.status.canary_traffic_percent is None
    rolling = isvc_doc(NEW, mode="Standard", predictor_reason="MinimumReplicasAvailable")
    w = rollout.step(d.status, NEW, rolling, "Standard", 10, 600, NOW + timedelta(seconds=30))
    assert w.action == "wait" and w.status.phase == "Progressing" and "still rolling out" in w.message
    late = rollout.step(w.status, NEW, rolling, "Standard", 10, 600, NOW + timedelta(seconds=601))
    assert late.action == "rollback" and late.status.phase == "RolledBack" and late.body is not None
    assert late.body == {"spec": {"predictor": {"model": {"storageUri": OLD}}}}
    done = rollout.step(w.status, NEW, isvc_doc(NEW, mode="Standard"), "Standard", 10, 600, NOW)
    assert done.action == "none" and done.status.phase == "Ready"


def test_standard_mode_spec_canary_promotes_by_renaming_and_rolls_back_by_removing() -> None:
    cur, old = ready_status(mode="Standard"), isvc_doc(OLD, mode="Standard")
    d = rollout.step(cur, NEW, old, "Standard", 10, 600, NOW, desired=desired("Standard"), spec_canary=True)
    assert d.action == "update" and d.status.phase == "Canary" and d.body is not None
    entry = d.body["spec"]["canary"][0]
    assert entry["trafficPercent"] == 10 and entry["predictor"]["name"] == canary_predictor_name(NEW)
    assert entry["predictor"]["model"]["storageUri"] == NEW and "predictor" not in d.body["spec"]
    pending = isvc_doc(OLD, mode="Standard", spec_canary=[entry], canary_ready=False)
    w = rollout.step(
        d.status, NEW, pending, "Standard", 10, 600, NOW + timedelta(seconds=5), spec_canary=True
    )
    assert w.action == "wait" and w.status.phase == "Canary" and w.status.previous_storage_uri == OLD
    good = isvc_doc(OLD, mode="Standard", spec_canary=[entry], canary_ready=True)
    p = rollout.step(w.status, NEW, good, "Standard", 10, 600, NOW + timedelta(seconds=9), spec_canary=True)
    assert p.action == "promote" and p.status.phase == "Ready" and p.body is not None
    assert p.body["spec"]["canary"] is None
    promoted = p.body["spec"]["predictor"]
    assert promoted["name"] == entry["predictor"]["name"] and promoted["model"]["storageUri"] == NEW
    assert entry["predictor"]["model"]["name"] == "kserve-container"  # v0.20's CRD requires it there
    assert "name" not in promoted["model"]  # ... and KServe's webhook refuses it on the stable one
    r = rollout.step(
        w.status, NEW, pending, "Standard", 10, 600, NOW + timedelta(seconds=600), spec_canary=True
    )
    assert r.action == "rollback" and r.body == {"spec": {"canary": None}} and r.status.phase == "RolledBack"


def test_step_refuses_naive_time_and_a_manifest_for_another_model() -> None:
    with pytest.raises(ValueError, match="timezone"):
        rollout.step(None, NEW, None, "Serverless", None, 60, datetime(2026, 5, 1))
    with pytest.raises(ValueError, match="not s3://elsewhere"):
        rollout.step(
            ready_status(), "s3://elsewhere", isvc_doc(OLD), "Serverless", None, 60, NOW, desired=desired()
        )
