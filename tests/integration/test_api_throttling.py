"""Real 429s from the API server: API Priority and Fairness puts the operator's ServiceAccount in a
priority level of its own with a handful of seats and no queue (Reject), and a flood of LISTs under
the same account keeps those seats busy, so the operator's calls are refused with 429 Too Many
Requests. The operator must ride them out: every CompiledModel settles, one Job per target, and
the API server's own metrics show that it did refuse requests of that flow.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from devtools.devcluster import ControlPlane
from tests.integration.fleet import (
    KWOK_TARGETS,
    KwokReporter,
    OperatorProcess,
    small_cnn_manifest,
    success_result,
    token_kubeconfig,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn

NS = "kompile-apf"
ACCOUNT = "kompile-throttled"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
MODELS = 5
FLOOD_THREADS = 12
FLOOD_SECONDS = 40.0
"""How long the flood lasts at least; it goes on (up to FLOOD_MAX_SECONDS) until the operator has
seen a 429: on a loaded 2-core runner the operator may make no call while the seats are full."""
FLOOD_MAX_SECONDS = 180.0
PADDING_CONFIGMAPS = 200
"""Objects the flood LISTs: enough that each LIST holds a seat for a while."""

APF_OBJECTS = f"""
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata: {{name: {ACCOUNT}}}
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 1
    lendablePercent: 0
    borrowingLimitPercent: 0
    limitResponse: {{type: Reject}}
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {{name: {ACCOUNT}}}
spec:
  matchingPrecedence: 200
  priorityLevelConfiguration: {{name: {ACCOUNT}}}
  distinguisherMethod: {{type: ByUser}}
  rules:
  - subjects:
    - kind: ServiceAccount
      serviceAccount: {{name: {ACCOUNT}, namespace: {NS}}}
    resourceRules:
    - verbs: ["*"]
      apiGroups: ["*"]
      resources: ["*"]
      clusterScope: true
      namespaces: ["*"]
    nonResourceRules:
    - verbs: ["*"]
      nonResourceURLs: ["*"]
"""

TARGETS = KWOK_TARGETS


def _decide(pod: dict[str, Any]) -> tuple[int, str]:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    t = json.loads(env["KOMPILE_TARGET"])
    return 0, success_result(t["name"], t["backend"], t.get("precision", "fp32"))


def _rejected(plane: ControlPlane) -> float:
    """Requests APF refused for this flow schema so far, from the API server's /metrics."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    pattern = rf'apiserver_flowcontrol_rejected_requests_total{{[^}}]*flow_schema="{ACCOUNT}"[^}}]*}} (\S+)'
    return sum(float(v) for v in re.findall(pattern, text))


@pytest.fixture(scope="module")
def throttled(
    control_plane: ControlPlane, sim_fleet: KubeletStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("apf")
    plane = control_plane
    plane.kubectl("create", "namespace", NS)
    plane.kubectl("create", "serviceaccount", ACCOUNT, "-n", NS)
    # Not in system:masters (exempt from APF): a ServiceAccount, given what the operator needs.
    plane.kubectl(
        "create",
        "clusterrolebinding",
        ACCOUNT,
        "--clusterrole=cluster-admin",
        f"--serviceaccount={NS}:{ACCOUNT}",
    )
    (work / "apf.yaml").write_text(APF_OBJECTS)
    plane.kubectl("apply", "-f", str(work / "apf.yaml"))
    admin = config.new_client_from_config(str(plane.kubeconfig))
    core, custom, batch = client.CoreV1Api(admin), client.CustomObjectsApi(admin), client.BatchV1Api(admin)
    for i in range(PADDING_CONFIGMAPS):
        core.create_namespaced_config_map(NS, {"metadata": {"name": f"pad-{i}"}, "data": {"x": "y" * 4000}})
    kubeconfig = token_kubeconfig(plane, NS, ACCOUNT, work / "throttled.kubeconfig")
    reporter = KwokReporter(plane.kubeconfig, NS, _decide).start()
    op = OperatorProcess(kubeconfig, NS, (work / "store").as_uri(), work / "operator.log").start()
    try:
        yield {
            "plane": plane,
            "core": core,
            "custom": custom,
            "batch": batch,
            "kubeconfig": kubeconfig,
            "log": work / "operator.log",
        }
    finally:
        op.stop()
        reporter.stop()
        plane.kubectl("delete", "-f", str(work / "apf.yaml"), check=False)
        print(f"\nAPF operator log: {work / 'operator.log'}")


def _flood(kubeconfig: Any, stop: threading.Event, refused: list[int]) -> None:
    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    while not stop.is_set():
        try:
            # Bytes, not V1ConfigMap objects: deserializing 200 of them is tens of ms of Python under
            # the GIL, during which this thread holds no seat; read raw, the twelve threads keep the
            # seats busy even on a loaded 2-core runner (one CI run refused only 9 requests in 180 s).
            core.list_namespaced_config_map(NS, _request_timeout=10, _preload_content=False).read()
        except ApiException as err:
            if err.status == 429:
                refused.append(1)
        except Exception:  # noqa: BLE001 - a flood thread must outlive any one failed call
            time.sleep(0.1)


def test_the_operator_rides_out_429s(throttled: dict[str, Any]) -> None:
    t = throttled
    before = _rejected(t["plane"])
    refused: list[int] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=_flood, args=(t["kubeconfig"], stop, refused), daemon=True)
        for _ in range(FLOOD_THREADS)
    ]
    for th in threads:
        th.start()
    time.sleep(2)
    names = [f"apf-{i}" for i in range(MODELS)]
    for name in names:
        t["custom"].create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, small_cnn_manifest(name, targets=TARGETS)
        )

    # An ApiException's "(429)", Kopf's own retried calls ("APITooManyRequestsError(..., status=429)")
    # or the controller's "429 Too Many Requests".
    def operator_429s() -> int:
        return len(re.findall(r"\(429\)|status=429|429 Too Many Requests", t["log"].read_text()))

    start = time.monotonic()
    while time.monotonic() - start < FLOOD_SECONDS or (
        not operator_429s() and time.monotonic() - start < FLOOD_MAX_SECONDS
    ):
        time.sleep(1.0)
    stop.set()
    for th in threads:
        th.join()
    rejected = _rejected(t["plane"]) - before
    seen = operator_429s()
    assert rejected > 0 and seen > 0, (rejected, seen, len(refused))

    def settled() -> bool:
        for name in names:
            obj = t["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
            conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
            if conds.get("Ready", {}).get("status") != "True":
                return False
        return True

    wait_for("every CompiledModel Ready after the 429s", settled, timeout=240, interval=2.0)
    for name in names:
        jobs = t["batch"].list_namespaced_job(NS, label_selector=f"kompile.dev/compiledmodel={name}").items
        assert sorted((j.metadata.labels or {})["kompile.dev/target"] for j in jobs) == ["arm", "l4"], name
    print(f"\nAPF: {rejected:.0f} requests refused with 429 ({seen} seen by the operator)")
