"""A hardware class that joins the fleet after its generation was recorded in MLflow still gets its
child run and model version, under the same parent run (real MLflow on SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompile.api import parse_manifest
from kompile.api.status import Artifact, CompiledModelStatus, TargetStatus
from kompile.operator.lineage import register_generation
from kompile.operator.settings import Settings
from tests.pipeline.conftest import small_cnn_doc


def _built(name: str, cls: str) -> TargetStatus:
    return TargetStatus(
        name=name,
        backend="onnxruntime",
        precision="fp32",
        phase="Succeeded",
        hardware_class=cls,
        artifact=Artifact(uri=f"s3://art/small/{name}", digest="sha256:" + "ab" * 32),
    )


def test_a_late_class_is_registered_under_the_generation_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a database store without a server keeps run artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    doc = small_cnn_doc(registry={"trackingUri": uri, "artifactStore": "s3://art"})
    doc["metadata"] |= {"namespace": "ml", "uid": "u-1", "generation": 1}
    cm = parse_manifest(doc)
    events: list[tuple[str, str, str]] = []
    status = CompiledModelStatus(targets=[_built("cpu-amd64-fp32", "cpu-amd64")])
    register_generation(cm, status, Settings(), lambda *e: events.append(e))
    assert status.registry is not None and status.targets[0].registered_version == "1"
    parent = status.registry.run_id

    status.targets.append(_built("gpu-nvidia-a10-sm86-fp32", "gpu-nvidia-a10-sm86"))
    register_generation(cm, status, Settings(), lambda *e: events.append(e))
    late = status.targets[1]
    assert late.registered_version == "2" and status.registry.run_id == parent

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    version = client.get_model_version("small", "2")
    assert client.get_run(version.run_id).data.tags["mlflow.parentRunId"] == parent
    register_generation(cm, status, Settings(), lambda *e: events.append(e))  # nothing new to record
    assert len(client.search_model_versions("name='small'")) == 2
    assert [e[1] for e in events] == ["Registered", "Registered"]
