"""Tenants against each other and against the operator: the real control plane, the operator as a
real process holding an MLflow token and AWS keys of its own, a real MLflow server, and two
namespaces. Each test plays a tenant that tries to take something: the operator's credentials
(a capture server on loopback as trackingUri / s3Endpoint records every request's headers), a
Secret it was not granted, another team's ConfigMap, another namespace's MLflow model, or the
operator's attention (a spec too large, too many targets). GPU compiles are reported by KWOK pods
(TEST STAND-IN for a GPU compile container)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from mlflow import MlflowClient

from devtools.devcluster import ControlPlane
from tests.integration.fleet import (
    KwokReporter,
    OperatorProcess,
    kwok_node,
    publish_entry,
    small_cnn_manifest,
    success_result,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn
from tests.support.servers import MlflowServer

NS_A, NS_B = "kompile-hostile-a", "kompile-hostile-b"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
OPERATOR_TOKEN = "operator-mlflow-token-0f3c9a"
OPERATOR_KEY_ID = "AKIAOPERATOR0F3C9A00"
OPERATOR_SECRET = "operator-secret-key-0f3c9a-do-not-leak"
TENANT_KEY_ID = "AKIATENANTB7E21D0000"
GRANTED_SECRET = "tenant-s3"
L4 = {
    "name": "l4",
    "backend": "tensorrt",
    "precision": "fp16",
    "hardware": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
}


class CaptureServer:
    """TEST STAND-IN for a tenant's own host: answers every request 404 and records its method,
    path and headers."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers)})
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> CaptureServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _decide(pod: dict[str, Any]) -> tuple[int, str]:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    t = json.loads(env["KOMPILE_TARGET"])
    prefix = env["KOMPILE_ARTIFACT_PREFIX"]
    # The entry goes to the operator's file store; the reported artifact is named as S3 would hold
    # it, since the MLflow server refuses a model version whose source is a local path.
    uri = prefix.replace("file:///", "s3://stand-in/")
    compact = success_result(t["name"], t["backend"], t.get("precision", "fp32"), artifact_uri=uri)
    publish_entry(prefix, compact)
    return 0, compact


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"metadata": {"name": name}, "data": encoded}


@pytest.fixture(scope="module")
def hostile(
    control_plane: ControlPlane,
    sim_fleet: KubeletStandIn,
    mlflow_server: MlflowServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("hostile")
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core, custom, batch = client.CoreV1Api(api), client.CustomObjectsApi(api), client.BatchV1Api(api)
    for ns in (NS_A, NS_B):
        core.create_namespace({"metadata": {"name": ns}})
    tenant_keys = {"AWS_ACCESS_KEY_ID": TENANT_KEY_ID, "AWS_SECRET_ACCESS_KEY": "tenant-secret"}
    core.create_namespaced_secret(NS_A, _secret(GRANTED_SECRET, tenant_keys))
    core.create_namespaced_secret(NS_A, _secret("db-password", {"PASSWORD": "hunter2"}))
    reporters = [KwokReporter(control_plane.kubeconfig, ns, _decide).start() for ns in (NS_A, NS_B)]
    operator_env = {
        "MLFLOW_TRACKING_URI": mlflow_server.tracking_uri,
        "MLFLOW_TRACKING_TOKEN": OPERATOR_TOKEN,
        "AWS_ACCESS_KEY_ID": OPERATOR_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": OPERATOR_SECRET,
        "KOMPILE_ALLOWED_SECRETS": GRANTED_SECRET,
    }
    op = OperatorProcess(
        control_plane.kubeconfig,
        f"{NS_A},{NS_B}",
        (work / "store").as_uri(),
        work / "operator.log",
        extra_env=operator_env,
    )
    # The test's own environment wins in OperatorProcess: these must be the operator's.
    assert all(op.env[k] == v for k, v in operator_env.items()), "unset these in the test environment"
    op.start()
    try:
        yield {"core": core, "custom": custom, "batch": batch, "mlflow": mlflow_server, "log": work}
    finally:
        op.stop()
        for reporter in reporters:
            reporter.stop()
        print(f"\nhostile-tenants operator log: {work / 'operator.log'}")


def _create(h: dict[str, Any], namespace: str, name: str, **spec: Any) -> None:
    doc = small_cnn_manifest(name, **{"targets": [L4], **spec})
    h["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)


def _get(h: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = h["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return obj


def _ready(h: dict[str, Any], namespace: str, name: str, reason: str) -> dict[str, Any] | None:
    """The Ready condition once it is False with `reason`."""
    for cond in (_get(h, namespace, name).get("status") or {}).get("conditions", []):
        if cond["type"] == "Ready" and cond["status"] == "False" and cond["reason"] == reason:
            return dict(cond)
    return None


def _sees_class(h: dict[str, Any], name: str) -> bool:
    """The operator's last fleet log line names the hardware class."""
    log = (h["log"] / "operator.log").read_text()
    lines = [ln for ln in log.splitlines() if "hardware classes now" in ln]
    return bool(lines) and name in lines[-1]


def _jobs(h: dict[str, Any], namespace: str, name: str | None = None) -> list[Any]:
    selector = f"kompile.dev/compiledmodel={name}" if name else None
    items: list[Any] = h["batch"].list_namespaced_job(namespace, label_selector=selector).items
    return items


# -- the operator's credentials ---------------------------------------------------------------------


def test_a_capture_endpoint_never_receives_the_operators_credentials(hostile: dict[str, Any]) -> None:
    with CaptureServer() as capture:
        # As trackingUri: refused, since MLflow's client would send the operator's token there.
        _create(hostile, NS_A, "capture-mlflow", registry={"trackingUri": capture.url})
        cond = wait_for("refused", lambda: _ready(hostile, NS_A, "capture-mlflow", "EndpointNotAllowed"))
        assert "holds MLflow credentials" in cond["message"]
        # As s3Endpoint without a Secret of its own: refused (the operator's keys are for its store).
        bare = {"s3Endpoint": capture.url, "artifactStore": "s3://tenant/store"}
        _create(hostile, NS_A, "capture-s3-bare", registry=bare)
        cond = wait_for("refused", lambda: _ready(hostile, NS_A, "capture-s3-bare", "EndpointNotAllowed"))
        assert "spec.registry.credentialsSecret" in cond["message"]
        # As s3Endpoint with the tenant's granted Secret: allowed (loopback is on the allow-list)
        # and reached, with the tenant's keys only. Suspended: the cache lookup, no Job.
        own = bare | {"credentialsSecret": {"name": GRANTED_SECRET}}
        _create(hostile, NS_A, "capture-s3-own", registry=own, suspend=True)
        wait_for("the store looked up", lambda: capture.requests, timeout=60)
        time.sleep(5)  # a few resyncs more
    assert not _jobs(hostile, NS_A, "capture-s3-own")
    sent = json.dumps(capture.requests)
    for credential in (OPERATOR_TOKEN, OPERATOR_KEY_ID, OPERATOR_SECRET):
        assert credential not in sent, f"the operator's {credential[:12]}... reached the capture server"
    signed = [r for r in capture.requests if "Authorization" in r["headers"]]
    assert signed and all(TENANT_KEY_ID in r["headers"]["Authorization"] for r in signed), signed


def test_a_secret_outside_the_grant_never_reaches_a_job(hostile: dict[str, Any]) -> None:
    _create(hostile, NS_A, "foreign-secret", registry={"credentialsSecret": {"name": "db-password"}})
    cond = wait_for("refused", lambda: _ready(hostile, NS_A, "foreign-secret", "EndpointNotAllowed"))
    assert "'db-password' is not one the operator is allowed to use" in cond["message"]
    time.sleep(5)  # a few resyncs: still nothing
    assert not _jobs(hostile, NS_A, "foreign-secret")
    env_from = [
        ref.secret_ref.name
        for job in _jobs(hostile, NS_A)
        for container in job.spec.template.spec.containers
        for ref in container.env_from or []
        if ref.secret_ref is not None
    ]
    assert "db-password" not in env_from


# -- what belongs to someone else -------------------------------------------------------------------


def test_an_existing_configmap_is_never_touched(hostile: dict[str, Any]) -> None:
    core = hostile["core"]
    core.create_namespaced_config_map(
        NS_A, {"metadata": {"name": "app-config"}, "data": {"database": "postgres://prod"}}
    )
    before = core.read_namespaced_config_map("app-config", NS_A)
    rollout = {"enabled": True, "gitops": {"configMap": "app-config"}}
    _create(hostile, NS_A, "gitops-takeover", registry={}, rollout=rollout)
    cond = wait_for(
        "ConfigMapNotOwned", lambda: _ready(hostile, NS_A, "gitops-takeover", "ConfigMapNotOwned"), 300
    )
    assert "set spec.rollout.gitops.configMap" in cond["message"]
    rollouts = _get(hostile, NS_A, "gitops-takeover")["status"]["rollouts"]
    assert rollouts and all(r["phase"] == "Failed" for r in rollouts), rollouts

    def unchanged() -> None:
        now = core.read_namespaced_config_map("app-config", NS_A)
        assert now.data == before.data and not now.metadata.owner_references
        assert now.metadata.resource_version == before.metadata.resource_version

    unchanged()
    time.sleep(5)  # a few resyncs: told once, not at each
    events = core.list_namespaced_event(NS_A, field_selector="involvedObject.name=gitops-takeover").items
    assert [e.reason for e in events].count("ConfigMapNotOwned") == 1, [e.reason for e in events]
    hostile["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS_A, PLURAL, "gitops-takeover")

    def gone() -> bool:
        try:
            _get(hostile, NS_A, "gitops-takeover")
        except ApiException as err:
            return err.status == 404
        return False

    wait_for("the CompiledModel deleted", gone)
    wait_for("its Jobs collected", lambda: not _jobs(hostile, NS_A, "gitops-takeover"))
    unchanged()  # the garbage collector had no ownerReference to follow


def test_a_model_name_of_another_namespace_is_refused(hostile: dict[str, Any]) -> None:
    ml = MlflowClient(tracking_uri=hostile["mlflow"].tracking_uri)
    _create(hostile, NS_A, "owner", registry={"modelName": "team-model"})

    def registered() -> bool:
        return bool(((_get(hostile, NS_A, "owner").get("status") or {}).get("registry") or {}).get("runId"))

    wait_for("the owner registered", registered, timeout=300)
    assert ml.get_registered_model("team-model").tags["kompile.namespace"] == NS_A
    versions = [v.version for v in ml.search_model_versions("name='team-model'")]

    _create(hostile, NS_B, "intruder", registry={"modelName": "team-model"})
    cond = wait_for("refused", lambda: _ready(hostile, NS_B, "intruder", "ModelNameTaken"), 300)
    assert f"belongs to namespace {NS_A}" in cond["message"] and "spec.registry.modelName" in cond["message"]
    registered_cond = next(
        c for c in _get(hostile, NS_B, "intruder")["status"]["conditions"] if c["type"] == "Registered"
    )
    assert registered_cond["reason"] == "ModelNameTaken"
    time.sleep(5)  # a few resyncs: still nothing added, and the condition holds still
    assert [v.version for v in ml.search_model_versions("name='team-model'")] == versions
    later = _ready(hostile, NS_B, "intruder", "ModelNameTaken")
    assert later is not None and later["lastTransitionTime"] == cond["lastTransitionTime"]
    assert ml.get_experiment_by_name(f"kompile/{NS_B}/intruder") is None
    assert ml.get_registered_model("team-model").tags["kompile.namespace"] == NS_A


# -- specs the operator cannot act on ---------------------------------------------------------------


def test_a_bad_quantity_is_refused_by_the_api_server(hostile: dict[str, Any]) -> None:
    target = L4 | {"hardware": {"resources": {"limits": {"cpu": "two"}}}}
    with pytest.raises(ApiException) as refused:
        _create(hostile, NS_A, "bad-quantity", targets=[target])
    assert refused.value.status == 422
    assert "spec.targets[0].hardware.resources.limits.cpu" in str(refused.value.body)
    # A key past its bound (a label key is at most 317 characters) is refused by the schema too.
    too_long = L4 | {"hardware": {"nodeSelector": {"k" * 400: "v"}}}
    with pytest.raises(ApiException) as refused:
        _create(hostile, NS_A, "long-key", targets=[too_long])
    assert refused.value.status == 422 and "keys are at most 317 characters" in str(refused.value.body)


def test_a_200_kib_spec_gets_a_status_reason_and_no_job(hostile: dict[str, Any]) -> None:
    # Every key and value within its bound (317 and 63 characters), 32 labels on each of 32 targets.
    selector = {f"{'a' * 120}.example.com/label-{i:02d}": "v" * 63 for i in range(32)}
    targets = [
        {"name": f"cpu-{i:02d}", "backend": "onnxruntime", "hardware": {"nodeSelector": selector}}
        for i in range(32)
    ]
    doc = small_cnn_manifest("oversized", targets=targets)
    assert len(json.dumps(doc)) > 200 * 1024
    hostile["custom"].create_namespaced_custom_object(GROUP, VERSION, NS_A, PLURAL, doc)
    cond = wait_for("InvalidSpec", lambda: _ready(hostile, NS_A, "oversized", "InvalidSpec"))
    assert "KiB" in cond["message"] and "spec.targets" in cond["message"]
    assert not _jobs(hostile, NS_A, "oversized")


def test_too_many_hardware_classes_get_a_status_reason_and_no_job(hostile: dict[str, Any]) -> None:
    """The session's fleet has 5 classes; 8 more GPU products make 13 x 5 precisions = 65 targets,
    one more than status holds."""
    core = hostile["core"]
    extra = [f"hostile-gpu-{i}" for i in range(8)]
    for i, name in enumerate(extra):
        labels = {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux",
            "nvidia.com/gpu.product": f"NVIDIA-TEST-{i}",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
        }
        core.create_node(kwok_node(name, labels))
    # The Node and CompiledModel watches are separate streams: a CompiledModel seen before the last
    # Node would be (rightly) compiled for the smaller fleet. Wait until the operator counts all 13.
    last = "gpu-nvidia-test-7-sm90"
    wait_for("the operator to see the extra GPU classes", lambda: _sees_class(hostile, last))
    try:
        doc = small_cnn_manifest(
            "too-many", fleet={"enabled": True, "precisions": ["fp32", "fp16", "bf16", "int8", "auto"]}
        )
        hostile["custom"].create_namespaced_custom_object(GROUP, VERSION, NS_A, PLURAL, doc)
        cond = wait_for("TooManyTargets", lambda: _ready(hostile, NS_A, "too-many", "TooManyTargets"))
        assert "65 targets" in cond["message"] and "spec.fleet.precisions" in cond["message"]
        assert not _jobs(hostile, NS_A, "too-many")
    finally:
        hostile["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS_A, PLURAL, "too-many")
        for name in extra:  # the fleet is the session's: leave it as fleet.py declares it
            core.delete_node(name)
