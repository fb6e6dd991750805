"""What the operator refuses before any Job: a spec the typed models refuse (a bad backend option
value the CRD's key-only rule lets through) becomes Ready=False, reason InvalidSpec, with a message
naming the key, and no Job, Secret or Node is ever read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kompile.operator.fleet import discover
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings


class StatusOnlyKube:
    """A stand-in for the Kubernetes API that records status patches and fails on anything else."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.patches.append(body)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"reconcile called kube.{name} for a spec it must refuse first")


def _doc(options: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u-1", "generation": 3},
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime", "options": options}],
        },
    }


@pytest.mark.parametrize(
    ("options", "phrase"),
    [
        ({"optLevel": "fastest"}, "option optLevel='fastest': use one of ['extended', 'all', 'basic']"),
        ({"intraOpThreads": "four"}, "option intraOpThreads='four': use a non-negative integer"),
        ({"device": "cuda"}, "option device='cuda': onnxruntime builds for ['cpu']"),
    ],
)
def test_bad_option_is_an_invalid_spec_condition_before_any_job(options: dict[str, str], phrase: str) -> None:
    kube = StatusOnlyKube()
    events: list[tuple[str, str, str]] = []
    outcome = reconcile(_doc(options), kube, Settings(), lambda *e: events.append(e), classes=[])  # type: ignore[arg-type]
    assert outcome.done
    (patch,) = kube.patches
    (ready,) = [c for c in patch["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.targets[0]" in ready["message"] and phrase in ready["message"], ready["message"]
    assert ready["observedGeneration"] == 3 and patch["observedGeneration"] == 3


def test_an_unreachable_store_never_changes_a_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """With S3 down the source's version cannot be read: the fingerprint used to fall back to the
    URI, changing the key (a second Job under another prefix). Now no key is made and the target
    waits, saying why. The store is a stand-in that fails."""
    from kompile.artifact_store import StoreError
    from kompile.operator import store_access as rec
    from kompile.operator.store_access import StoreAccess, StoreUnavailable, source_fingerprint

    def down(*_: Any) -> str:
        raise StoreError("head of s3://models/m.onnx failed: connection refused")

    monkeypatch.setattr(rec, "object_version", down)
    doc = _doc({})
    doc["spec"]["source"]["uri"] = "s3://models/m.onnx"
    from kompile.api.resource import parse_manifest

    with pytest.raises(StoreUnavailable, match="connection refused"):
        source_fingerprint(parse_manifest(doc), StoreAccess(None, None))


def test_a_jobs_own_prefix_is_where_its_result_is_read(tmp_path: Any) -> None:
    """The operator reads a Job's result at the prefix annotated on the Job, not at one recomputed
    from today's key (which an overwritten source or a changed setting would move)."""
    from kompile.api.job_contract import RESULT_FILE, JobResult
    from kompile.api.resource import parse_manifest
    from kompile.api.status import TargetStatus
    from kompile.operator.jobs import ANNOTATION_CACHE_KEY, ANNOTATION_PREFIX
    from kompile.operator.store_access import StoreAccess
    from kompile.operator.target_step import target_status
    from kompile.operator.targets import resolve_targets

    prefix = (tmp_path / "cache" / "where-the-job-wrote").as_uri()
    written = TargetStatus(
        name="cpu", backend="onnxruntime", precision="fp32", phase="Succeeded", speedup=2.0
    )
    (tmp_path / "cache" / "where-the-job-wrote").mkdir(parents=True)
    (tmp_path / "cache" / "where-the-job-wrote" / RESULT_FILE).write_text(JobResult(target=written).dumps())
    job = {
        "metadata": {"name": "j", "annotations": {ANNOTATION_CACHE_KEY: "k" * 40, ANNOTATION_PREFIX: prefix}},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }

    class PodsKube:
        def job_pods(self, namespace: str, name: str) -> list[Any]:
            return []

    cm = parse_manifest(_doc({}))
    (rt,) = resolve_targets(cm.spec, [])
    ts = target_status(cm, rt, job, None, PodsKube(), Settings(), StoreAccess(None, None), lambda *e: None)  # type: ignore[arg-type]
    assert ts.phase == "Succeeded" and ts.speedup == 2.0 and ts.cache_key == "k" * 40


def test_an_unreadable_cache_launches_nothing_and_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache lookup that fails (S3 down) used to count as a miss: a second compile of what may be
    stored. Now the target waits (Pending, StoreUnavailable) and, within the endpoint's backoff, the
    store is not called again. The store is a stand-in that fails; the Kube stand-in refuses every
    call, so no Job can be created."""
    from kompile.api.resource import parse_manifest
    from kompile.artifact_store import StoreError
    from kompile.operator import store_access as rec
    from kompile.operator.outages import Breaker
    from kompile.operator.target_step import target_status
    from kompile.operator.targets import resolve_targets

    calls: list[str] = []

    def down(uri: str, *_: Any) -> bytes:
        calls.append(uri)
        raise StoreError(f"read of {uri} failed: EndpointConnectionError")

    monkeypatch.setattr(rec, "read_bytes", down)
    monkeypatch.setattr(rec, "BREAKER", Breaker(first=60.0))
    cm = parse_manifest(_doc({}))
    (rt,) = resolve_targets(cm.spec, [])
    settings = Settings(artifact_store="s3://cache/root", s3_endpoint="http://s3.internal:9000")
    store = rec.StoreAccess("http://s3.internal:9000", None)
    first = target_status(cm, rt, None, None, StatusOnlyKube(), settings, store, lambda *e: None)  # type: ignore[arg-type]
    assert (first.phase, first.reason) == ("Pending", "StoreUnavailable"), first
    assert "EndpointConnectionError" in (first.message or "") and first.job is None
    again = target_status(cm, rt, None, None, StatusOnlyKube(), settings, store, lambda *e: None)  # type: ignore[arg-type]
    assert again.reason == "StoreUnavailable" and "next attempt in" in (again.message or "")
    assert len(calls) == 1  # the second look waited out the backoff instead of calling
    assert first.cache_key == again.cache_key  # an outage never changes a key


def test_refused_keys_name_their_secret_and_leave_the_endpoint_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that answers "not these keys" (or "no such bucket") is up: the CompiledModel says
    which Secret or bucket to fix (StoreRefused) and launches nothing, and the endpoint's breaker
    stays closed, so another tenant's model on the same store is not made to wait out a backoff.
    The store is a stand-in that refuses the way botocore reports it."""
    from botocore.exceptions import ClientError

    from kompile.api.resource import parse_manifest
    from kompile.artifact_store import _s3_error
    from kompile.operator import store_access as rec
    from kompile.operator.outages import Breaker
    from kompile.operator.target_step import target_status
    from kompile.operator.targets import resolve_targets

    calls: list[str] = []
    code = ["InvalidAccessKeyId"]

    def refused(uri: str, *_: Any) -> bytes:
        calls.append(uri)
        raise _s3_error("read of", uri, ClientError({"Error": {"Code": code[0]}}, "GetObject"))

    breaker = Breaker(first=60.0)
    monkeypatch.setattr(rec, "read_bytes", refused)
    monkeypatch.setattr(rec, "BREAKER", breaker)
    cm = parse_manifest(_doc({}))
    (rt,) = resolve_targets(cm.spec, [])
    settings = Settings(artifact_store="s3://cache/root", s3_endpoint="http://s3.internal:9000")
    keys = {"AWS_ACCESS_KEY_ID": "wrong", "AWS_SECRET_ACCESS_KEY": "wrong"}
    store = rec.StoreAccess(
        "http://s3.internal:9000", keys, keys_from="Secret 'team-b-s3' (spec.registry.credentialsSecret)"
    )

    def look() -> Any:
        return target_status(cm, rt, None, None, StatusOnlyKube(), settings, store, lambda *e: None)  # type: ignore[arg-type]

    first = look()
    assert (first.phase, first.reason, first.job) == ("Pending", "StoreRefused", None), first
    assert "InvalidAccessKeyId" in (first.message or "") and "'team-b-s3'" in (first.message or "")
    assert breaker.wait("http://s3.internal:9000") is None  # open to every other caller
    code[0] = "NoSuchBucket"
    again = look()
    assert again.reason == "StoreRefused" and "check the bucket in spec.registry.artifactStore" in (
        again.message or ""
    )
    assert len(calls) == 2  # not held back by a backoff: the fix is seen at the next look


def test_a_missing_secret_is_told_before_any_store_call_or_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Secret spec.registry.credentialsSecret names is not there (yet: GitOps may sync it after
    the CompiledModel): no store call with empty keys and no Job whose pod could not start; the
    target says which Secret to create, in which namespace."""
    from kubernetes.client.exceptions import ApiException

    from kompile.api.resource import parse_manifest
    from kompile.operator import store_access as rec
    from kompile.operator.target_step import target_status
    from kompile.operator.targets import resolve_targets

    def never(uri: str, *_: Any) -> bytes:
        raise AssertionError(f"store called for {uri}")

    class NoSecretKube(StatusOnlyKube):
        def secret_data(self, namespace: str, name: str) -> dict[str, str]:
            raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(rec, "read_bytes", never)
    monkeypatch.setattr(rec, "object_version", never)
    doc = _doc({})
    doc["spec"]["registry"] = {"artifactStore": "s3://b/k", "credentialsSecret": {"name": "team-s3"}}
    cm = parse_manifest(doc)
    (rt,) = resolve_targets(cm.spec, [])
    settings = Settings(artifact_store="s3://cache/root", s3_endpoint="http://s3.internal:9000")
    store = rec.store_access(cm, NoSecretKube(), settings)  # type: ignore[arg-type]
    ts = target_status(cm, rt, None, None, NoSecretKube(), settings, store, lambda *e: None)  # type: ignore[arg-type]
    assert (ts.phase, ts.reason, ts.job) == ("Pending", "StoreRefused", None), ts
    assert "Secret 'team-s3' (spec.registry.credentialsSecret) is not in namespace" in (ts.message or "")


def test_the_breaker_doubles_its_backoff_and_lets_one_caller_probe() -> None:
    from kompile.operator.outages import Breaker

    now = [0.0]
    b = Breaker(first=5.0, cap=20.0, clock=lambda: now[0])
    url = "http://mlflow.internal:5000/api"
    assert b.wait(url) is None
    assert b.failed(url, "refused") == 5.0
    assert b.wait("http://mlflow.internal:5000") == (5.0, "refused")  # keyed by host:port
    assert b.wait("http://other:5000") is None
    now[0] = 5.0
    assert b.wait(url) is None  # this caller probes...
    assert b.wait(url) is not None  # ...the others keep waiting
    assert b.failed(url, "refused") == 10.0
    assert b.failed(url, "refused") == 20.0 and b.failed(url, "refused") == 20.0  # capped
    b.succeeded(url)
    assert b.wait(url) is None


class FleetKube(StatusOnlyKube):
    """Nodes of many hardware classes and no Jobs yet; creating a Job fails the test."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.classes = classes

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []

    def list_nodes(self) -> list[dict[str, Any]]:
        gpus = [f"NVIDIA-GPU-{i}" for i in range(self.classes)]
        return [
            {
                "metadata": {
                    "name": f"node-{i}",
                    "labels": {
                        "kubernetes.io/arch": "amd64",
                        "nvidia.com/gpu.product": product,
                        "nvidia.com/gpu.compute.major": "9",
                        "nvidia.com/gpu.compute.minor": "0",
                    },
                }
            }
            for i, product in enumerate(gpus)
        ]


def test_more_targets_than_status_holds_is_refused_before_any_job() -> None:
    """13 hardware classes x 5 precisions = 65 targets: status holds 64, so every status patch was
    refused by the API server and the CompiledModel never showed why."""
    doc = _doc({})
    doc["spec"].pop("targets")
    doc["spec"]["fleet"] = {"enabled": True, "precisions": ["fp32", "fp16", "bf16", "int8", "auto"]}
    kube = FleetKube(classes=13)
    events: list[tuple[str, str, str]] = []
    outcome = reconcile(
        doc, kube, Settings(), lambda *e: events.append(e), classes=discover(kube.list_nodes())
    )  # type: ignore[arg-type]
    assert outcome.done
    (patch,) = kube.patches
    (ready,) = [c for c in patch["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False" and ready["reason"] == "TooManyTargets"
    assert "65 targets" in ready["message"] and "spec.fleet.precisions" in ready["message"]
    assert patch["targets"] == []
    assert FleetKube(classes=12).list_nodes()  # 60 targets pass (below)
    fine = FleetKube(classes=12)
    fine.create_job = lambda *a: True  # type: ignore[method-assign]
    fine.secret_data = lambda *a: {}  # type: ignore[method-assign]
    reconcile(doc, fine, Settings(), lambda *e: None, classes=discover(fine.list_nodes()))  # type: ignore[arg-type]
    assert len(fine.patches[-1]["targets"]) == 60


def test_an_oversized_spec_is_an_invalid_spec_condition_before_any_job() -> None:
    """Within every field's bound a spec can still grow large (32 targets x 32 node labels...): the
    compile Job carries it in one environment variable, so past 64 KiB it is refused, naming the
    largest part."""
    doc = _doc({})
    selector = {f"example.com/label-{i:02d}": "v" * 63 for i in range(32)}
    doc["spec"]["targets"] = [
        {"name": f"cpu-{i:02d}", "backend": "onnxruntime", "hardware": {"nodeSelector": selector}}
        for i in range(32)
    ]
    kube = StatusOnlyKube()
    outcome = reconcile(doc, kube, Settings(), lambda *e: None, classes=[])  # type: ignore[arg-type]
    assert outcome.done
    (patch,) = kube.patches
    (ready,) = [c for c in patch["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "InvalidSpec", ready
    assert "KiB" in ready["message"] and "largest: spec.targets" in ready["message"], ready["message"]


def test_a_job_the_api_server_refuses_fails_its_target_with_the_reason() -> None:
    """What the schema cannot see (a request above its limit) the API server refuses on the Job:
    the target fails with that message instead of every reconcile raising."""
    from kubernetes.client.exceptions import ApiException

    class RefusingKube(FleetKube):
        def create_job(self, namespace: str, body: dict[str, Any]) -> bool:
            err = ApiException(status=422, reason="Unprocessable Entity")
            err.body = json.dumps(
                {
                    "message": 'Job.batch "m-cpu" is invalid: spec.template.spec.containers[0].resources'
                    '.requests: Invalid value: "4": must be less than or equal to cpu limit of 2'
                }
            )
            raise err

    doc = _doc({})
    doc["spec"]["targets"][0]["hardware"] = {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}
    kube = RefusingKube(classes=0)
    outcome = reconcile(doc, kube, Settings(), lambda *e: None, classes=[])  # type: ignore[arg-type]
    (target,) = kube.patches[-1]["targets"]
    assert outcome.done and target["phase"] == "Failed" and target["reason"] == "JobRefused"
    assert "must be less than or equal to cpu limit" in target["message"]
    assert "spec.targets[0].hardware" in target["message"]


def test_tuning_budgets_the_job_deadline_cannot_hold_fail_their_target_before_any_job() -> None:
    """Two tvm candidates tuning 30 and 45 minutes in a Job the operator gives an hour: the deadline
    would kill it mid-tuning, losing the hour. The target fails at once, saying what to change; the
    target without tuning in the same spec gets its Job."""

    class JobsKube(FleetKube):
        created: list[str] = []

        def create_job(self, namespace: str, body: dict[str, Any]) -> bool:
            self.created.append(body["metadata"]["labels"]["kompile.dev/target"])
            return True

    doc = _doc({})
    doc["spec"]["targets"] = [
        {
            "name": "cpu-tvm",
            "candidates": [
                {"name": "tvm-a", "backend": "tvm"},
                {"name": "tvm-b", "backend": "tvm", "options": {"tuningMinutes": "45"}},
                {"name": "tvm-untuned", "backend": "tvm", "options": {"tuningTrials": "0"}},
            ],
        },
        {"name": "cpu", "backend": "onnxruntime"},
    ]
    kube = JobsKube(classes=0)
    events: list[tuple[str, str, str]] = []
    reconcile(doc, kube, Settings(job_deadline_seconds=3600), lambda *e: events.append(e), classes=[])  # type: ignore[arg-type]
    targets = {t["name"]: t for t in kube.patches[-1]["targets"]}
    assert kube.created == ["cpu"]
    tvm = targets["cpu-tvm"]
    assert tvm["phase"] == "Failed" and tvm["reason"] == "TuningOverDeadline", tvm
    for phrase in ("75 minutes", "tvm-a 30, tvm-b 45", "KOMPILE_JOB_DEADLINE_SECONDS", "tuningMinutes"):
        assert phrase in tvm["message"], tvm["message"]
    assert any(e[1] == "TuningOverDeadline" for e in events)


def test_a_job_refused_by_the_store_is_a_failed_target_not_a_wait() -> None:
    """A compile Job whose keys the store refused to write ends Failed with reason StoreRefused (its
    termination message). It waits on nothing: StoreReachable stays as it was, and Ready is the
    failed target's, not "1 target(s) wait on the artifact store"."""
    from kompile.api.status import CompiledModelStatus, TargetStatus
    from kompile.operator.reconcile import _store_reachable

    failed = TargetStatus(
        name="cpu",
        backend="onnxruntime",
        precision="fp32",
        phase="Failed",
        reason="StoreRefused",
        message="x",
    )
    status = CompiledModelStatus(targets=[failed])
    events: list[tuple[str, str, str]] = []
    _store_reachable(status, 1, lambda *e: events.append(e))
    assert not [c for c in status.conditions if c.type in ("StoreReachable", "Ready")], status.conditions
    assert not events
    waiting = failed.model_copy(update={"phase": "Pending"})
    _store_reachable(CompiledModelStatus(targets=[waiting]), 1, lambda *e: events.append(e))
    assert [e[1] for e in events] == ["StoreRefused"]
