"""The `latest` pointer per hardware class (kompile.operator.latest): what it says, where it goes,
that a settled generation writes it once, and that a store outage shows in StoreReachable instead
of failing the reconcile. The store is a local folder, or a stand-in that fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kompile.operator import latest
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings
from tests.unit.test_rollout import target

TARGETS = [
    target("arm-ort", "cpu-arm64", "onnxruntime", 9.0),
    target("arm-pte", "cpu-arm64", "executorch", 7.0, speedup=4.0, err=0.01),
    target("arm-bad", "cpu-arm64", "onnxruntime", 1.0, passed=False),  # fastest, but failed validation
    target("x86-ort", "cpu-amd64", "onnxruntime", 5.0),
    target("mac", "cpu-amd64", "coreml", 0.1, phase="Exported"),  # never validated: never a winner
]


def test_each_class_points_at_its_fastest_validated_artifact() -> None:
    winners = latest.class_winners(TARGETS)
    assert {c: t.name for c, t in winners.items()} == {"cpu-arm64": "arm-pte", "cpu-amd64": "x86-ort"}
    doc = latest.pointer_doc(
        winners["cpu-arm64"], namespace="ml", compiled_model="resnet", model_name="resnet-reg", generation=4
    )
    assert doc == {
        "kind": "kompile.dev/LatestArtifact/v1",
        "namespace": "ml",
        "compiledModel": "resnet",
        "modelName": "resnet-reg",
        "hardwareClass": "cpu-arm64",
        "generation": 4,
        "target": "arm-pte",
        "backend": "executorch",
        "precision": "fp16",
        "uri": "s3://art/resnet/arm-pte-1234",
        "modelDir": "s3://art/resnet/arm-pte-1234/resnet/1",
        "digest": "sha256:" + "a" * 64,
        "sizeBytes": None,
        "validation": {"passed": True, "samples": 4, "minCosine": 1.0, "maxAbsError": 0.01},
        "p50Ms": 7.0,
        "batchSize": 1,
        "speedup": 4.0,
    }
    assert json.loads(latest.pointer_bytes(doc)) == doc
    assert latest.pointer_uri("s3://b/root/", "ml", "resnet-reg", "cpu-arm64") == (
        "s3://b/root/latest/ml/resnet-reg/cpu-arm64.json"
    )


def _settled_doc(store: str) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "resnet", "namespace": "ml", "uid": "u-1", "generation": 2},
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
            "targets": [{"name": t.name, "backend": t.backend} for t in TARGETS[:2] + TARGETS[3:4]],
            "registry": {"artifactStore": store},
        },
        "status": {
            "observedGeneration": 2,
            "targets": [t.to_wire() for t in TARGETS[:2] + TARGETS[3:4]],
        },
    }


class SettledKube:
    """A stand-in for the API: no Jobs (every target settled), status patches recorded."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.patches.append(body)


def test_a_settled_generation_writes_each_pointer_once(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    kube = SettledKube()
    outcome = reconcile(_settled_doc(store), kube, Settings(), lambda *e: None, classes=[])  # type: ignore[arg-type]
    pointers = {p.hardware_class: p for p in outcome.status.latest}
    assert set(pointers) == {"cpu-arm64", "cpu-amd64"} and pointers["cpu-arm64"].target == "arm-pte"
    arm = tmp_path / "store" / "latest" / "ml" / "resnet" / "cpu-arm64.json"
    assert pointers["cpu-arm64"].uri == arm.as_uri()
    assert json.loads(arm.read_text())["target"] == "arm-pte"
    assert outcome.requeue_after is None  # nothing left to do
    # The next pass finds them written: no second write, no status change.
    arm.unlink()
    again = {**_settled_doc(store), "status": kube.patches[-1]}
    reconcile(again, kube, Settings(), lambda *e: None, classes=[])  # type: ignore[arg-type]
    assert not arm.exists() and len(kube.patches) == 1


def test_a_store_outage_shows_in_store_reachable_and_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    from kompile.artifact_store import StoreError
    from kompile.operator import store_access
    from kompile.operator.outages import Breaker

    def down(uri: str, *_: Any) -> None:
        raise StoreError(f"write of {uri} failed: EndpointConnectionError")

    monkeypatch.setattr(latest, "write_bytes", down)
    monkeypatch.setattr(store_access, "BREAKER", Breaker(first=0.0))
    events: list[tuple[str, str, str]] = []
    kube = SettledKube()
    doc = _settled_doc("s3://store/root")
    outcome = reconcile(doc, kube, Settings(), lambda *e: events.append(e), classes=[])  # type: ignore[arg-type]
    conds = {c.type: c for c in outcome.status.conditions}
    assert conds["StoreReachable"].status == "False" and conds["StoreReachable"].reason == "StoreUnavailable"
    assert "latest pointers" in conds["StoreReachable"].message
    assert "EndpointConnectionError" in conds["StoreReachable"].message
    assert conds["Ready"].status == "False" and outcome.status.latest == []
    assert outcome.requeue_after == Settings().resync_seconds  # looked at again, not forgotten
    assert [e[1] for e in events].count("StoreUnavailable") == 1

    written: list[str] = []
    monkeypatch.setattr(latest, "write_bytes", lambda uri, *_: written.append(uri))
    back = reconcile({**doc, "status": kube.patches[-1]}, kube, Settings(), lambda *e: None, classes=[])  # type: ignore[arg-type]
    conds = {c.type: c for c in back.status.conditions}
    assert conds["StoreReachable"].status == "True" and conds["Ready"].status == "True"
    assert sorted(written) == [
        "s3://store/root/latest/ml/resnet/cpu-amd64.json",
        "s3://store/root/latest/ml/resnet/cpu-arm64.json",
    ]
