"""The artifact store: a local folder (file://) or an S3 bucket (s3://), behind a few verbs.

Shared by compile Jobs (which upload) and the operator (which reads results and cache entries), so
it depends on nothing heavy: boto3 is imported only when an s3:// URI is used. Credentials come from
a Secret's data passed in, or from the environment; they are never logged or put in a message.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from kompile.api.job_contract import RESULT_FILE

Credentials = Mapping[str, str]
"""AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN / AWS_REGION as a Secret holds them."""


class StoreError(RuntimeError):
    """The store could not be read or written; the message names the URI (never credentials)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code  # S3's error code (or botocore's error name), where one was given


class StoreDenied(StoreError):
    """The store answered and said no to this caller: its keys, or a bucket that is not there.
    Not an outage: waiting does not help, fixing the credentials or the URI does."""


# S3 error codes that blame the request's credentials or bucket, not the endpoint's health (a HEAD
# has no body: its 403 comes as the bare status). botocore's own "no keys at all" errors join them.
DENIED_CODES = frozenset(
    {
        "403",
        "AccessDenied",
        "AllAccessDisabled",
        "AuthorizationHeaderMalformed",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidBucketName",
        "InvalidToken",
        "NoSuchBucket",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
        # versitygw's answer to an access key it has no user for (where AWS says InvalidAccessKeyId)
        "XAdminUserNotFound",
    }
)
DENIED_BOTOCORE = ("NoCredentialsError", "PartialCredentialsError")
NO_BUCKET = ("NoSuchBucket", "InvalidBucketName")
"""The denied codes that blame the bucket's name rather than the keys."""


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def local_path(uri: str) -> Path:
    """The path a file:// URI (or a plain path) names. A file:// URI is percent-encoded (as
    Path.as_uri writes a space, %20): read undecoded, "my models" was a second folder "my%20models"."""
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(uri)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str

    def child(self, rel: str) -> str:
        # No leading slash on a key at the bucket's root: AWS would keep it as part of the name.
        return f"{self.key.rstrip('/')}/{rel}" if self.key.strip("/") else rel


def _s3(uri: str) -> S3Location:
    parsed = urlparse(uri)
    return S3Location(parsed.netloc, parsed.path.lstrip("/"))


def s3_client(endpoint: str | None, credentials: Credentials | None = None) -> Any:
    import boto3

    endpoint = endpoint or os.environ.get("KOMPILE_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {"endpoint_url": endpoint} if endpoint else {}
    if credentials:
        kwargs |= {
            "aws_access_key_id": credentials.get("AWS_ACCESS_KEY_ID"),
            "aws_secret_access_key": credentials.get("AWS_SECRET_ACCESS_KEY"),
            "aws_session_token": credentials.get("AWS_SESSION_TOKEN"),
            "region_name": credentials.get("AWS_REGION") or credentials.get("AWS_DEFAULT_REGION"),
        }
    # The operator bounds each call (kompile.operator.outages); compile pods keep botocore's defaults.
    timeout = os.environ.get("KOMPILE_STORE_TIMEOUT_SECONDS")
    attempts = os.environ.get("KOMPILE_STORE_MAX_ATTEMPTS")
    if timeout or attempts:
        from botocore.config import Config

        seconds = float(timeout) if timeout else 60.0
        kwargs["config"] = Config(
            connect_timeout=seconds,
            read_timeout=seconds,
            retries={"mode": "standard", "max_attempts": int(attempts or 3)},
        )
    # A fresh session per call: boto3's default session keeps the first credentials it ever read.
    return boto3.session.Session().client("s3", **kwargs)


def _s3_error(action: str, uri: str, err: Exception) -> StoreError:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import ClientError

    if isinstance(err, S3UploadFailedError) and isinstance(err.__context__, ClientError):
        err = err.__context__  # boto3's upload wraps S3's answer; its code is what says why
    code = err.response.get("Error", {}).get("Code") if isinstance(err, ClientError) else None
    told = str(code or type(err).__name__)
    kind = StoreDenied if told in DENIED_CODES or told in DENIED_BOTOCORE else StoreError
    return kind(f"{action} {uri} failed: {told}", told)


def own_keys_hint(code: str | None) -> str | None:
    """What to check when the store refused (S3 error `code`) a caller using its own environment's
    keys (`kompile run`, a compile Job, whose keys come from the Secret the operator names)."""
    if code in NO_BUCKET:
        return "no such bucket: check the bucket name"
    if code == "NoCredentialsError":
        return (
            "no S3 credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE) in this shell (in a cluster, the Secret spec.registry.credentialsSecret names)"
        )
    if code in DENIED_CODES or code in DENIED_BOTOCORE:
        return (
            "the store refused these credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(in a cluster, the Secret spec.registry.credentialsSecret names) and that they may use "
            "this bucket"
        )
    return None


def probe_bucket(uri: str, endpoint: str | None = None) -> None:
    """One small listing under an s3:// folder, so a wrong bucket or refused keys are found before
    any work rather than at the upload after it (StoreDenied or StoreError)."""
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    try:
        s3_client(endpoint).list_objects_v2(Bucket=loc.bucket, Prefix=loc.key, MaxKeys=1)
    except (BotoCoreError, ClientError) as err:
        raise _s3_error("listing of", uri, err) from None


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _result_in(root: Path, folder: str) -> list[str]:
    return [RESULT_FILE] if Path(folder) == root else []


def put_tree(
    local_dir: Path, uri: str, endpoint: str | None = None, credentials: Credentials | None = None
) -> str:
    """Copy a folder's files under uri (nothing outside it is touched). Returns uri."""
    if not local_dir.is_dir():
        raise StoreError(f"upload to {uri} failed: {local_dir} is not a folder")
    if not is_s3(uri):
        try:
            dst = local_path(uri)
            shutil.copytree(local_dir, dst, dirs_exist_ok=True, ignore=lambda d, _: _result_in(local_dir, d))
            if (local_dir / RESULT_FILE).is_file():
                shutil.copyfile(local_dir / RESULT_FILE, dst / RESULT_FILE)  # last, as on S3
        except OSError as err:
            raise StoreError(f"copy to {uri} failed: {err.strerror or type(err).__name__}") from None
        return uri
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    client = s3_client(endpoint, credentials)
    # result.json says "validated": it goes up after every file it names, so an upload cut short
    # (a killed pod) leaves no entry that a cache hit would serve.
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    for path in sorted(files, key=lambda p: p.relative_to(local_dir).as_posix() == RESULT_FILE):
        key = loc.child(str(path.relative_to(local_dir)))
        try:
            client.upload_file(str(path), loc.bucket, key)
        except (BotoCoreError, ClientError, Boto3Error) as err:
            raise _s3_error("upload to", f"s3://{loc.bucket}/{key}", err) from None
    return uri


def object_version(
    uri: str, endpoint: str | None = None, credentials: Credentials | None = None
) -> str | None:
    """An S3 object's ETag and size (what changes when it is overwritten), or None when it does
    not exist; None for non-S3 URIs, whose files the operator cannot see."""
    if not is_s3(uri):
        return None
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    try:
        head = s3_client(endpoint, credentials).head_object(Bucket=loc.bucket, Key=loc.key)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise _s3_error("head of", uri, err) from None
    except BotoCoreError as err:
        raise _s3_error("head of", uri, err) from None
    return f"{str(head.get('ETag', '')).strip(chr(34))}:{head.get('ContentLength', '')}"


def _s3_get(uri: str, endpoint: str | None, credentials: Credentials | None) -> tuple[bytes, str] | None:
    """An S3 object's bytes and ETag, or None when it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    try:
        got = s3_client(endpoint, credentials).get_object(Bucket=loc.bucket, Key=loc.key)
        return got["Body"].read(), str(got["ETag"])
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise _s3_error("read of", uri, err) from None
    except BotoCoreError as err:
        raise _s3_error("read of", uri, err) from None


def read_bytes(uri: str, endpoint: str | None = None, credentials: Credentials | None = None) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    if not is_s3(uri):
        path = local_path(uri)
        try:
            return path.read_bytes() if path.is_file() else None
        except OSError as err:
            raise StoreError(f"read of {uri} failed: {err.strerror or type(err).__name__}") from None
    got = _s3_get(uri, endpoint, credentials)
    return None if got is None else got[0]


def write_bytes(
    uri: str, data: bytes, endpoint: str | None = None, credentials: Credentials | None = None
) -> None:
    if not is_s3(uri):
        path = local_path(uri)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError as err:
            raise StoreError(f"write of {uri} failed: {err.strerror or type(err).__name__}") from None
        return
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    try:
        s3_client(endpoint, credentials).put_object(Bucket=loc.bucket, Key=loc.key, Body=data)
    except (BotoCoreError, ClientError) as err:
        raise _s3_error("write of", uri, err) from None


def delete(uri: str, endpoint: str | None = None, credentials: Credentials | None = None) -> None:
    """Remove one object (or file); one that is not there is no error."""
    if not is_s3(uri):
        try:
            local_path(uri).unlink(missing_ok=True)
        except OSError as err:
            raise StoreError(f"delete of {uri} failed: {err.strerror or type(err).__name__}") from None
        return
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    try:
        s3_client(endpoint, credentials).delete_object(Bucket=loc.bucket, Key=loc.key)
    except (BotoCoreError, ClientError) as err:
        raise _s3_error("delete of", uri, err) from None


@contextlib.contextmanager
def locked(lock: Path) -> Iterator[None]:
    """An exclusive lock on the file `lock` (created with its folder) across processes of this
    machine, held for the `with` block."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        yield


def read_versioned(
    uri: str, endpoint: str | None = None, credentials: Credentials | None = None
) -> tuple[bytes | None, str | None]:
    """The object's bytes and its version (S3: the ETag; a file: its sha256), for
    `write_if_unchanged`; (None, None) when it does not exist."""
    if not is_s3(uri):
        data = read_bytes(uri)
        return data, (None if data is None else hashlib.sha256(data).hexdigest())
    got = _s3_get(uri, endpoint, credentials)
    return (None, None) if got is None else got


_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
"""S3's answers to a conditional write another writer got to first."""


def write_if_unchanged(
    uri: str,
    data: bytes,
    version: str | None,
    endpoint: str | None = None,
    credentials: Credentials | None = None,
) -> bool:
    """Write the object only if it is still at `version` (None: still absent), as read by
    `read_versioned`; False when another writer changed it since: read it again and redo the change.
    S3 conditional writes (If-Match / If-None-Match) on a bucket; a file lock on a local store."""
    if not is_s3(uri):
        path = local_path(uri)
        try:
            with locked(path.parent / f".{path.name}.lock"):
                now = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
                if now != version:
                    return False
                tmp = path.parent / f".{path.name}.tmp"
                tmp.write_bytes(data)
                tmp.replace(path)
        except OSError as err:
            raise StoreError(f"write of {uri} failed: {err.strerror or type(err).__name__}") from None
        return True
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
    client = s3_client(endpoint, credentials)
    try:
        try:
            client.put_object(Bucket=loc.bucket, Key=loc.key, Body=data, **condition)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code in _LOST_RACE:
                return False
            if code != "NotImplemented":
                raise
            # A server without conditional writes: the last writer wins, as before them.
            client.put_object(Bucket=loc.bucket, Key=loc.key, Body=data)
    except (BotoCoreError, ClientError) as err:
        raise _s3_error("write of", uri, err) from None
    return True


def file_sizes(
    uri: str, endpoint: str | None = None, credentials: Credentials | None = None
) -> dict[str, int]:
    """Every file under the folder `uri`, by path relative to it, with its size in bytes."""
    if not is_s3(uri):
        root = local_path(uri)
        try:
            return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}
        except OSError as err:
            raise StoreError(f"listing of {uri} failed: {err.strerror or type(err).__name__}") from None
    return {name: listed.size for name, listed in _s3_listing(uri, endpoint, credentials).items()}


def files_older_than(
    uri: str, seconds: float, endpoint: str | None = None, credentials: Credentials | None = None
) -> list[str]:
    """The files under the folder `uri` last written more than `seconds` ago (relative paths); none
    when the folder is not there."""
    cutoff = time.time() - seconds
    if not is_s3(uri):
        root = local_path(uri)
        try:
            files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
            return sorted(p.relative_to(root).as_posix() for p in files if p.stat().st_mtime < cutoff)
        except OSError as err:
            raise StoreError(f"listing of {uri} failed: {err.strerror or type(err).__name__}") from None
    listing = _s3_listing(uri, endpoint, credentials)
    return sorted(name for name, listed in listing.items() if listed.modified < cutoff)


@dataclass(frozen=True)
class _Listed:
    size: int
    etag: str
    modified: float
    """When it was last written, in seconds since the epoch."""


def _s3_listing(uri: str, endpoint: str | None, credentials: Credentials | None) -> dict[str, _Listed]:
    """Every object under the S3 folder `uri`, by key relative to it: its size, ETag and age."""
    from botocore.exceptions import BotoCoreError, ClientError

    loc = _s3(uri)
    prefix = loc.key.rstrip("/") + "/"
    out: dict[str, _Listed] = {}
    try:
        pages = s3_client(endpoint, credentials).get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=loc.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                etag = str(obj.get("ETag", "")).strip('"')
                modified = obj["LastModified"].timestamp() if obj.get("LastModified") else time.time()
                out[str(obj["Key"])[len(prefix) :]] = _Listed(int(obj["Size"]), etag, modified)
    except (BotoCoreError, ClientError) as err:
        raise _s3_error("listing of", uri, err) from None
    return out


def folder_version(
    uri: str, endpoint: str | None = None, credentials: Credentials | None = None
) -> str | None:
    """A digest of an S3 folder's listing (each object's key, ETag and size): it changes when any
    file under it is added, removed or overwritten; None when the folder is empty or not S3."""
    if not is_s3(uri):
        return None
    listing = _s3_listing(uri, endpoint, credentials)
    if not listing:
        return None
    lines = "".join(f"{name}\0{f.etag}\0{f.size}\n" for name, f in sorted(listing.items()))
    return hashlib.sha256(lines.encode()).hexdigest()[:32]
