"""Upload order: result.json, the entry that says "validated", goes up after every file it names, so
a pod killed mid-upload leaves no entry that a later cache hit would serve. The S3 client is a
recording stand-in here (the real server is in tests/integration/test_artifact_store.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompile import artifact_store
from kompile.api.job_contract import RESULT_FILE


class RecordingClient:
    """Stand-in for boto3's S3 client: records uploads, and fails the one told to (a killed pod)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.keys: list[str] = []
        self.fail_on = fail_on

    def upload_file(self, path: str, bucket: str, key: str) -> None:
        if self.fail_on and key.endswith(self.fail_on):
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="http://s3")
        self.keys.append(key)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    # "small" sorts after "result.json": in name order the model would go up last.
    for rel in ("small/config.pbtxt", "small/1/model.onnx", "outputs.npz", "reference.npz", RESULT_FILE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    return tmp_path


def test_result_goes_up_after_every_file_it_names(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = RecordingClient()
    monkeypatch.setattr(artifact_store, "s3_client", lambda *a, **k: client)
    artifact_store.put_tree(tree, "s3://bucket/cm/key")
    assert client.keys[-1] == f"cm/key/{RESULT_FILE}"
    assert len(client.keys) == 5


def test_a_failed_model_upload_leaves_no_result(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = RecordingClient(fail_on="model.onnx")
    monkeypatch.setattr(artifact_store, "s3_client", lambda *a, **k: client)
    with pytest.raises(artifact_store.StoreError):
        artifact_store.put_tree(tree, "s3://bucket/cm/key")
    assert f"cm/key/{RESULT_FILE}" not in client.keys
