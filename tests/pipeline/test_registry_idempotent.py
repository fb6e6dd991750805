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
from tests.support.servers import MlflowServer


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
    assert reg.tracking_uri == uri  # an sqlite:////absolute path, as given
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


def test_the_recorded_status_names_mlflow_without_its_keys(
    tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    """status.registry.trackingUri is what every reader of the CompiledModel sees: a URI with
    user:password@ (sent by MLflow's client as basic auth) is recorded there without them."""
    scheme, _, rest = mlflow_server.tracking_uri.partition("://")
    uri = f"{scheme}://kompile:s3cret@{rest}"
    status, records = _records(tmp_path)
    reg = record(parse_manifest(small_cnn_doc()), status, records, uri)
    assert reg.run_id and reg.tracking_uri == mlflow_server.tracking_uri
