"""Conditional writes (`write_if_unchanged`) on a store that refuses them: some S3-compatible servers
answer If-Match / If-None-Match on PUT with 501 NotImplemented. The write then falls back to a
plain one (the last writer's union, as before conditional writes), rather than failing every push.
The S3 client is a stand-in here; the real server's conditional writes are raced in
tests/pipeline/test_tvm_database.py."""

from __future__ import annotations

from typing import Any

import pytest

from kompile import artifact_store


class NoConditionalWrites:
    """Stand-in for boto3's S3 client on a server without conditional writes."""

    def __init__(self) -> None:
        self.puts: list[dict[str, Any]] = []

    def put_object(self, **kwargs: Any) -> dict[str, str]:
        from botocore.exceptions import ClientError

        if "IfMatch" in kwargs or "IfNoneMatch" in kwargs:
            error = {"Error": {"Code": "NotImplemented", "Message": "conditional writes"}}
            raise ClientError(error, "PutObject")  # type: ignore[arg-type]
        self.puts.append(kwargs)
        return {"ETag": '"e"'}


def test_a_store_without_conditional_writes_gets_a_plain_write(monkeypatch: pytest.MonkeyPatch) -> None:
    client = NoConditionalWrites()
    monkeypatch.setattr(artifact_store, "s3_client", lambda *_: client)
    assert artifact_store.write_if_unchanged("s3://b/k/db.json", b"data", '"v1"')
    assert client.puts == [{"Bucket": "b", "Key": "k/db.json", "Body": b"data"}]
