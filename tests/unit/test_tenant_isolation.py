"""What one namespace's CompiledModel can do to another's, with the cluster stood in (recording
stand-ins for the Kubernetes API at the edge) and a real file store: a cache entry written for one
namespace is never another's cache hit, and the GitOps ConfigMap is created or updated only when
the CompiledModel owns it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kompile.api.status import Artifact, TargetStatus, Thresholds, ValidationResult
from kompile.artifact_store import join, write_bytes
from kompile.operator.jobs import ANNOTATION_PREFIX
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings


class RecordingKube:
    """The Kubernetes calls reconcile makes for listed targets: no Jobs or Nodes yet; Jobs created
    and status patches are recorded."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []
        self.patches: list[dict[str, Any]] = []

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []

    def list_nodes(self) -> list[dict[str, Any]]:
        return []

    def create_job(self, namespace: str, body: dict[str, Any]) -> bool:
        self.jobs.append(body)
        return True

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.patches.append(body)


def doc(namespace: str, uid: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m", "namespace": namespace, "uid": uid, "generation": 1},
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [{"name": "input", "shape": [1, 3, 32, 32]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime"}],
            **spec,
        },
    }


def _validated_entry(prefix: str, artifact: bool = False) -> None:
    """What a compile pod publishes: a file, then result.json naming it (and, with artifact, the
    artifact record a rollout serves from)."""
    write_bytes(join(prefix, "m", "1", "model.onnx"), b"model", None, None)
    target = TargetStatus(
        name="cpu",
        backend="onnxruntime",
        precision="fp32",
        phase="Succeeded",
        artifact=Artifact(uri=join(prefix, "m"), digest="sha256:" + "a" * 64, size_bytes=5)
        if artifact
        else None,
        validation=ValidationResult(passed=True, samples=1, thresholds=Thresholds(min_cosine=0.99, top_k=5)),
    )
    result = {"target": target.to_wire(), "files": {"m/1/model.onnx": 5}}
    write_bytes(join(prefix, "result.json"), json.dumps(result).encode(), None, None)


def test_a_cache_entry_of_one_namespace_is_never_a_hit_in_another(tmp_path: Path) -> None:
    settings = Settings(artifact_store=(tmp_path / "store").as_uri())
    team_a = RecordingKube()
    reconcile(doc("team-a", "u-a"), team_a, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
    (job,) = team_a.jobs
    prefix = job["metadata"]["annotations"][ANNOTATION_PREFIX]
    assert "/cache/team-a/" in prefix
    _validated_entry(prefix)

    again = RecordingKube()
    reconcile(doc("team-a", "u-a2"), again, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
    assert not again.jobs and again.patches[-1]["targets"][0]["reason"] == "CacheHit"

    team_b = RecordingKube()
    reconcile(doc("team-b", "u-b"), team_b, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
    (b_job,) = team_b.jobs  # compiled again, in its own folder
    assert "/cache/team-b/" in b_job["metadata"]["annotations"][ANNOTATION_PREFIX]
    assert team_b.patches[-1]["targets"][0].get("reason") != "CacheHit"


class ConfigMapKube:
    """One namespace's ConfigMaps, as the API server keeps them (resourceVersion checked on
    replace); what reconcile's GitOps writer does to them."""

    def __init__(self, existing: dict[str, Any] | None = None) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        if existing is not None:
            self.maps[existing["metadata"]["name"]] = existing | {}
        self.writes: list[str] = []

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.maps.get(name)

    def create_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        assert body["metadata"]["name"] not in self.maps, "create over an existing ConfigMap"
        self.maps[body["metadata"]["name"]] = body | {"metadata": body["metadata"] | {"resourceVersion": "1"}}
        self.writes.append("create")

    def replace_config_map(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        assert body["metadata"].get("resourceVersion") == self.maps[name]["metadata"]["resourceVersion"]
        self.maps[name] = body
        self.writes.append("replace")


def _gitops_cm(uid: str) -> Any:
    from kompile.api.resource import parse_manifest

    return parse_manifest(
        doc("team-b", uid, rollout={"enabled": True, "gitops": {"configMap": "app-config"}}, registry={})
    )


MANIFEST = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "m"}}


def test_gitops_writes_only_a_configmap_this_compiledmodel_owns() -> None:
    from kompile.operator.serve import write_gitops_config_map

    foreign = {
        "metadata": {"name": "app-config", "resourceVersion": "7", "ownerReferences": []},
        "data": {"database": "postgres://prod"},
    }
    kube = ConfigMapKube(foreign)
    refused = write_gitops_config_map(_gitops_cm("u-1"), [MANIFEST], kube)  # type: ignore[arg-type]
    assert refused and "ConfigMap app-config exists and is not owned by this CompiledModel" in refused
    assert "spec.rollout.gitops.configMap" in refused
    assert kube.writes == [] and kube.maps["app-config"] == foreign

    fresh = ConfigMapKube()
    assert write_gitops_config_map(_gitops_cm("u-1"), [MANIFEST], fresh) is None  # type: ignore[arg-type]
    made = fresh.maps["app-config"]
    assert made["metadata"]["ownerReferences"][0]["uid"] == "u-1" and "m.yaml" in made["data"]
    # Its own ConfigMap is updated in place; another CompiledModel's (another uid) is not.
    assert write_gitops_config_map(_gitops_cm("u-1"), [MANIFEST], fresh) is None  # type: ignore[arg-type]
    assert fresh.writes == ["create", "replace"]
    assert write_gitops_config_map(_gitops_cm("u-2"), [MANIFEST], fresh)  # type: ignore[arg-type]
    assert fresh.writes == ["create", "replace"]
