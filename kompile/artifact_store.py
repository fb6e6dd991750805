"""The artifact store: a local folder (file://) or an S3 bucket (s3://), behind four verbs.

Shared by compile Jobs (which upload) and the operator (which reads results and cache entries), so
it depends on nothing heavy: boto3 is imported only when an s3:// URI is used. Credentials come from
the environment (AWS_ACCESS_KEY_ID, ... filled from a Secret); they are never logged or returned.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


class StoreError(RuntimeError):
    """The store could not be read or written; the message names the URI (never credentials)."""


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def _local(uri: str) -> Path:
    parsed = urlparse(uri)
    return Path(parsed.path) if parsed.scheme == "file" else Path(uri)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str


def _s3(uri: str) -> S3Location:
    parsed = urlparse(uri)
    return S3Location(parsed.netloc, parsed.path.lstrip("/"))


def _client(endpoint: str | None) -> Any:
    import boto3

    endpoint = endpoint or os.environ.get("KOMPILE_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.client("s3", endpoint_url=endpoint) if endpoint else boto3.client("s3")


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def put_tree(local_dir: Path, uri: str, endpoint: str | None = None) -> str:
    """Copy a folder to uri (replacing nothing outside it). Returns uri."""
    if not is_s3(uri):
        dest = _local(uri)
        shutil.copytree(local_dir, dest, dirs_exist_ok=True)
        return uri
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    client = _client(endpoint)
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        key = join(loc.key, str(path.relative_to(local_dir)))
        try:
            client.upload_file(str(path), loc.bucket, key)
        except (BotoCoreError, ClientError) as err:
            raise StoreError(f"upload to s3://{loc.bucket}/{key} failed: {type(err).__name__}") from None
    return uri


def read_bytes(uri: str, endpoint: str | None = None) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    if not is_s3(uri):
        path = _local(uri)
        return path.read_bytes() if path.is_file() else None
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    try:
        body: bytes = _client(endpoint).get_object(Bucket=loc.bucket, Key=loc.key)["Body"].read()
        return body
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise StoreError(f"read of {uri} failed: {err.response.get('Error', {}).get('Code')}") from None
    except BotoCoreError as err:
        raise StoreError(f"read of {uri} failed: {type(err).__name__}") from None


def write_bytes(uri: str, data: bytes, endpoint: str | None = None) -> None:
    if not is_s3(uri):
        path = _local(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    try:
        _client(endpoint).put_object(Bucket=loc.bucket, Key=loc.key, Body=data)
    except (BotoCoreError, ClientError) as err:
        raise StoreError(f"write of {uri} failed: {type(err).__name__}") from None
