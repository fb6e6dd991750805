"""KServe's real InferenceService CRD on the real API server, the manifests kompile builds checked
against it, and the rollout state machine driven against the KServe controller's TEST STAND-IN."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from devtools.devcluster import ControlPlane
from kompile.api import parse_manifest
from kompile.api.spec import Target
from kompile.api.status import Artifact, RolloutStatus, TargetStatus
from kompile.operator import rollout
from kompile.operator.targets import GPU_TOLERATION, ResolvedTarget
from tests.support.kserve import CRD_NAME, GROUP, PLURAL, VERSION, KServeControllerStandIn, install_crd

NS = "kserve-standin"
GPU_CLASS = "gpu-nvidia-l4-sm89"
NEVER_READY = "never-ready"
TIMEOUT_S = 600
RT = ResolvedTarget(
    target=Target(name="l4-fp16", backend="tensorrt", precision="fp16"),
    hardware_class=GPU_CLASS,
    gpu=True,
    node_selector={"kubernetes.io/arch": "amd64", "nvidia.com/gpu.compute.major": "8"},
    affinity={
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["L4"]}
                        ]
                    }
                ]
            }
        }
    },
    tolerations=[GPU_TOLERATION],
    resources={"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "16Gi"}},
    runtime_class="nvidia",
)


def winner(name: str) -> TargetStatus:
    return TargetStatus(
        name=name,
        backend="tensorrt",
        precision="fp16",
        phase="Succeeded",
        hardware_class=GPU_CLASS,
        artifact=Artifact(uri=f"s3://art/resnet/{name}", digest="sha256:" + "b" * 64),
    )


def _not_marked(isvc: dict[str, Any]) -> bool:
    """The test's verdict: a model whose storageUri carries the marker never becomes Ready."""
    return NEVER_READY not in json.dumps(isvc["spec"]["predictor"].get("model", {}))


@pytest.fixture(scope="module")
def kserve(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    install_crd(control_plane)
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    try:
        core.create_namespace({"metadata": {"name": NS}})
    except ApiException as err:
        if err.status != 409:
            raise
    # The CompiledModel owning the InferenceServices exists for real, so the garbage collector keeps them.
    doc: dict[str, Any] = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "resnet", "namespace": NS},
        "spec": {
            "source": {"uri": "s3://models/resnet.onnx"},
            "inputs": [{"name": "input", "shape": [1, 3, 8, 8]}],
            "targets": [{"name": "l4-fp16", "backend": "tensorrt", "precision": "fp16"}],
            "registry": {"artifactStore": "s3://art"},
            "rollout": {"enabled": True, "canaryTrafficPercent": 20},
        },
    }
    created = custom.create_namespaced_custom_object("kompile.dev", "v1alpha1", NS, "compiledmodels", doc)
    cm = parse_manifest({**doc, "metadata": {**doc["metadata"], "uid": created["metadata"]["uid"]}})
    with KServeControllerStandIn(control_plane.kubeconfig, NS, ready=_not_marked) as standin:
        yield {"custom": custom, "cm": cm, "standin": standin, "plane": control_plane}
    assert standin.errors == []


def create(f: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    # Strict: an unknown field is an error rather than silently pruned, so the schema check is real.
    obj: dict[str, Any] = f["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, manifest, field_validation="Strict"
    )
    return obj


def patch(f: dict[str, Any], name: str, body: dict[str, Any] | None) -> None:
    assert body is not None
    f["custom"].patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, name, body, field_validation="Strict"
    )


def cond(isvc: dict[str, Any], type_: str = "Ready") -> str | None:
    for c in (isvc.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return str(c["status"])
    return None


def predictor_status(isvc: dict[str, Any]) -> dict[str, Any]:
    return dict(((isvc.get("status") or {}).get("components") or {}).get("predictor") or {})


def observed(isvc: dict[str, Any]) -> bool:
    return bool((isvc.get("status") or {}).get("observedGeneration") == isvc["metadata"]["generation"])


def test_crd_is_established_and_has_spec_canary(kserve: dict[str, Any]) -> None:
    out = kserve["plane"].kubectl("get", "crd", CRD_NAME, "-o", "json").stdout
    crd = json.loads(out)
    established = [c for c in crd["status"]["conditions"] if c["type"] == "Established"]
    assert established and established[0]["status"] == "True"
    assert rollout.crd_supports_spec_canary(crd)  # KServe v0.20: Standard mode has spec.canary


def test_built_inference_service_is_accepted_and_marked_ready(kserve: dict[str, Any]) -> None:
    manifest = rollout.inference_service(
        kserve["cm"], RT, winner("v1"), "plain", "Serverless", None, True, service_account="s3-reader"
    )
    stored = create(kserve, manifest)
    assert stored["spec"]["predictor"] == manifest["spec"]["predictor"]  # nothing pruned or rewritten
    assert stored["metadata"]["ownerReferences"][0]["uid"] == kserve["cm"].metadata.uid
    isvc = kserve["standin"].wait_for("plain", lambda i: cond(i) == "True" and observed(i))
    comp = predictor_status(isvc)
    assert comp["latestReadyRevision"] == comp["latestCreatedRevision"] == "plain-predictor-00001"
    assert comp["traffic"] == [
        {"revisionName": "plain-predictor-00001", "latestRevision": True, "percent": 100}
    ]
    assert isvc["status"]["url"].startswith("http://plain.")
    stable = manifest["spec"]["predictor"]["model"]
    both = rollout.inference_service(
        kserve["cm"], RT, winner("v2"), "both", "Standard", 10, True, stable_model=stable
    )
    assert create(kserve, both)["spec"]["canary"] == both["spec"]["canary"]  # spec.canary passes the schema


def _rolled_out(f: dict[str, Any], name: str, mode: str, uri_of: str) -> RolloutStatus:
    """Create `name` through the state machine and step it until Ready."""
    now = datetime.now(UTC)
    desired = rollout.inference_service(f["cm"], RT, winner(uri_of), name, mode, None, True)
    uri = desired["spec"]["predictor"]["model"]["storageUri"]
    d = rollout.step(None, uri, None, mode, 20, TIMEOUT_S, now, desired=desired, hardware_class=GPU_CLASS)
    assert d.action == "create" and d.body is not None
    create(f, d.body)
    isvc = f["standin"].wait_for(name, lambda i: cond(i) == "True" and observed(i))
    d = rollout.step(d.status, d.status.storage_uri or "", isvc, mode, 20, TIMEOUT_S, now, desired=desired)
    assert d.action == "none" and d.status.phase == "Ready", d.message
    return d.status


def test_canary_splits_traffic_then_is_promoted(kserve: dict[str, Any]) -> None:
    f, name, now = kserve, "canary", datetime.now(UTC)
    current = _rolled_out(f, name, "Serverless", "v1")
    desired = rollout.inference_service(f["cm"], RT, winner("v2"), name, "Serverless", None, True)
    uri = desired["spec"]["predictor"]["model"]["storageUri"]
    d = rollout.step(current, uri, f["standin"].get(name), "Serverless", 20, TIMEOUT_S, now, desired=desired)
    assert d.action == "update" and d.status.phase == "Canary"
    patch(f, name, d.body)
    isvc = f["standin"].wait_for(
        name, lambda i: observed(i) and len(predictor_status(i).get("traffic", [])) == 2
    )
    assert predictor_status(isvc)["traffic"] == [
        {"revisionName": f"{name}-predictor-00002", "latestRevision": True, "percent": 20},
        {"revisionName": f"{name}-predictor-00001", "latestRevision": False, "percent": 80, "tag": "prev"},
    ]
    d = rollout.step(
        d.status, uri, isvc, "Serverless", 20, TIMEOUT_S, now + timedelta(seconds=5), desired=desired
    )
    assert d.action == "promote" and d.status.phase == "Ready"
    patch(f, name, d.body)
    isvc = f["standin"].wait_for(name, lambda i: observed(i) and len(predictor_status(i)["traffic"]) == 1)
    comp = predictor_status(isvc)
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]
    assert comp["traffic"] == [
        {"revisionName": f"{name}-predictor-00002", "latestRevision": True, "percent": 100}
    ]
    assert comp["latestRolledoutRevision"] == f"{name}-predictor-00002"
    assert comp["previousRolledoutRevision"] == f"{name}-predictor-00001"
    assert isvc["metadata"]["labels"]["kompile.dev/target"] == "v2"
    d = rollout.step(
        d.status, uri, isvc, "Serverless", 20, TIMEOUT_S, now + timedelta(seconds=9), desired=desired
    )
    assert d.action == "none" and d.status.phase == "Ready"


def test_a_canary_that_never_becomes_ready_is_rolled_back(kserve: dict[str, Any]) -> None:
    f, name, now = kserve, "bad-canary", datetime.now(UTC)
    current = _rolled_out(f, name, "Serverless", "v1")
    desired = rollout.inference_service(
        f["cm"], RT, winner(f"v2-{NEVER_READY}"), name, "Serverless", None, True
    )
    uri = desired["spec"]["predictor"]["model"]["storageUri"]
    d = rollout.step(current, uri, f["standin"].get(name), "Serverless", 20, TIMEOUT_S, now, desired=desired)
    patch(f, name, d.body)
    isvc = f["standin"].wait_for(name, lambda i: observed(i) and cond(i) == "False")
    comp = predictor_status(isvc)
    assert comp["latestCreatedRevision"] == f"{name}-predictor-00002"
    assert comp["latestReadyRevision"] == f"{name}-predictor-00001"  # the old revision keeps serving all
    assert {t["revisionName"] for t in comp["traffic"]} == {f"{name}-predictor-00001"}
    d = rollout.step(d.status, uri, isvc, "Serverless", 20, TIMEOUT_S, now + timedelta(seconds=60))
    assert d.action == "wait" and d.status.phase == "Canary"
    d = rollout.step(d.status, uri, isvc, "Serverless", 20, TIMEOUT_S, now + timedelta(seconds=TIMEOUT_S))
    assert d.action == "rollback" and d.status.phase == "RolledBack"
    patch(f, name, d.body)
    isvc = f["standin"].wait_for(name, lambda i: observed(i) and cond(i) == "True")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == current.storage_uri
    assert predictor_status(isvc)["latestReadyRevision"] == f"{name}-predictor-00003"
    later = rollout.step(d.status, uri, isvc, "Serverless", 20, TIMEOUT_S, now + timedelta(seconds=700))
    assert later.action == "none" and later.status.phase == "RolledBack"


def test_standard_mode_canary_uses_spec_canary(kserve: dict[str, Any]) -> None:
    f, name, now = kserve, "standard", datetime.now(UTC)
    current = _rolled_out(f, name, "Standard", "v1")
    for version, ready in (("v2", True), (f"v3-{NEVER_READY}", False)):
        desired = rollout.inference_service(f["cm"], RT, winner(version), name, "Standard", None, True)
        uri = desired["spec"]["predictor"]["model"]["storageUri"]
        isvc = f["standin"].get(name)
        d = rollout.step(
            current, uri, isvc, "Standard", 20, TIMEOUT_S, now, desired=desired, spec_canary=True
        )
        assert d.action == "update" and d.status.phase == "Canary" and d.body is not None
        patch(f, name, d.body)  # accepted by the schema: spec.canary exists in KServe v0.20
        isvc = f["standin"].wait_for(name, lambda i: observed(i) and bool(i["status"].get("canaryStatuses")))
        assert isvc["status"]["canaryStatuses"][0]["ready"] is ready
        later = now + timedelta(seconds=TIMEOUT_S)
        d = rollout.step(
            d.status, uri, isvc, "Standard", 20, TIMEOUT_S, later, desired=desired, spec_canary=True
        )
        assert d.action == ("promote" if ready else "rollback")
        patch(f, name, d.body)
        isvc = f["standin"].wait_for(name, lambda i: observed(i) and not i["status"].get("canaryStatuses"))
        assert "canary" not in isvc["spec"] and cond(isvc) == "True"
        current = d.status
    assert isvc["spec"]["predictor"]["model"]["storageUri"].endswith("/v2")  # v3 never served
    assert current.phase == "RolledBack"
    # Promotion renamed the stable predictor to the canary: its Deployment served on, none was made.
    made = [d for d in f["standin"].created if d.startswith(f"{name}-")]
    assert len(made) == len(set(made)) == 3, made
