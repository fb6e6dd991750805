"""Registration is idempotent per (uid, generation, target): an operator that crashed (or hit an API
error) after registering and before patching status registers the same generation again on its
next reconcile, and must find what it wrote instead of adding a second parent run and a second
version per target. Real MLflow (its SQLite store), no stand-in."""

from __future__ import annotations

from pathlib import Path

from kompile.api.resource import parse_manifest
from kompile.api.status import Artifact, CompiledModelStatus, TargetStatus, Thresholds, ValidationResult
from kompile.registry import TargetRecord, record
from tests.pipeline.conftest import small_cnn_doc


def _records(tmp_path: Path) -> tuple[CompiledModelStatus, list[TargetRecord]]:
    targets = []
    for name in ("cpu-fp32", "cpu-int8"):
        targets.append(
            TargetStatus(
                name=name,
                backend="onnxruntime",
                precision=name.split("-")[1],
                phase="Succeeded",
                artifact=Artifact(uri=f"s3://bucket/small/{name}", digest="sha256:" + "a" * 64),
                validation=ValidationResult(
                    passed=True, samples=1, thresholds=Thresholds(min_cosine=0.99, top_k=1)
                ),
            )
        )
    status = CompiledModelStatus(targets=targets, source_digest="sha256:" + "b" * 64)
    return status, [TargetRecord(t, None, {"backend": "onnxruntime"}) for t in targets]


def test_registering_a_generation_twice_adds_nothing(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    doc = small_cnn_doc()
    doc["metadata"] |= {"namespace": "team-a", "uid": "0b5e-uid", "generation": 3}
    cm = parse_manifest(doc)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first_status, first = _records(tmp_path)
    reg = record(cm, first_status, first, uri, artifact_location=(tmp_path / "art").as_uri())
    again_status, again = _records(tmp_path)  # the crash lost the status patch: nothing remembered
    reg2 = record(cm, again_status, again, uri, artifact_location=(tmp_path / "art").as_uri())
    assert reg2.run_id == reg.run_id
    client = MlflowClient(tracking_uri=uri)
    versions = client.search_model_versions("name='small'")
    assert sorted(v.tags["kompile.target"] for v in versions) == ["cpu-fp32", "cpu-int8"]
    assert [t.registered_version for t in again_status.targets] == [
        t.registered_version for t in first_status.targets
    ]
    exp = client.get_experiment_by_name("kompile/team-a/small")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 3  # one parent, one child per target
    # A new generation is a new record.
    doc["metadata"]["generation"] = 4
    record(parse_manifest(doc), *_records(tmp_path), uri, artifact_location=(tmp_path / "art").as_uri())
    assert len(client.search_model_versions("name='small'")) == 4
