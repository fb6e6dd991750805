"""One Warning per cause: a pass whose refusal (MLflow unreachable, a GitOps ConfigMap someone else
owns) also turns Ready False posts that refusal's Event once, not a second time as Ready's
transition. The cluster is stood in at the edge (RecordingKube); the store is a real file store."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from kompile.operator.jobs import ANNOTATION_PREFIX
from kompile.operator.outages import bound_calls
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings
from tests.unit.test_tenant_isolation import RecordingKube, _validated_entry, doc


class ConfigMapKube(RecordingKube):
    """Also answers for a ConfigMap that an application team made (no ownerReference); no KServe
    settings ConfigMap and no InferenceService CRD (GitOps mode needs neither)."""

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        if name != "app-config":
            return None
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "7"}, "data": {}}

    def get_crd(self, name: str) -> dict[str, Any] | None:
        return None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settle(spec: dict[str, Any], settings: Settings, kube: RecordingKube) -> list[tuple[str, str, str]]:
    """The first pass starts the Job, its pod publishes a validated result, the next pass settles."""
    first = RecordingKube()
    reconcile(doc("team-t", "u-t", **spec), first, settings, lambda *e: None, classes=[])  # type: ignore[arg-type]
    _validated_entry(first.jobs[0]["metadata"]["annotations"][ANNOTATION_PREFIX], artifact=True)
    events: list[tuple[str, str, str]] = []
    reconcile(doc("team-t", "u-t2", **spec), kube, settings, lambda *e: events.append(e), classes=[])  # type: ignore[arg-type]
    return events


def test_mlflow_unreachable_is_told_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unreachable = f"http://127.0.0.1:{_closed_port()}"
    settings = Settings(
        artifact_store=(tmp_path / "store").as_uri(), tracking_uri=unreachable, call_timeout_seconds=2.0
    )
    env: dict[str, str] = {}
    bound_calls(settings, env)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = {"registry": {"modelName": "told-once"}}
    kube = RecordingKube()
    events = _settle(spec, settings, kube)
    ready = next(c for c in kube.patches[-1]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RegistryUnavailable")
    assert [e[1] for e in events if e[0] == "Warning"] == ["RegistryUnavailable"], events


def test_a_configmap_not_owned_is_told_once(tmp_path: Path) -> None:
    settings = Settings(artifact_store=(tmp_path / "store").as_uri())
    spec = {"registry": {}, "rollout": {"enabled": True, "gitops": {"configMap": "app-config"}}}
    kube = ConfigMapKube()
    events = _settle(spec, settings, kube)
    ready = next(c for c in kube.patches[-1]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ConfigMapNotOwned"), (kube.patches[-1], events)
    assert [e[1] for e in events if e[0] == "Warning"] == ["ConfigMapNotOwned"], events
