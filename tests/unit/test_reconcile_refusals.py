"""What the operator refuses before any Job: a spec the typed models refuse (a bad backend option
value the CRD's key-only rule lets through) becomes Ready=False, reason InvalidSpec, with a message
naming the key, and no Job, Secret or Node is ever read."""

from __future__ import annotations

from typing import Any

import pytest

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
    outcome = reconcile(_doc(options), kube, Settings(), lambda *e: events.append(e))  # type: ignore[arg-type]
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
    from kompile.operator import reconcile as rec
    from kompile.operator.reconcile import StoreAccess, StoreUnavailable, source_fingerprint

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
    from kompile.operator.reconcile import StoreAccess, _target
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
    ts = _target(cm, rt, job, None, PodsKube(), Settings(), StoreAccess(None, None), lambda *e: None)  # type: ignore[arg-type]
    assert ts.phase == "Succeeded" and ts.speedup == 2.0 and ts.cache_key == "k" * 40


def test_an_unreadable_cache_launches_nothing_and_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache lookup that fails (S3 down) used to count as a miss: a second compile of what may be
    stored. Now the target waits (Pending, StoreUnavailable) and, within the endpoint's backoff, the
    store is not called again. The store is a stand-in that fails; the Kube stand-in refuses every
    call, so no Job can be created."""
    from kompile.api.resource import parse_manifest
    from kompile.artifact_store import StoreError
    from kompile.operator import reconcile as rec
    from kompile.operator.outages import Breaker
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
    first = rec._target(cm, rt, None, None, StatusOnlyKube(), settings, store, lambda *e: None)  # type: ignore[arg-type]
    assert (first.phase, first.reason) == ("Pending", "StoreUnavailable"), first
    assert "EndpointConnectionError" in (first.message or "") and first.job is None
    again = rec._target(cm, rt, None, None, StatusOnlyKube(), settings, store, lambda *e: None)  # type: ignore[arg-type]
    assert again.reason == "StoreUnavailable" and "next attempt in" in (again.message or "")
    assert len(calls) == 1  # the second look waited out the backoff instead of calling
    assert first.cache_key == again.cache_key  # an outage never changes a key


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
