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
