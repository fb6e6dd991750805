"""MLflow and S3 going away under a running operator: the real control plane and KWOK fleet, a real
MLflow server and a real S3 server, each behind a TCP proxy on a fixed port that refuses and then
blackholes the operator's traffic (tests.support.faulty_proxy). The compile pods (KWOK stand-ins)
reach S3 directly, as pods on another network path would.

Status must say so within a bounded time (conditions, not Events only), Events stay bounded,
nothing ends as NoResult, no Job is launched on a cache lookup that could not be made, and after
recovery the generation is recorded once: one parent run, one version per target.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client, config
from mlflow import MlflowClient

from devtools.devcluster import ControlPlane
from tests.integration.fleet import (
    KWOK_TARGETS,
    KwokReporter,
    OperatorProcess,
    publishing_decide,
    small_cnn_manifest,
    tenant_with_store,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn
from tests.support.faulty_proxy import FaultyProxy
from tests.support.servers import MlflowServer, S3Server

NS = "kompile-outage"
BUCKET = "kompile-outage"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
CALL_TIMEOUT = 2
STATUS_WITHIN = 45.0
"""Seconds within which status must show an outage: a few bounded calls and one requeue."""
TARGETS = KWOK_TARGETS


def _proxy(url: str) -> FaultyProxy:
    parsed = urlparse(url)
    return FaultyProxy((parsed.hostname or "127.0.0.1", parsed.port or 80)).start()


@pytest.fixture(scope="module")
def outage(
    control_plane: ControlPlane,
    sim_fleet: KubeletStandIn,
    s3_server: S3Server,
    mlflow_server: MlflowServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("outage")
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core, custom, batch = client.CoreV1Api(api), client.CustomObjectsApi(api), client.BatchV1Api(api)
    creds = tenant_with_store(core, NS, s3_server, BUCKET)
    # The compile pods (KWOK stand-ins) publish straight to S3, not through the proxy.
    decide = publishing_decide(s3_server.endpoint, creds)
    mlflow_proxy, s3_proxy = _proxy(mlflow_server.tracking_uri), _proxy(s3_server.endpoint)
    reporter = KwokReporter(control_plane.kubeconfig, NS, decide).start()
    op = OperatorProcess(
        control_plane.kubeconfig,
        NS,
        "s3://unused/",
        work / "operator.log",
        extra_env={"KOMPILE_CALL_TIMEOUT_SECONDS": str(CALL_TIMEOUT)},
    ).start()
    try:
        yield {
            "core": core,
            "custom": custom,
            "batch": batch,
            "mlflow": mlflow_server,
            "mlflow_proxy": mlflow_proxy,
            "s3_proxy": s3_proxy,
            "log": work / "operator.log",
        }
    finally:
        op.stop()
        reporter.stop()
        mlflow_proxy.stop()
        s3_proxy.stop()
        print(f"\noutage operator log: {work / 'operator.log'}")


def _get(o: dict[str, Any], name: str) -> dict[str, Any]:
    obj: dict[str, Any] = o["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    return obj


def _condition(o: dict[str, Any], name: str, type_: str) -> dict[str, Any]:
    conds = (_get(o, name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), {})


def _warnings(o: dict[str, Any], name: str, reason: str) -> int:
    events = o["core"].list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
    return sum((e.count or 1) for e in events if e.reason == reason and e.type == "Warning")


def _run_outage(o: dict[str, Any], name: str, seconds: float) -> None:
    s3p, mlp = o["s3_proxy"], o["mlflow_proxy"]
    registry = {
        "trackingUri": mlp.url,
        "artifactStore": f"s3://{BUCKET}/store",
        "s3Endpoint": s3p.url,
        "credentialsSecret": {"name": "s3-creds"},
        "modelName": f"{name}-model",
    }
    # 1. S3 down before the first look: no cache lookup can be made, so no Job may start.
    s3p.set_mode("refuse")
    mlp.set_mode("refuse")
    began = time.monotonic()
    o["custom"].create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, small_cnn_manifest(name, targets=TARGETS, registry=registry)
    )
    wait_for(
        "StoreReachable=False",
        lambda: _condition(o, name, "StoreReachable").get("status") == "False",
        timeout=STATUS_WITHIN,
    )
    shown = time.monotonic() - began
    s3p.set_mode("blackhole")
    time.sleep(seconds / 2)
    ready = _condition(o, name, "Ready")
    assert (ready.get("status"), ready.get("reason")) == ("False", "StoreUnavailable"), ready
    jobs = o["batch"].list_namespaced_job(NS, label_selector=f"kompile.dev/compiledmodel={name}").items
    assert not jobs, [j.metadata.name for j in jobs]

    # 2. S3 back, MLflow still down (blackholed): the targets compile, registration waits.
    s3p.set_mode("forward")
    mlp.set_mode("blackhole")
    wait_for(
        "Registered=False",
        lambda: _condition(o, name, "Registered").get("reason") == "RegistryUnavailable",
        timeout=120 + STATUS_WITHIN,
    )
    time.sleep(seconds / 2)
    status = _get(o, name)["status"]
    assert {t["phase"] for t in status["targets"]} == {"Succeeded"}, status["targets"]
    ready = _condition(o, name, "Ready")
    assert (ready.get("status"), ready.get("reason")) == ("False", "RegistryUnavailable"), ready

    # 3. MLflow back: recorded once, within the breaker's longest backoff.
    mlp.set_mode("forward")
    wait_for(
        "Registered=True",
        lambda: _condition(o, name, "Registered").get("status") == "True",
        timeout=120 + STATUS_WITHIN,
    )
    obj = _get(o, name)
    assert _condition(o, name, "Ready").get("status") == "True"
    assert _condition(o, name, "StoreReachable").get("status") == "True"
    assert not [t for t in obj["status"]["targets"] if t.get("reason") == "NoResult"]
    # Bounded Events: one Warning per outage, however many reconciles it lasted.
    assert _warnings(o, name, "StoreUnavailable") == 1
    assert _warnings(o, name, "RegistryUnavailable") == 1
    ml = MlflowClient(tracking_uri=o["mlflow"].tracking_uri)
    versions = ml.search_model_versions(f"name='{name}-model'")
    assert sorted(v.tags["kompile.target"] for v in versions) == ["arm", "l4"]
    exp = ml.get_experiment_by_name(f"kompile/{NS}/{name}")
    parents = ml.search_runs([exp.experiment_id], filter_string="tags.`kompile.run` = 'generation'")
    assert len(parents) == 1
    jobs = o["batch"].list_namespaced_job(NS, label_selector=f"kompile.dev/compiledmodel={name}").items
    assert len(jobs) == len(TARGETS)
    print(f"\n{name}: outage shown in status {shown:.1f} s after create")


def test_store_and_registry_outages_show_in_status_and_recover_once(outage: dict[str, Any]) -> None:
    _run_outage(outage, "outage-short", seconds=20)


@pytest.mark.chaos
def test_two_minute_outages(outage: dict[str, Any]) -> None:
    """The issue's full case: each service out for two minutes."""
    _run_outage(outage, "outage-long", seconds=120)


def test_refused_credentials_hold_up_only_their_own_model(outage: dict[str, Any]) -> None:
    """Wrong keys in a tenant's Secret, a Secret not created yet, a bucket that is not there: the
    real S3 server answers, so it is that CompiledModel's problem, not the store's. Its status names
    what to fix (StoreRefused), no Job starts, and a model of another tenant on the same endpoint
    compiles meanwhile without waiting out a backoff; once the Secret is right the first goes on."""
    core, s3p = outage["core"], outage["s3_proxy"]
    creds = core.read_namespaced_secret("s3-creds", NS).data

    def registry(secret: str, bucket: str = BUCKET) -> dict[str, Any]:
        return {
            "artifactStore": f"s3://{bucket}/store",
            "s3Endpoint": s3p.url,
            "credentialsSecret": {"name": secret},
        }

    def create(name: str, reg: dict[str, Any]) -> None:
        outage["custom"].create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, small_cnn_manifest(name, targets=TARGETS, registry=reg)
        )

    def refused(name: str) -> str | None:
        ready = _condition(outage, name, "Ready")
        return ready.get("message") if ready.get("reason") == "StoreRefused" else None

    wrong = {**creds, "AWS_SECRET_ACCESS_KEY": base64.b64encode(b"not-the-key").decode()}
    core.create_namespaced_secret(NS, {"metadata": {"name": "wrong-keys"}, "data": wrong})
    create("wrong-keys", registry("wrong-keys"))
    create("no-secret", registry("s3-creds-later"))
    create("no-bucket", registry("s3-creds", bucket="kompile-no-such-bucket"))
    told = {
        n: wait_for(f"{n} refused", lambda n=n: refused(n), timeout=STATUS_WITHIN)
        for n in ("wrong-keys", "no-secret", "no-bucket")
    }
    assert "SignatureDoesNotMatch" in told["wrong-keys"] or "InvalidAccessKeyId" in told["wrong-keys"]
    assert "Secret 'wrong-keys' (spec.registry.credentialsSecret)" in told["wrong-keys"], told
    assert (
        "Secret 's3-creds-later' (spec.registry.credentialsSecret) is not in namespace" in told["no-secret"]
    )
    assert "NoSuchBucket" in told["no-bucket"] and "spec.registry.artifactStore" in told["no-bucket"]
    time.sleep(10)  # the refused models are looked at again and again (every 2 s) meanwhile

    began = time.monotonic()
    create("bystander", registry("s3-creds"))
    wait_for(
        "bystander ready",
        lambda: _condition(outage, "bystander", "Ready").get("status") == "True",
        timeout=120,
    )
    took = time.monotonic() - began
    assert _warnings(outage, "bystander", "StoreUnavailable") == 0
    for name in ("wrong-keys", "no-secret", "no-bucket"):
        jobs = (
            outage["batch"].list_namespaced_job(NS, label_selector=f"kompile.dev/compiledmodel={name}").items
        )
        assert not jobs, (name, [j.metadata.name for j in jobs])
        assert _warnings(outage, name, "StoreRefused") == 1  # once, not at each of its looks

    # Fixed where the message said: the Secret's keys, the missing Secret created.
    core.patch_namespaced_secret("wrong-keys", NS, {"data": creds})
    core.create_namespaced_secret(NS, {"metadata": {"name": "s3-creds-later"}, "data": creds})
    for name in ("wrong-keys", "no-secret"):
        wait_for(
            f"{name} ready",
            lambda n=name: _condition(outage, n, "Ready").get("status") == "True",
            timeout=180,
        )
    assert refused("no-bucket")
    print(f"\nbystander Ready {took:.1f} s after create, beside three refused models")
