"""Registry end to end: the operator on the real control plane, artifacts in a real S3 server
(versitygw), lineage in a real MLflow server. One target compiles for real on the kubelet
stand-in's node; a GPU target is reported by its KWOK pod (TEST STAND-IN for a GPU compile)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from mlflow import MlflowClient

from devtools.devcluster import ControlPlane
from tests.integration.fleet import (
    KwokReporter,
    OperatorProcess,
    publishing_decide,
    small_cnn_manifest,
    tenant_with_store,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn
from tests.support.kserve import KServeControllerStandIn, install_crd
from tests.support.servers import MlflowServer, S3Server

NS = "kompile-e2e"
BUCKET = "kompile-e2e"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
CPU_CLASS = "cpu-amd64-avx2"
GPU_CLASS = "gpu-nvidia-l4-sm89"


@pytest.fixture(scope="module")
def e2e(
    control_plane: ControlPlane,
    sim_fleet: KubeletStandIn,
    s3_server: S3Server,
    mlflow_server: MlflowServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("e2e")
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    creds = tenant_with_store(core, NS, s3_server, BUCKET)
    decide = publishing_decide(s3_server.endpoint, creds, p50=0.5)
    reporter = KwokReporter(control_plane.kubeconfig, NS, decide).start()
    # The operator gets no S3 keys of its own: it reads the Secret the CompiledModel names.
    op = OperatorProcess(control_plane.kubeconfig, NS, "s3://unused/", work / "operator.log").start()
    try:
        yield {"core": core, "custom": custom, "s3": s3_server, "mlflow": mlflow_server, "op": op}
    finally:
        op.stop()
        reporter.stop()
        print(f"\ne2e operator log: {work / 'operator.log'}")


def manifest(name: str, mlflow_uri: str, endpoint: str, targets: list[dict[str, Any]]) -> dict[str, Any]:
    registry = {
        "trackingUri": mlflow_uri,
        "artifactStore": f"s3://{BUCKET}/store",
        "s3Endpoint": endpoint,
        "credentialsSecret": {"name": "s3-creds"},
        "modelName": f"{name}-model",
    }
    return small_cnn_manifest(name, targets=targets, registry=registry)


CPU = {
    "name": "cpu",
    "backend": "onnxruntime",
    "precision": "fp32",
    "hardware": {"nodeSelector": {"feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}},
}
CPU_STRICT = {
    "name": "cpu-int8-strict",
    "backend": "onnxruntime",
    "precision": "int8",
    "tolerances": {"minCosine": 1.0, "maxAbsError": 0.0},
    "hardware": {"nodeSelector": {"feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}},
}
GPU = {
    "name": "l4",
    "backend": "tensorrt",
    "precision": "fp16",
    "hardware": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
}


def settled(e2e: dict[str, Any], name: str) -> dict[str, Any] | None:
    obj: dict[str, Any] = e2e["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    status = obj.get("status") or {}
    done = status.get("targets") and all(t["phase"] in ("Succeeded", "Failed") for t in status["targets"])
    return obj if done and (status.get("registry") or {}).get("runId") else None


def test_artifacts_land_in_s3_and_lineage_in_mlflow(e2e: dict[str, Any]) -> None:
    s3, mlflow = e2e["s3"], e2e["mlflow"]
    doc = manifest("lineage", mlflow.tracking_uri, s3.endpoint, [CPU, CPU_STRICT, GPU])
    e2e["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, doc)
    obj = wait_for("targets settled and registered", lambda: settled(e2e, "lineage"), timeout=300)
    status = obj["status"]
    targets = {t["name"]: t for t in status["targets"]}
    assert targets["cpu"]["phase"] == "Succeeded" and targets["l4"]["phase"] == "Succeeded"
    assert targets["cpu-int8-strict"]["reason"] == "ValidationFailed"
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(obj) and s3.secret_key not in json.dumps(obj)

    # The real compile's artifact is in S3 in the Triton layout, at its content address.
    uri = targets["cpu"]["artifact"]["uri"]
    assert uri.startswith(f"s3://{BUCKET}/store/cache/")
    prefix = uri.removeprefix(f"s3://{BUCKET}/")
    keys = {
        o["Key"].removeprefix(prefix + "/")
        for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    }
    # The Triton model folder is named after the CompiledModel: the name KServe serves it under.
    assert {"lineage/config.pbtxt", "lineage/1/model.onnx", "result.json"} <= keys, keys

    ml = MlflowClient(tracking_uri=mlflow.tracking_uri)
    parent = ml.get_run(status["registry"]["runId"])
    tags = parent.data.tags
    assert tags["kompile.namespace"] == NS and tags["kompile.name"] == "lineage"
    assert tags["kompile.uid"] == obj["metadata"]["uid"] and tags["kompile.generation"] == "1"
    assert tags["kompile.source_uri"] == "python://models.small:small_cnn"
    children = ml.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    by_target = {r.data.tags["kompile.target"]: r for r in children}
    assert set(by_target) == {"cpu", "cpu-int8-strict", "l4"}
    cpu_run = by_target["cpu"]
    assert (
        cpu_run.data.params["backend"] == "onnxruntime" and cpu_run.data.params["hardware_class"] == CPU_CLASS
    )
    assert {"p50_ms", "p99_ms", "throughput", "speedup", "max_abs_error", "min_cosine"} <= set(
        cpu_run.data.metrics
    )

    versions = {v.tags["kompile.target"]: v for v in ml.search_model_versions("name='lineage-model'")}
    assert set(versions) == {"cpu", "cpu-int8-strict", "l4"}
    assert versions["cpu"].source == uri
    assert versions["cpu-int8-strict"].tags["kompile.verdict"] == "failed"
    aliases = ml.get_registered_model("lineage-model").aliases
    # One alias per hardware class, on the validated winner; the failed version is never aliased.
    assert aliases == {CPU_CLASS: versions["cpu"].version, GPU_CLASS: versions["l4"].version}


# -- rollout to KServe (InferenceService CRD installed, KServe controller stood in) -----------------

NEVER_READY = {"on": False}
"""While on, new revisions the KServe stand-in sees never become Ready (a broken canary)."""


@pytest.fixture(scope="module")
def kserve(control_plane: ControlPlane, e2e: dict[str, Any]) -> Iterator[KServeControllerStandIn]:
    install_crd(control_plane)
    standin = KServeControllerStandIn(
        control_plane.kubeconfig, NS, ready=lambda isvc: not NEVER_READY["on"]
    ).start()
    try:
        yield standin
    finally:
        standin.stop()
        assert not standin.errors, standin.errors


def _rollout(e2e: dict[str, Any], name: str, phase: str, generation: int) -> dict[str, Any] | None:
    obj: dict[str, Any] = e2e["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    status = obj.get("status") or {}
    if status.get("observedGeneration") != generation:
        return None
    rollouts = {r["hardwareClass"]: r for r in status.get("rollouts", [])}
    return obj if rollouts.get(CPU_CLASS, {}).get("phase") == phase else None


def _isvc(e2e: dict[str, Any], name: str) -> dict[str, Any]:
    obj: dict[str, Any] = e2e["custom"].get_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", NS, "inferenceservices", name
    )
    return obj


def _alias(e2e: dict[str, Any], model: str) -> str | None:
    aliases: dict[str, str] = (
        MlflowClient(tracking_uri=e2e["mlflow"].tracking_uri).get_registered_model(model).aliases
    )
    return aliases.get(CPU_CLASS)


def _patch_spec(e2e: dict[str, Any], name: str, spec: dict[str, Any]) -> None:
    e2e["custom"].patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, {"spec": spec})


def test_rollout_canary_promotion_rollback_and_gate(
    e2e: dict[str, Any], kserve: KServeControllerStandIn
) -> None:
    s3, mlflow = e2e["s3"], e2e["mlflow"]
    doc = manifest("serving", mlflow.tracking_uri, s3.endpoint, [CPU])
    doc["spec"]["rollout"] = {
        "enabled": True,
        "deploymentMode": "Serverless",
        "canaryTrafficPercent": 20,
        "canaryTimeoutSeconds": 15,
        "gate": {"minSpeedup": 0.1},
    }
    e2e["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, doc)
    timings: dict[str, float] = {}

    # 1. First rollout: created and Ready; the alias follows only then.
    obj = wait_for("first rollout Ready", lambda: _rollout(e2e, "serving", "Ready", 1), timeout=300)
    isvc = _isvc(e2e, "serving")
    model = isvc["spec"]["predictor"]["model"]
    first_uri = obj["status"]["targets"][0]["artifact"]["uri"]
    assert model["storageUri"] == first_uri and model["runtime"] == "kserve-tritonserver"
    assert model["modelFormat"]["name"] == "onnx"
    assert isvc["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    first_version = obj["status"]["targets"][0]["registeredVersion"]
    assert _alias(e2e, "serving-model") == first_version

    # 2. A new generation goes through a canary and is promoted.
    began = time.monotonic()
    _patch_spec(e2e, "serving", {"validation": {"samples": 3}})
    canary = wait_for("canary", lambda: _rollout(e2e, "serving", "Canary", 2), timeout=300)
    # Read from the status snapshot that said Canary: the InferenceService itself may already be
    # promoted by the time a second read reaches it (the stand-in makes canaries Ready at once).
    (entry,) = canary["status"]["rollouts"]
    assert entry["canaryTrafficPercent"] == 20 and entry["previousStorageUri"] == first_uri
    assert _isvc(e2e, "serving")["spec"]["predictor"].get("canaryTrafficPercent") in (20, None)
    obj = wait_for("promoted", lambda: _rollout(e2e, "serving", "Ready", 2), timeout=120)
    timings["new_generation_to_promoted_s"] = round(time.monotonic() - began, 1)
    second_uri = obj["status"]["targets"][0]["artifact"]["uri"]
    predictor = _isvc(e2e, "serving")["spec"]["predictor"]
    assert second_uri != first_uri and predictor["model"]["storageUri"] == second_uri
    assert "canaryTrafficPercent" not in predictor
    second_version = obj["status"]["targets"][0]["registeredVersion"]
    assert _alias(e2e, "serving-model") == second_version != first_version

    # 3. A canary that never becomes Ready is rolled back; the old revision keeps serving.
    NEVER_READY["on"] = True
    began = time.monotonic()
    _patch_spec(e2e, "serving", {"validation": {"samples": 4}})
    obj = wait_for("rolled back", lambda: _rollout(e2e, "serving", "RolledBack", 3), timeout=300)
    timings["bad_canary_to_rolled_back_s"] = round(time.monotonic() - began, 1)
    NEVER_READY["on"] = False
    predictor = _isvc(e2e, "serving")["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == second_uri and "canaryTrafficPercent" not in predictor
    assert _alias(e2e, "serving-model") == second_version
    events = {
        e.reason
        for e in e2e["core"].list_namespaced_event(NS, field_selector="involvedObject.name=serving").items
    }
    assert {"RolloutCreate", "RolloutUpdate", "RolloutPromote", "RolloutRollback", "AliasMoved"} <= events

    # 4. A validation failure changes no InferenceService and moves no alias.
    strict = dict(CPU, precision="int8", tolerances={"minCosine": 1.0, "maxAbsError": 0.0})
    _patch_spec(e2e, "serving", {"targets": [strict]})
    obj = wait_for("blocked by validation", lambda: _rollout(e2e, "serving", "Blocked", 4), timeout=300)
    assert "no validated target" in obj["status"]["rollouts"][0]["message"]
    assert _isvc(e2e, "serving")["spec"]["predictor"]["model"]["storageUri"] == second_uri
    assert _alias(e2e, "serving-model") == second_version
    print(f"\nrollout timings: {json.dumps(timings)}")


def test_gitops_mode_writes_manifests_instead_of_applying(
    e2e: dict[str, Any], kserve: KServeControllerStandIn
) -> None:
    s3, mlflow = e2e["s3"], e2e["mlflow"]
    doc = manifest("gitops", mlflow.tracking_uri, s3.endpoint, [CPU])
    doc["spec"]["rollout"] = {"enabled": True, "gitops": {"configMap": "gitops-inferenceservices"}}
    e2e["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, doc)
    wait_for("written", lambda: _rollout(e2e, "gitops", "Written", 1), timeout=300)
    data = e2e["core"].read_namespaced_config_map("gitops-inferenceservices", NS).data
    (text,) = data.values()
    written = yaml.safe_load(text)
    assert written["kind"] == "InferenceService" and "ownerReferences" not in written["metadata"]
    assert written["spec"]["predictor"]["model"]["runtime"] == "kserve-tritonserver"
    with pytest.raises(ApiException) as err:
        _isvc(e2e, "gitops")
    assert err.value.status == 404
