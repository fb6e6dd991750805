"""`kompile run` end to end on this machine: artifacts, verdicts, MLflow, and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.pipeline.conftest import EXAMPLES, small_cnn_doc


def _target(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in status["targets"] if t["name"] == name)


def test_small_cnn_fleet_example_compiles_validates_and_registers(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = kompile_run(EXAMPLES / "small-cnn.yaml")
    assert res.code == 0, res.stderr
    status = res.status
    assert status["targetsReady"] == "2/2"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert status["sourceDigest"].startswith("sha256:")
    for t in status["targets"]:
        assert t["phase"] == "Succeeded" and t["validation"]["passed"]
        assert [lat["batchSize"] for lat in t["latency"]] == [1, 8]
        assert t["speedup"] > 0 and t["registeredVersion"]
        repo = Path(t["artifact"]["uri"].removeprefix("file://"))
        assert (repo / "small-cnn" / "config.pbtxt").exists()
        assert (repo / "small-cnn" / "1" / "model.onnx").exists()
        result = json.loads((repo / "result.json").read_text())
        assert result["sourceDigest"] == status["sourceDigest"]
        assert result["target"]["validation"]["thresholds"]["minCosine"] > 0
        assert "onnxruntime" in result["toolchain"]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=status["registry"]["trackingUri"])
    versions = client.search_model_versions("name='small-cnn'")
    assert len(versions) == 2
    for v in versions:
        assert v.tags["kompile.verdict"] == "passed"
        assert v.tags["kompile.source_digest"] == status["sourceDigest"]
    model = client.get_registered_model("small-cnn")
    assert set(model.aliases) == {t["name"] for t in status["targets"]}


def test_failed_validation_is_registered_but_never_aliased(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(
        targets=[
            {
                "name": "strict-int8",
                "backend": "onnxruntime",
                "precision": "int8",
                "tolerances": {"minCosine": 1.0, "maxAbsError": 0.0},
            }
        ]
    )
    res = kompile_run(write_manifest(doc))
    assert res.code == 1
    t = _target(res.status, "strict-int8")
    assert t["phase"] == "Failed" and t["reason"] == "ValidationFailed"
    assert not t["validation"]["passed"] and t["validation"]["failures"]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=res.status["registry"]["trackingUri"])
    (version,) = client.search_model_versions("name='small'")
    assert version.tags["kompile.verdict"] == "failed"
    assert client.get_registered_model("small").aliases == {}


def test_model_file_sources(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from models.small import small_cnn  # type: ignore[import-not-found]

    module = small_cnn()
    example = torch.randn(1, 3, 32, 32)
    torch.jit.trace(module, example).save(str(tmp_path / "m.pt"))
    batch = torch.export.Dim("batch", min=1, max=16)
    torch.export.save(
        # batch 2: an example of size 1 lets torch.export specialize the dynamic batch to 1
        torch.export.export(module, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: batch},)),
        str(tmp_path / "m.pt2"),
    )
    torch.onnx.export(
        module,
        (example,),
        str(tmp_path / "m.onnx"),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
    )
    for name in ("m.pt", "m.pt2", "m.onnx"):
        res = kompile_run(
            write_manifest(small_cnn_doc(source={"uri": name}), f"{name}.yaml"), "--no-register"
        )
        assert res.code == 0, (name, res.stderr)
        assert _target(res.status, "cpu-fp32")["validation"]["passed"], name


def test_dataset_reference_inputs(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    np.savez(
        tmp_path / "ref.npz",
        input=np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32),
    )
    res = kompile_run(write_manifest(small_cnn_doc(validation={"dataset": "ref.npz"})), "--no-register")
    assert res.code == 0, res.stderr
    assert _target(res.status, "cpu-fp32")["validation"]["samples"] == 3


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        ({"source": {"uri": "missing.onnx"}}, "missing.onnx does not exist"),
        ({"source": {"uri": "weights.bin"}}, "set spec.source.format"),
        ({"source": {"uri": "python://models.small:nan_model"}}, "NaN"),
        ({"source": {"uri": "python://models.small:data_dependent"}}, "small.py:"),
        ({"inputs": [{"name": "input", "shape": [1, 5, 32, 32]}]}, "check spec.inputs"),
        ({"validation": {"dataset": "nope.npz"}}, "nope.npz does not exist"),
    ],
    ids=["missing-file", "unknown-format", "nan", "export-failure", "input-mismatch", "missing-dataset"],
)
def test_bad_input_is_explained_and_nothing_validated(kompile_run, write_manifest, change, phrase) -> None:  # type: ignore[no-untyped-def]
    res = kompile_run(write_manifest(small_cnn_doc(**change)))
    assert res.code != 0
    text = res.stderr + res.stdout
    assert phrase in text, text
    if res.stdout.strip():  # the run got as far as a status: nothing in it validated
        assert all(not (t.get("validation") or {}).get("passed") for t in res.status["targets"])


def test_manifest_error_names_the_field(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc()
    doc["spec"]["targets"][0]["precision"] = "fp64"
    res = kompile_run(write_manifest(doc))
    assert res.code == 2
    assert "spec.targets[0].precision" in res.stderr


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: a connection to it is refused


@pytest.mark.parametrize("registry", ["http-refused", "sqlite-not-a-database"])
def test_a_registry_that_cannot_record_is_found_before_the_compile(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path, registry: str
) -> None:
    """Registration comes after the whole compile: an MLflow nobody listens for (MLflow's client
    retried it for 5 minutes here, then kompile called it a bug of its own) or a tracking database
    that is no database is said before any work, with what to change."""
    if registry == "http-refused":
        uri = f"http://127.0.0.1:{_closed_port()}"
        secret_uri = uri.replace("http://", "http://alice:s3cret@")
    else:
        (tmp_path / "notes.db").write_text("not a database\n")
        uri = secret_uri = f"sqlite:///{tmp_path / 'notes.db'}"
    res = kompile_run(write_manifest(small_cnn_doc()), "--tracking-uri", secret_uri)
    assert res.code == 2 and uri in res.stderr and "--no-register" in res.stderr, res.stderr
    assert "s3cret" not in res.stderr, res.stderr  # keys in the URI are never shown
    assert "bug in kompile" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / ".kompile" / "artifacts").exists()  # nothing compiled
    if registry != "http-refused":
        assert (tmp_path / "notes.db").read_text() == "not a database\n"  # nothing written to it


def test_a_registration_that_fails_after_the_compile_keeps_the_run(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow failing at the registration itself (here a stand-in at the record() edge: a server
    that went away after the check, a disk that filled) still shows the run's status and says
    where its validated artifacts are; the exit code says the run is not complete."""
    from mlflow.exceptions import MlflowException

    from kompile import registry

    def record(*args: Any, **kwargs: Any) -> None:
        raise MlflowException("(sqlite3.OperationalError) database or disk is full")

    monkeypatch.setattr(registry, "record", record)
    res = kompile_run(write_manifest(small_cnn_doc()))
    assert res.code == 1, res.stderr
    (target,) = res.status["targets"]
    assert target["phase"] == "Succeeded" and not target.get("registeredVersion")
    artifact = Path(target["artifact"]["uri"].removeprefix("file://"))
    assert (artifact / "small" / "1" / "model.onnx").is_file()
    assert "database or disk is full" in res.stderr and str(artifact) in res.stderr, res.stderr
    assert "bug in kompile" not in res.stderr, res.stderr


def test_mlflow_model_source_links_lineage(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import mlflow
    from mlflow import MlflowClient
    from models.small import small_cnn  # type: ignore[import-not-found]

    uri = f"sqlite:///{tmp_path / 'source.db'}"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("training", artifact_location=(tmp_path / "training").as_uri())
    with mlflow.start_run(experiment_id=exp):
        # MLflow 3 logs it with torch.export at the example's shapes: 2 rows keep the batch dynamic.
        for rows in (2, 1):
            example = np.zeros((rows, 3, 32, 32), np.float32)
            mlflow.pytorch.log_model(
                small_cnn(), name="model", registered_model_name="small-trained", input_example=example
            )
    doc = small_cnn_doc(source={"uri": "models:/small-trained/1"}, registry={"trackingUri": uri})
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # set by mlflow.set_tracking_uri above: kompile must not
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr
    # Found when the batch max was first held: logged from one row, its batch is static, and a
    # spec declaring it up to 16 is refused, saying how to log it again.
    one_row = kompile_run(
        write_manifest({**doc, "spec": {**doc["spec"], "source": {"uri": "models:/small-trained/2"}}})
    )
    assert one_row.code == 2, one_row.stderr
    assert "spec.inputs declares batch up to 16, but the source model fails there" in one_row.stderr
    assert "an input_example of 2 or more rows" in one_row.stderr, one_row.stderr
    assert "MLFLOW_TRACKING_URI" not in os.environ  # the source loader passed the URI, set nothing
    assert res.status["sourceDigest"].startswith("sha256:")
    (version,) = MlflowClient(tracking_uri=uri).search_model_versions("name='small'")
    assert version.tags["mlflow.source.uri"] == "models:/small-trained/1"


def test_s3_source_and_s3_artifact_store(
    kompile_run, write_manifest, tmp_path: Path, s3_server, s3_env
) -> None:  # type: ignore[no-untyped-def]
    from models.small import small_cnn  # type: ignore[import-not-found]

    bucket = "pipeline"
    s3_server.create_bucket(bucket)
    torch.onnx.export(
        small_cnn(),
        (torch.randn(1, 3, 32, 32),),
        str(tmp_path / "m.onnx"),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
    )
    s3_server.client().upload_file(str(tmp_path / "m.onnx"), bucket, "models/m.onnx")
    doc = small_cnn_doc(
        source={"uri": f"s3://{bucket}/models/m.onnx"},
        registry={"artifactStore": f"s3://{bucket}/artifacts", "s3Endpoint": s3_server.endpoint},
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    uri = _target(res.status, "cpu-fp32")["artifact"]["uri"]
    assert uri.startswith(f"s3://{bucket}/artifacts/small/cpu-fp32-")
    keys = {
        o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket, Prefix="artifacts/")["Contents"]
    }
    prefix = uri.removeprefix(f"s3://{bucket}/")
    assert {f"{prefix}/small/config.pbtxt", f"{prefix}/small/1/model.onnx", f"{prefix}/result.json"} <= keys
    missing = kompile_run(
        write_manifest(small_cnn_doc(source={"uri": f"s3://{bucket}/models/nope.onnx"}), "n.yaml")
    )
    assert missing.code == 2 and "download failed" in missing.stderr


def test_artifacts_flag_takes_an_s3_root_as_the_store(
    kompile_run, write_manifest, tmp_path: Path, s3_server, s3_env, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """`--artifacts s3://bucket/prefix` (its help: "default: spec.registry.artifactStore") was taken
    as a local path: the artifacts went to a folder named "s3:" in the current directory."""
    bucket = "cli-store"
    s3_server.create_bucket(bucket)
    monkeypatch.chdir(tmp_path)
    res = kompile_run(write_manifest(small_cnn_doc()), "--no-register", "--artifacts", f"s3://{bucket}/a")
    assert res.code == 0, res.stderr
    uri = _target(res.status, "cpu-fp32")["artifact"]["uri"]
    assert uri.startswith(f"s3://{bucket}/a/small/cpu-fp32-"), uri
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"{uri.removeprefix(f's3://{bucket}/')}/small/1/model.onnx" in keys
    assert any(k.startswith("a/latest/") for k in keys), keys
    assert not (tmp_path / "s3:").exists()
    other = kompile_run(write_manifest(small_cnn_doc()), "--artifacts", "gs://bucket/a")
    assert other.code == 2 and "--artifacts" in other.stderr and "s3://" in other.stderr, other.stderr
    missing = kompile_run(write_manifest(small_cnn_doc()), "--artifacts", "s3://no-such-bucket/a")
    assert missing.code == 2 and "--artifacts" in missing.stderr, missing.stderr
    assert "spec.registry.artifactStore" not in missing.stderr, missing.stderr


def test_s3_refusals_say_what_to_check(
    kompile_run, write_manifest, tmp_path: Path, s3_server, s3_env, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Wrong keys for an s3:// source, or an artifact store bucket that is not there: the run stops
    before compiling and says what to check, not a bare "download failed: 403"."""
    bucket = "refusals"
    s3_server.create_bucket(bucket)
    (tmp_path / "m.onnx").write_bytes(b"not read: the keys are refused first")
    s3_server.client().upload_file(str(tmp_path / "m.onnx"), bucket, "models/m.onnx")
    doc = small_cnn_doc(source={"uri": f"s3://{bucket}/models/m.onnx"})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key")
    refused = kompile_run(write_manifest(doc), "--no-register")
    assert refused.code == 2, refused.stderr
    assert "refused" in refused.stderr and "AWS_SECRET_ACCESS_KEY" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env["AWS_SECRET_ACCESS_KEY"])
    doc = small_cnn_doc(
        registry={"artifactStore": "s3://no-such-bucket/artifacts", "s3Endpoint": s3_server.endpoint}
    )
    missing = kompile_run(write_manifest(doc, "b.yaml"), "--no-register")
    assert missing.code != 0 and "NoSuchBucket" in missing.stderr, missing.stderr
    assert "spec.registry.artifactStore" in missing.stderr, missing.stderr
    assert "compiling" not in missing.stderr, missing.stderr  # found out before any build


def test_inductors_cache_is_kept_under_the_work_dir(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor caches each compiled graph (kernels, .so files: 400 MB after a day of runs here) in
    /tmp/torchinductor_<user>, where nothing ever removes it and no one looks. A local run keeps
    it under its work dir, beside its other caches; the variable is as it was after the run, and a
    cache folder the user chose is theirs to keep."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    doc = small_cnn_doc(targets=[{"name": "cpu", "backend": "inductor", "precision": "fp32"}])
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    cache = tmp_path / ".kompile" / "cache" / "inductor"
    assert cache.is_dir() and any(cache.iterdir()), cache
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    chosen = tmp_path / "mine"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(chosen))
    doc["metadata"]["name"] = "again"
    res = kompile_run(write_manifest(doc, "again.yaml"), "--no-register")
    assert res.code == 0, res.stderr
    assert chosen.is_dir() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(chosen)
