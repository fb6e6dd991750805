"""KServe for the tests: its real InferenceService CRD, and a TEST STAND-IN for its controller.

`install_crd(plane)` fetches KServe's own CRD (scripts/fetch-kserve-crd.sh, from the Go module
proxy) and installs it on the real API server, so every InferenceService the operator writes is
checked against KServe's real schema. The KServe controller itself cannot run here (it needs
Knative or a container runtime and an ingress), so `KServeControllerStandIn` writes the status it
would write; the test decides which models become Ready.
"""

from __future__ import annotations

import copy
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from devtools.devcluster import ControlPlane

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
CRD_NAME = f"{PLURAL}.{GROUP}"
MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
FETCH_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch-kserve-crd.sh"
# Knative: a change to the traffic split alone makes no new revision. Deployment: replicas, strategy
# and the predictor's name (it names the Deployment) do not change the pod template either.
_NOT_IN_REVISION = {"canaryTrafficPercent"}
_NOT_IN_POD_TEMPLATE = {
    "canaryTrafficPercent", "name", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric",
    "scaleMetricType", "autoScaling", "deploymentStrategy",
}  # fmt: skip

Verdict = Callable[[dict[str, Any]], bool]


def fetch_crd() -> Path:
    """Path of KServe's InferenceService CRD, fetched once and cached."""
    out = subprocess.run(["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{FETCH_SCRIPT.name} failed: {out.stderr.strip()[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def install_crd(plane: ControlPlane, timeout: float = 60.0) -> Path:
    """Install KServe's CRD on the control plane and wait until it is Established."""
    path = fetch_crd()
    # Server-side apply: the 2 MB CRD overflows client-side apply's last-applied annotation.
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path), timeout=timeout)
    # Polled rather than `kubectl wait`: kubectl's filters fail (no check) while there are no conditions.
    established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    deadline = time.monotonic() + timeout
    while plane.kubectl("get", "crd", CRD_NAME, "-o", established, check=False).stdout.strip() != "True":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{CRD_NAME} not Established in {timeout}s")
        time.sleep(0.2)
    return path


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(predictor: dict[str, Any], ignored: set[str]) -> str:
    kept = {k: v for k, v in predictor.items() if k not in ignored}
    if isinstance(kept.get("model"), dict):  # the container is named kserve-container either way
        kept["model"] = {k: v for k, v in kept["model"].items() if k != "name"}
    return json.dumps(kept, sort_keys=True)


def _mode(isvc: dict[str, Any], default: str) -> str:
    """KServe >= 0.17 records the new names: Serverless is Knative, RawDeployment is Standard."""
    recorded = (isvc.get("status") or {}).get("deploymentMode")
    given = recorded or (isvc["metadata"].get("annotations") or {}).get(MODE_ANNOTATION) or default
    return {"Serverless": "Knative", "RawDeployment": "Standard"}.get(given, given)


@dataclass
class _Rollout:
    """A Knative revision, or the pod template of a Deployment, and whether the test lets it serve."""

    name: str
    key: str
    verdict: bool
    due: float

    def ready(self, now: float) -> bool:
        return self.verdict and now >= self.due


@dataclass
class _Service:
    revisions: list[_Rollout] = field(default_factory=list)
    rolled_out: str | None = None
    previous: str | None = None
    deployments: dict[str, _Rollout] = field(default_factory=dict)
    served_before: bool = False  # Standard: old pods of the stable Deployment still serve


class KServeControllerStandIn:
    """A TEST STAND-IN for the KServe controller, which cannot run here (no Knative, no container
    runtime, no ingress). It watches InferenceServices in one namespace and writes their status the
    way KServe v0.20 does, from the spec alone:

    - Serverless (Knative) mode: each new revision template (the predictor without
      canaryTrafficPercent) makes a revision `<name>-predictor-0000N`; `components.predictor` gets
      latestCreatedRevision, latestReadyRevision, latestRolledoutRevision, previousRolledoutRevision
      and `traffic` split as KServe splits it (canaryTrafficPercent to the latest Ready revision, the
      rest, tagged prev, to the last rolled-out one); Ready follows the latest revision.
    - Standard mode: a Deployment per predictor name; Ready stays True (reason
      MinimumReplicasAvailable) while old pods serve a rollout, NewReplicaSetAvailable once the new
      template serves; each spec.canary entry gets a canaryStatuses item and CanaryPredictorReady.

    `ready(isvc)` decides, once per revision or pod template, whether it ever becomes Ready (for a
    canary it sees the InferenceService with the canary's merged predictor); `ready_after_s` delays
    it. Unlike KServe in Standard mode, observedGeneration is the InferenceService's own generation.
    """

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        ready: Verdict = lambda isvc: True,
        default_mode: str = "Serverless",
        ready_after_s: float = 0.0,
    ) -> None:
        self.namespace = namespace
        self._ready = ready
        self.default_mode = default_mode
        self.ready_after_s = ready_after_s
        self.custom = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
        self._services: dict[str, _Service] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        """API errors met (tests assert it stays empty)."""
        self.created: list[str] = []
        """Revisions and Deployment templates created, in order."""

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, daemon=True, name="kserve-standin")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return obj

    def wait_for(
        self, name: str, check: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        """The InferenceService once `check` holds for it; AssertionError with its status otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            isvc = self.get(name)
            if check(isvc):
                return isvc
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: condition not met in {timeout}s; status {isvc.get('status')}")
            time.sleep(0.2)

    # -- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        # A short watch, restarted: each restart lists everything again (ADDED events), which also
        # brings back revisions whose ready_after_s has passed.
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                    timeout_seconds=1,
                )  # fmt: skip
                for event in stream:
                    isvc = event["object"]
                    if event["type"] == "DELETED":
                        self._services.pop(isvc["metadata"]["name"], None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self._reconcile(isvc)
                    if self._stop.is_set():
                        break
            except (ApiException, urllib3.exceptions.HTTPError) as err:
                if not self._stop.is_set():
                    self.errors.append(f"{type(err).__name__}: {err}")
                    self._stop.wait(0.5)

    def _reconcile(self, isvc: dict[str, Any]) -> None:
        name = isvc["metadata"]["name"]
        svc = self._services.setdefault(name, _Service())
        mode = _mode(isvc, self.default_mode)
        if mode == "Knative":
            status = self._knative(isvc, svc, time.monotonic())
        else:
            status = self._standard(isvc, svc, time.monotonic())
        old = isvc.get("status") or {}
        status |= {
            "observedGeneration": isvc["metadata"].get("generation"),
            "deploymentMode": mode,
            "url": f"http://{name}.{self.namespace}.example.com",
            "address": {"url": f"http://{name}-predictor.{self.namespace}.svc.cluster.local"},
        }
        for cond in status["conditions"]:  # lastTransitionTime moves only when status changes
            olds = [c for c in old.get("conditions") or [] if c.get("type") == cond["type"]]
            before: dict[str, Any] = olds[0] if olds else {}
            same = before.get("status") == cond["status"] and before.get("lastTransitionTime")
            cond["lastTransitionTime"] = before["lastTransitionTime"] if same else _now()
        if all(_drop_none(v) == old.get(k) for k, v in status.items()):
            return
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, name, {"status": status}
            )
        except ApiException as err:
            if err.status != 404:  # deleted meanwhile
                raise

    def _new(self, name: str, key: str, isvc: dict[str, Any], now: float) -> _Rollout:
        self.created.append(name)
        return _Rollout(name, key, bool(self._ready(isvc)), now + self.ready_after_s)

    # -- Serverless (Knative) mode ---------------------------------------------------------------

    def _knative(self, isvc: dict[str, Any], svc: _Service, now: float) -> dict[str, Any]:
        name, predictor = isvc["metadata"]["name"], isvc["spec"]["predictor"]
        key = _key(predictor, _NOT_IN_REVISION)
        if not svc.revisions or svc.revisions[-1].key != key:
            revision = f"{name}-predictor-{len(svc.revisions) + 1:05d}"
            svc.revisions.append(self._new(revision, key, isvc, now))
        latest = svc.revisions[-1]
        ready = [r.name for r in svc.revisions if r.ready(now)]
        latest_ready = ready[-1] if ready else None
        percent = predictor.get("canaryTrafficPercent")
        traffic: list[dict[str, Any]] = []
        if latest_ready and percent is not None and svc.rolled_out:
            # KServe's split: the latest Ready revision (maybe still the old one) and the last rolled out.
            traffic.append({"revisionName": latest_ready, "latestRevision": True, "percent": percent})
            if percent < 100:
                traffic.append(
                    {
                        "revisionName": svc.rolled_out,
                        "latestRevision": False,
                        "percent": 100 - percent,
                        "tag": "prev",
                    }
                )
        elif latest_ready:
            traffic.append({"revisionName": latest_ready, "latestRevision": True, "percent": 100})
        if traffic and traffic[0]["percent"] == 100 and svc.rolled_out != latest_ready:
            svc.previous, svc.rolled_out = svc.rolled_out, latest_ready
        if latest.ready(now):
            cond: dict[str, Any] = {"status": "True"}
        elif latest.verdict:
            cond = {
                "status": "Unknown",
                "reason": "Deploying",
                "message": f"revision {latest.name} is starting",
            }
        else:
            cond = {
                "status": "False",
                "reason": "RevisionFailed",
                "message": f"revision {latest.name} failed",
            }
        return {
            "conditions": [
                {"type": "Ready", **cond},
                {"type": "PredictorReady", **cond},
                {"type": "LatestDeploymentReady", **cond},
                {"type": "IngressReady", "status": "True" if latest_ready else "False"},
            ],
            "components": {
                "predictor": {
                    "latestCreatedRevision": latest.name,
                    "latestReadyRevision": latest_ready,
                    "latestRolledoutRevision": svc.rolled_out,
                    "previousRolledoutRevision": svc.previous,
                    "traffic": traffic,
                    "url": f"http://{name}-predictor.{self.namespace}.example.com" if latest_ready else None,
                }
            },
            "canaryStatuses": None,
        }

    # -- Standard mode ---------------------------------------------------------------------------

    def _deployment(
        self, svc: _Service, dep: str, predictor: dict[str, Any], isvc: dict[str, Any], now: float
    ) -> _Rollout:
        key = _key(predictor, _NOT_IN_POD_TEMPLATE)
        known = svc.deployments.get(dep)
        if known is None or known.key != key:
            known = svc.deployments[dep] = self._new(dep, key, isvc, now)
        return known

    def _standard(self, isvc: dict[str, Any], svc: _Service, now: float) -> dict[str, Any]:
        name, spec = isvc["metadata"]["name"], isvc["spec"]
        stable_pred = spec["predictor"]
        stable_name = (
            f"{name}-{stable_pred['name']}-predictor" if stable_pred.get("name") else f"{name}-predictor"
        )
        before = svc.deployments.get(stable_name)
        stable = self._deployment(svc, stable_name, stable_pred, isvc, now)
        if before is not stable:
            svc.served_before = bool(before and before.ready(now)) or svc.served_before
        if stable.ready(now):
            svc.served_before = True
            cond: dict[str, Any] = {"status": "True", "reason": "NewReplicaSetAvailable"}
        elif svc.served_before:
            cond = {"status": "True", "reason": "MinimumReplicasAvailable"}
        else:
            cond = {"status": "False", "reason": "MinimumReplicasUnavailable", "message": "no pod is ready"}
        canaries, keep = [], {stable_name}
        for entry in spec.get("canary") or []:
            merged = {**stable_pred, **entry["predictor"]}  # KServe overlays the canary on the stable
            view = copy.deepcopy(isvc)
            view["spec"]["predictor"] = merged
            view["spec"].pop("canary", None)
            dep = f"{name}-{entry['predictor']['name']}-predictor"
            keep.add(dep)
            rollout = self._deployment(svc, dep, merged, view, now)
            canaries.append(
                {
                    "name": entry["predictor"]["name"],
                    "ready": rollout.ready(now),
                    "trafficPercent": entry["trafficPercent"],
                }
            )
        svc.deployments = {k: v for k, v in svc.deployments.items() if k in keep}  # orphans go
        conditions = [{"type": "Ready", **cond}, {"type": "PredictorReady", **cond}]
        if canaries:
            all_ready = all(c["ready"] for c in canaries)
            conditions.append(
                {
                    "type": "CanaryPredictorReady",
                    "status": "True" if all_ready else "False",
                    "reason": "AllCanariesReady" if all_ready else "CanariesNotReady",
                }
            )
        url = (
            f"http://{name}-predictor.{self.namespace}.svc.cluster.local"
            if cond["status"] == "True"
            else None
        )
        return {
            "conditions": conditions,
            "components": {"predictor": {"url": url}},
            "canaryStatuses": canaries or None,
        }


def _drop_none(value: Any) -> Any:
    """The value as the API server stores it after a merge patch (null removes a field)."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
