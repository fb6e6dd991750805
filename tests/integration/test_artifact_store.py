"""kompile.artifact_store against a real S3 server (versitygw on loopback) and local folders, and the
MLflow server's use of that S3 server: run artifacts proxied into the bucket, and model versions whose
source is an s3:// artifact (what the operator registers).

Needs no control plane. The servers come from tests/support/fixtures.py (registered in the root
tests/conftest.py, or with `-p tests.support.fixtures`).
"""

from __future__ import annotations

import os
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kompile.artifact_store import (
    DENIED_CODES,
    StoreDenied,
    StoreError,
    files_older_than,
    join,
    own_keys_hint,
    put_tree,
    read_bytes,
    write_bytes,
)
from tests.support.servers import MlflowServer, S3Server

STORE_BUCKET = "kompile-artifacts"
MULTIPART_BYTES = 9 * 1024 * 1024  # above boto3's 8 MiB multipart threshold: a model file's real path


def _unique() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture(params=["s3", "file"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty root URI: a prefix in a bucket of the real S3 server, or a file:// folder."""
    if request.param == "file":
        return (tmp_path / "store").as_uri()
    server: S3Server = request.getfixturevalue("s3_server")
    request.getfixturevalue("s3_env")  # the store reads endpoint and keys from the environment
    server.create_bucket(STORE_BUCKET)
    return f"s3://{STORE_BUCKET}/tests/{_unique()}"


@pytest.fixture
def model_tree(tmp_path: Path) -> dict[str, bytes]:
    """A Triton-style model repository on disk; maps each file's relative path to its bytes."""
    files = {
        "resnet/config.pbtxt": b'name: "resnet"\nplatform: "onnxruntime_onnx"\n',
        "resnet/1/model.onnx": os.urandom(MULTIPART_BYTES),
        "resnet/1/deep/er/weights.bin": bytes(range(256)),
        "result.json": b'{"passed": true}',
    }
    for rel, data in files.items():
        path = tmp_path / "tree" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def _tree_dir(tmp_path: Path) -> Path:
    return tmp_path / "tree"


def _listing(root: str, s3: S3Server | None) -> dict[str, bytes]:
    """Every object under root (relative key -> bytes), read around the store under test."""
    if s3 is None:
        base = Path(root.removeprefix("file://"))
        return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}
    bucket, _, prefix = root.removeprefix("s3://").partition("/")
    client = s3.client()
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            found[obj["Key"].removeprefix(f"{prefix}/")] = body
    return found


def _server_of(request: pytest.FixtureRequest, root: str) -> S3Server | None:
    return request.getfixturevalue("s3_server") if root.startswith("s3://") else None


def test_put_tree_round_trip(
    request: pytest.FixtureRequest, store_root: str, model_tree: dict[str, bytes], tmp_path: Path
) -> None:
    uri = join(store_root, "cm", "sha256-0123abcd")
    assert put_tree(_tree_dir(tmp_path), uri) == uri
    for rel, data in model_tree.items():
        assert read_bytes(join(uri, rel)) == data, rel
    # Exactly the tree's files, at the same relative paths: nothing more, nothing renamed.
    assert _listing(uri, _server_of(request, store_root)) == model_tree


def test_put_tree_again_replaces_nothing_beside_it(
    request: pytest.FixtureRequest, store_root: str, model_tree: dict[str, bytes], tmp_path: Path
) -> None:
    neighbour = join(store_root, "cm", "other", "keep.txt")
    write_bytes(neighbour, b"keep")
    uri = join(store_root, "cm", "sha256-0123abcd")
    put_tree(_tree_dir(tmp_path), uri)
    put_tree(_tree_dir(tmp_path), uri)  # a retried upload of the same content is harmless
    assert read_bytes(neighbour) == b"keep"
    expected = {**{f"sha256-0123abcd/{rel}": d for rel, d in model_tree.items()}, "other/keep.txt": b"keep"}
    assert _listing(join(store_root, "cm"), _server_of(request, store_root)) == expected


def test_write_bytes_round_trip(store_root: str) -> None:
    uri = join(store_root, "results", "target-cpu.json")
    write_bytes(uri, b'{"p50_ms": 4.2}')
    assert read_bytes(uri) == b'{"p50_ms": 4.2}'
    write_bytes(uri, b'{"p50_ms": 3.9}')  # an overwrite is seen at once
    assert read_bytes(uri) == b'{"p50_ms": 3.9}'
    empty = join(store_root, "results", "empty")
    write_bytes(empty, b"")
    assert read_bytes(empty) == b""  # an empty object exists: it is not read as missing


def test_missing_key_reads_as_none(store_root: str) -> None:
    assert read_bytes(join(store_root, "absent.json")) is None
    write_bytes(join(store_root, "a", "b", "c.json"), b"{}")
    # A prefix of existing keys (a folder, in a file store) is no object either.
    assert read_bytes(join(store_root, "a", "b")) is None
    assert read_bytes(join(store_root, "a", "b", "c.json", "d")) is None


@pytest.mark.usefixtures("s3_env")
def test_missing_bucket_is_an_error_not_a_missing_key(s3_server: S3Server) -> None:
    uri = f"s3://no-such-bucket-{_unique()}/result.json"
    with pytest.raises(StoreError, match="NoSuchBucket") as caught:
        read_bytes(uri)
    assert uri in str(caught.value)


@pytest.mark.usefixtures("s3_env")
def test_an_upload_to_a_missing_bucket_says_so(tmp_path: Path) -> None:
    uri = f"s3://no-such-bucket-{_unique()}/cache/model"
    with pytest.raises(StoreDenied) as caught:
        _operations(tmp_path)["put_tree"](uri)
    assert caught.value.code == "NoSuchBucket" and own_keys_hint(caught.value.code), caught.value


def test_no_keys_at_all_is_told_apart_from_refused_keys(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell with no AWS keys was told "the store refused these credentials"."""
    import boto3

    from kompile.artifact_store import probe_bucket

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    with pytest.raises(StoreDenied) as caught:
        probe_bucket(f"s3://{STORE_BUCKET}/x", s3_server.endpoint)
    hint = own_keys_hint(caught.value.code) or ""
    assert "no S3 credentials" in hint and "refused" not in hint, hint


def _operations(tmp_path: Path) -> dict[str, Callable[[str], object]]:
    tree = tmp_path / "upload"
    tree.mkdir()
    (tree / "model.onnx").write_bytes(b"onnx")
    return {
        "read_bytes": read_bytes,
        "write_bytes": lambda uri: write_bytes(uri, b"data"),
        "put_tree": lambda uri: put_tree(tree, uri),
    }


@pytest.mark.parametrize("operation", ["read_bytes", "write_bytes", "put_tree"])
@pytest.mark.parametrize("bad", ["secret key", "access key"])
def test_bad_credential_raises_store_error_naming_uri_not_secret(
    request: pytest.FixtureRequest,
    s3_server: S3Server,
    s3_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    operation: str,
    bad: str,
) -> None:
    import boto3

    s3_server.create_bucket(STORE_BUCKET)
    uri = f"s3://{STORE_BUCKET}/creds/{_unique()}/model"
    write_bytes(uri, b"present")  # with good keys: the failure below is the credential's alone
    wrong_secret = f"wrong-{_unique()}-secret"
    if bad == "secret key":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", f"nobody{_unique()}")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # boto3 caches the first credentials it read

    with pytest.raises(StoreDenied) as caught:
        _operations(tmp_path)[operation](uri)
    message = str(caught.value)
    assert uri in message
    # S3's own code, on every verb (boto3 wraps an upload's in S3UploadFailedError): the code is
    # what tells a refusal from an outage, and what the hint to the user is chosen by.
    assert caught.value.code in DENIED_CODES and caught.value.code in message, message
    # Neither the message nor what a logger would print of the exception holds a secret.
    shown = "".join(traceback.format_exception(caught.value))
    for secret in (s3_server.secret_key, wrong_secret):
        assert secret not in message
        assert secret not in shown


def test_changed_credentials_in_environment_are_used(
    s3_server: S3Server, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_server.create_bucket(STORE_BUCKET)
    uri = f"s3://{STORE_BUCKET}/creds/{_unique()}"
    write_bytes(uri, b"with the right keys")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", f"wrong-{_unique()}")
    with pytest.raises(StoreError):
        write_bytes(uri, b"with a wrong secret")


def test_files_older_than_names_only_what_was_written_before_the_cutoff(store_root: str) -> None:
    """What the operator's progress sweep reads: ages by the store's own clock (S3's LastModified)."""
    folder = join(store_root, "ages", _unique())
    assert files_older_than(folder, 0.0) == []  # a folder not there yet
    write_bytes(join(folder, "old.json"), b"{}")
    # An S3 listing's LastModified may be cut to the second: a file written 0.1 s ago can read as
    # up to 1.1 s old (a cutoff of 1 s named it in CI), so the cutoff leaves that second of room.
    time.sleep(3.2)
    write_bytes(join(folder, "sub", "new.json"), b"{}")
    assert files_older_than(folder, 2.0) == ["old.json"]
    assert files_older_than(folder, 3600.0) == []


def test_put_tree_of_missing_folder_is_an_error(store_root: str, tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        put_tree(tmp_path / "never-written", join(store_root, "x"))


def test_local_write_error_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(StoreError):
        write_bytes((tmp_path / "a-file" / "below-a-file").as_uri(), b"x")


# --- MLflow against the same S3 server ------------------------------------------------------------


def _mlflow_client(server: MlflowServer) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server.tracking_uri)


def _run(client: Any, name: str) -> str:
    """A finished run in a fresh experiment; its id."""
    exp_id = client.create_experiment(f"{name}-{_unique()}")
    run_id: str = client.create_run(exp_id, run_name=name).info.run_id
    client.set_terminated(run_id)
    return run_id


def test_mlflow_run_artifacts_land_in_the_s3_bucket(
    mlflow_server: MlflowServer, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No S3 settings in this process: the client sends artifacts to the server, which writes to S3.
    for key in s3_server.env():
        monkeypatch.delenv(key, raising=False)
    client = _mlflow_client(mlflow_server)
    exp_id = client.create_experiment(f"artifacts-{_unique()}")
    run = client.create_run(exp_id, run_name="cpu-x86")
    run_id = run.info.run_id
    (tmp_path / "model.onnx").write_bytes(b"onnx bytes")
    client.log_artifact(run_id, str(tmp_path / "model.onnx"), artifact_path="model")
    client.log_text(run_id, '{"passed": true}', "result.json")
    client.set_terminated(run_id)

    # The run's artifacts live under mlflow-artifacts:/<experiment>/<run>/artifacts, which the server
    # maps onto its --artifacts-destination s3://<bucket>/mlflow.
    assert run.info.artifact_uri == f"mlflow-artifacts:/{exp_id}/{run_id}/artifacts"
    prefix = f"mlflow/{exp_id}/{run_id}/artifacts/"
    s3 = s3_server.client()
    listed = s3.list_objects_v2(Bucket=mlflow_server.bucket, Prefix=prefix).get("Contents", [])
    assert sorted(obj["Key"] for obj in listed) == [f"{prefix}model/model.onnx", f"{prefix}result.json"]
    body = s3.get_object(Bucket=mlflow_server.bucket, Key=f"{prefix}model/model.onnx")["Body"].read()
    assert body == b"onnx bytes"
    assert [f.path for f in client.list_artifacts(run_id, "model")] == ["model/model.onnx"]


def test_model_version_with_s3_source(
    mlflow_server: MlflowServer,
    s3_server: S3Server,
    s3_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mlflow

    # The artifact the operator registers: uploaded by a compile Job, content-addressed, in S3.
    s3_server.create_bucket(STORE_BUCKET)
    tree = tmp_path / "artifact"
    (tree / "resnet" / "1").mkdir(parents=True)
    (tree / "resnet" / "config.pbtxt").write_bytes(b'name: "resnet"\n')
    (tree / "resnet" / "1" / "model.onnx").write_bytes(b"onnx bytes")
    source = put_tree(tree, f"s3://{STORE_BUCKET}/cm/{_unique()}/sha256-0123abcd")

    client = _mlflow_client(mlflow_server)
    run_id = _run(client, "cpu-x86")
    name = f"resnet-{_unique()}"
    client.create_registered_model(name)
    tags = {"kompile.hardware_class": "cpu-x86", "kompile.artifact_uri": source}
    version = client.create_model_version(
        name, source=source, run_id=run_id, tags=tags, description="onnxruntime fp32 for cpu-x86"
    )
    assert (version.version, version.source, version.run_id, version.status) == ("1", source, run_id, "READY")
    stored = client.get_model_version(name, version.version)
    assert stored.tags == tags
    assert client.get_model_version_download_uri(name, version.version) == source
    client.set_registered_model_alias(name, "cpu-x86", version.version)
    assert client.get_model_version_by_alias(name, "cpu-x86").version == version.version

    # The version resolves to the artifact: a client with the S3 settings downloads it by model URI.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.tracking_uri)
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/1", dst_path=str(tmp_path / "dl")))
    assert (local / "resnet" / "1" / "model.onnx").read_bytes() == b"onnx bytes"
    assert (local / "resnet" / "config.pbtxt").read_bytes() == b'name: "resnet"\n'

    # mlflow.register_model takes the same s3:// URI (it creates the registered model when missing).
    assert mlflow.get_tracking_uri() == mlflow_server.tracking_uri
    other = mlflow.register_model(source, f"{name}-fluent", tags={"via": "register_model"})
    assert (other.version, other.source) == ("1", source)


def test_mlflow_checks_an_s3_source_only_for_relative_parts(
    mlflow_server: MlflowServer, s3_server: S3Server
) -> None:
    from mlflow.exceptions import MlflowException

    client = _mlflow_client(mlflow_server)
    name = f"rules-{_unique()}"
    client.create_registered_model(name)
    # The server neither reads nor checks the source: a bucket that does not exist is accepted, so
    # the operator must upload the artifact before it registers the version.
    missing = f"s3://no-such-bucket-{_unique()}/model"
    assert client.create_model_version(name, source=missing).source == missing
    # Relative parts are refused (path traversal guard), with or without a run.
    with pytest.raises(MlflowException, match="INVALID_PARAMETER_VALUE"):
        client.create_model_version(name, source=f"s3://{STORE_BUCKET}/cm/../other")


def _source_doc(uri: str) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m"},
        "spec": {
            "source": {"uri": uri},
            "inputs": [{"name": "x", "shape": [1, 4]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime"}],
        },
    }


def test_an_overwritten_s3_source_changes_the_cache_fingerprint(store_root: str) -> None:
    """The operator cannot read the model, but an S3 object's ETag and size change when it is
    overwritten in place: the compile cache must not hand back the old model's artifact."""
    from kompile.api import parse_manifest
    from kompile.operator.store_access import StoreAccess, source_fingerprint

    uri = join(store_root, "models", "m.onnx")
    doc = _source_doc(uri)
    cm = parse_manifest(doc)
    store = StoreAccess(endpoint=None, credentials=None)
    missing = source_fingerprint(cm, store)
    assert missing == f"uri:{uri}"
    write_bytes(uri, b"weights v1")
    first = source_fingerprint(cm, store)
    write_bytes(uri, b"weights v2 (retrained)")
    second = source_fingerprint(cm, store)
    if store_root.startswith("s3://"):
        assert first.startswith(f"s3:{uri}@") and first != second
        assert source_fingerprint(cm, store) == second  # stable while the object is unchanged
    else:
        assert first == second == missing  # the operator cannot see the Job's local files
    pinned = parse_manifest(
        {**doc, "spec": {**doc["spec"], "source": {"uri": uri, "digest": "sha256:" + "0" * 64}}}
    )
    assert source_fingerprint(pinned, store) == "sha256:" + "0" * 64
    python = parse_manifest(
        {**doc, "spec": {**doc["spec"], "source": {"uri": "python://models.small:small_cnn"}}}
    )
    assert source_fingerprint(python, store, "img:1") != source_fingerprint(python, store, "img:2")


def test_a_model_folder_on_s3_changes_the_fingerprint_with_any_file_under_it(
    s3_server: S3Server, s3_env: Any
) -> None:
    """A Hugging Face model folder (s3://.../minilm/): retrained weights under an unchanged
    config.json, or a file added, are a new source; an untouched folder keeps its key. (A local
    folder is one in the compile image, keyed by the image: tests/unit/test_source_fingerprint.py.)"""
    from kompile.api import parse_manifest
    from kompile.operator.store_access import StoreAccess, source_fingerprint

    s3_server.create_bucket(STORE_BUCKET)
    folder = f"s3://{STORE_BUCKET}/tests/{_unique()}/models/minilm/"
    doc = _source_doc(folder)
    cm = parse_manifest(doc)
    store = StoreAccess(endpoint=None, credentials=None)
    assert source_fingerprint(cm, store) == f"uri:{folder}"  # nothing there yet
    write_bytes(folder + "config.json", b'{"architectures": ["BertModel"]}')
    write_bytes(folder + "model.safetensors", b"weights v1")
    first = source_fingerprint(cm, store)
    assert first.startswith(f"s3:{folder}@") and source_fingerprint(cm, store) == first
    write_bytes(folder + "model.safetensors", b"weights v2 (retrained)")
    second = source_fingerprint(cm, store)
    write_bytes(folder + "tokenizer.json", b"{}")
    assert len({first, second, source_fingerprint(cm, store)}) == 3


def test_a_cache_entry_is_served_only_with_every_file_it_names(
    request: pytest.FixtureRequest, store_root: str, tmp_path: Path
) -> None:
    """A result.json whose model never arrived (an upload cut short) is no cache hit; nor is one
    that names no files (written before results listed them)."""
    from kompile.api.job_contract import RESULT_FILE, JobResult
    from kompile.api.status import TargetStatus
    from kompile.artifact_store import file_sizes
    from kompile.operator.store_access import StoreAccess, entry_complete

    tree = tmp_path / "entry"
    (tree / "small" / "1").mkdir(parents=True)
    (tree / "small" / "1" / "model.onnx").write_bytes(b"onnx" * 1000)
    (tree / "small" / "config.pbtxt").write_bytes(b'name: "small"\n')
    files = {"small/1/model.onnx": 4000, "small/config.pbtxt": 14}
    target = TargetStatus(name="cpu", backend="onnxruntime", precision="fp32", phase="Succeeded")
    result = JobResult(target=target, files=files)
    (tree / RESULT_FILE).write_text(result.dumps())
    uri = join(store_root, "cm", _unique())
    put_tree(tree, uri)
    store = StoreAccess(None, None)
    assert file_sizes(uri) == {**files, RESULT_FILE: len(result.dumps().encode())}
    assert entry_complete(uri, result, store)
    assert not entry_complete(uri, result.model_copy(update={"files": None}), store)
    # The model file is gone (its upload never finished): compile again.
    if store_root.startswith("s3://"):
        server: S3Server = request.getfixturevalue("s3_server")
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        server.client().delete_object(Bucket=bucket, Key=f"{key}/small/1/model.onnx")
    else:
        (Path(uri.removeprefix("file://")) / "small" / "1" / "model.onnx").unlink()
    assert not entry_complete(uri, result, store)


def test_latest_pointers_land_beside_the_cache_and_move_with_the_winner(store_root: str) -> None:
    """What a device fleet polls: `<store>/latest/<namespace>/<model>/<class>.json`, written by the
    operator's kompile.operator.latest through this store client, read back as a device would."""
    import json

    from kompile.api.status import Artifact, CompiledModelStatus, TargetStatus
    from kompile.operator import latest
    from tests.unit.test_rollout import target

    def built(name: str, p50: float) -> TargetStatus:
        t = target(name, "cpu-arm64", "executorch", p50)
        uri = join(store_root, "cache", "ml", name)
        return t.model_copy(update={"artifact": Artifact(uri=uri, digest=f"sha256:{name}")})

    def write(status: CompiledModelStatus, generation: int) -> None:
        latest.write_due(
            status,
            store_root,
            namespace="ml",
            compiled_model="resnet",
            model_name="resnet",
            generation=generation,
            put=latest.write_pointer,
        )

    first = CompiledModelStatus(targets=[built("gen1", 7.0)])
    write(first, 1)
    (pointer,) = first.latest
    assert pointer.uri == join(store_root, "latest", "ml", "resnet", "cpu-arm64.json")
    doc = json.loads(read_bytes(pointer.uri) or b"{}")
    assert doc["generation"] == 1 and doc["digest"] == "sha256:gen1" and doc["backend"] == "executorch"
    # A later generation's winner replaces it at the same key; the artifact it named stays put.
    second = CompiledModelStatus(targets=[built("gen2", 6.0)])
    write(second, 2)
    doc = json.loads(read_bytes(pointer.uri) or b"{}")
    assert doc["generation"] == 2 and doc["uri"] == join(store_root, "cache", "ml", "gen2")


def test_new_external_weights_under_an_unchanged_graph_change_the_cache_fingerprint(
    s3_server: S3Server, s3_env: Any, tmp_path: Path
) -> None:
    """Retraining rewrites model.onnx.data and leaves model.onnx byte for byte the same: the key
    must still change, or the cache hands back the old weights' artifact."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from kompile.api import parse_manifest
    from kompile.operator.store_access import StoreAccess, source_fingerprint

    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(
        helper.make_model(graph),
        str(path),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    s3_server.create_bucket(STORE_BUCKET)
    root = f"s3://{STORE_BUCKET}/sources/{_unique()}"
    write_bytes(join(root, "model.onnx"), path.read_bytes())
    data = join(root, "model.onnx.data")
    write_bytes(data, (tmp_path / "model.onnx.data").read_bytes())
    doc = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m"},
        "spec": {
            "source": {"uri": join(root, "model.onnx")},
            "inputs": [{"name": "x", "shape": [1, 4]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime"}],
        },
    }
    cm, store = parse_manifest(doc), StoreAccess(endpoint=None, credentials=None)
    first = source_fingerprint(cm, store)
    assert "+model.onnx.data@" in first and source_fingerprint(cm, store) == first
    write_bytes(data, np.full((4, 4), 2.0, np.float32).tobytes())  # retrained: same graph file
    second = source_fingerprint(cm, store)
    assert second != first and second.split("+")[0] == first.split("+")[0]
    s3_server.client().delete_object(Bucket=STORE_BUCKET, Key=data.removeprefix(f"s3://{STORE_BUCKET}/"))
    assert source_fingerprint(cm, store).endswith("+model.onnx.data@absent")
