"""How the operator reaches a CompiledModel's artifact store: its endpoint and credentials (only
the tenant's own Secret, or none, for a store that is not the operator's), every call through the
endpoint's breaker, the source's identity for the cache key, and what a cache entry holds."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from kubernetes.client.exceptions import ApiException

from kompile.api.cache import progress_uri
from kompile.api.job_contract import RESULT_FILE, JobProgress, JobResult
from kompile.api.resource import CompiledModel
from kompile.artifact_store import (
    NO_BUCKET,
    StoreDenied,
    StoreError,
    delete,
    file_sizes,
    folder_version,
    is_s3,
    join,
    object_version,
    read_bytes,
)
from kompile.operator import tenancy
from kompile.operator.kube import Kube
from kompile.operator.outages import BREAKER
from kompile.operator.settings import Settings
from kompile.operator.source_parts import external_data_uris

log = logging.getLogger("kompile.operator")

EventFn = Callable[[str, str, str], None]
"""(type Normal|Warning, reason, message)"""


def store_root(cm: CompiledModel, settings: Settings) -> str:
    store = cm.spec.registry.artifact_store if cm.spec.registry else None
    return store or settings.artifact_store


STORE_UNAVAILABLE = "StoreUnavailable"
STORE_REACHABLE = "StoreReachable"
T = TypeVar("T")


class StoreUnavailable(RuntimeError):
    """The artifact store cannot be read now: no cache key can be computed, so nothing is launched."""


STORE_REFUSED = "StoreRefused"


class StoreRefused(StoreUnavailable):
    """The store answered no to this CompiledModel's credentials or bucket, or its Secret cannot be
    read: its own problem, told with what to fix; the endpoint's breaker stays closed for the rest."""


def source_fingerprint(cm: CompiledModel, store: StoreAccess | None = None, image: str | None = None) -> str:
    """The source's identity for the cache key, without reading the model (no torch here): its
    digest when the spec pins one; for s3:// the object's ETag and size (for a model folder,
    s3://.../, those of every object under it), so a model overwritten in place is compiled again;
    for python:// and a path (file://, a model file or folder) the compile image too, since the
    factory's code or the model ships in it; else the URI."""
    src = cm.spec.source
    if src.digest:
        return src.digest
    if src.s3_folder and store is not None:
        listing = store_call(
            src.uri, store, lambda: folder_version(src.uri, store.endpoint, store.credentials)
        )
        if listing:
            return f"s3:{src.uri}@{listing}"
    elif src.uri.startswith("s3://") and store is not None:
        # Unreadable raises StoreUnavailable: falling back to the URI would change the key (a new
        # Job under another prefix).
        tag = store_call(src.uri, store, lambda: object_version(src.uri, store.endpoint, store.credentials))
        if tag:
            return f"s3:{src.uri}@{tag}" + _external_data_versions(src.uri, tag, store)
    if image and (src.uri.startswith(("python://", "file://")) or ":/" not in src.uri):
        return f"uri:{src.uri}@{image}"
    return f"uri:{src.uri}"


def _external_data_versions(uri: str, tag: str, store: StoreAccess) -> str:
    """`+<file>@<ETag:size>` for each external data file an ONNX source's graph names (`absent`
    for one not there yet): new weights under an unchanged graph are a new source."""

    def versions() -> str:
        parts = external_data_uris(uri, tag, store.endpoint, store.credentials)
        found = ((p, object_version(p, store.endpoint, store.credentials)) for p in parts)
        return "".join(f"+{p.rpartition('/')[2]}@{v or 'absent'}" for p, v in found)

    return store_call(uri, store, versions)


NO_KEYS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}


@dataclass(frozen=True)
class StoreAccess:
    """How the operator reaches a CompiledModel's artifact store."""

    endpoint: str | None
    credentials: Mapping[str, str] | None
    keys_from: str = "the operator's own credentials"
    """Where the keys come from, for the message when the store refuses them."""
    refused: str | None = None
    """Why no store call is made at all (its Secret cannot be read), or None."""


def _denied_fix(err: StoreDenied, store: StoreAccess) -> str:
    if err.code in NO_BUCKET:
        return "no such bucket: check the bucket in spec.registry.artifactStore (or spec.source.uri)"
    return f"the store does not accept the keys of {store.keys_from}: correct them there"


def store_access(cm: CompiledModel, kube: Kube, settings: Settings) -> StoreAccess:
    """Endpoint from the spec or settings; credentials from the Secret the spec names, else the
    operator's own environment (boto3's default chain)."""
    registry = cm.spec.registry
    endpoint = (registry.s3_endpoint if registry else None) or settings.s3_endpoint
    # The operator's default Secret is for its own store only (tenancy.refusal keeps the rest out).
    secret = (
        registry.credentials_secret.name
        if registry and registry.credentials_secret
        else settings.store_secret
    )
    # Without a readable Secret, a store not the operator's own gets empty keys, never the
    # operator's (boto3's environment chain).
    own_store = not endpoint or tenancy.host_of(endpoint) in tenancy.own_hosts(settings)
    fallback = None if own_store else NO_KEYS
    if not secret:
        return StoreAccess(endpoint, fallback)
    namespace = cm.metadata.namespace or "default"
    named = (
        f"Secret {secret!r} (spec.registry.credentialsSecret)"
        if registry and registry.credentials_secret
        else f"Secret {secret!r} (the operator's KOMPILE_STORE_SECRET)"
    )
    try:
        return StoreAccess(endpoint, kube.secret_data(namespace, secret), keys_from=named)
    except ApiException as err:
        # No store call and no Job (its pod could not start without the Secret) until it is there.
        # Told in status (StoreRefused) and in one Warning when that starts, not at every look.
        if err.status == 404:
            why = (
                f"{named} is not in namespace {namespace}: "
                "create it with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        else:
            why = f"{named} cannot be read ({err.status} {err.reason})"
        return StoreAccess(endpoint, fallback, keys_from=named, refused=why)


def store_call(uri: str, store: StoreAccess, call: Callable[[], T]) -> T:
    """One artifact-store call about uri, through the store endpoint's breaker: StoreUnavailable
    when it fails, and at once while the endpoint backs off after a failure (no worker waits
    out a timeout per CompiledModel)."""
    if store.refused:
        raise StoreRefused(store.refused)
    if not is_s3(uri):
        try:
            return call()
        except StoreError as err:
            raise StoreUnavailable(str(err)) from err
    endpoint = store.endpoint or "s3"
    wait = BREAKER.wait(endpoint)
    if wait is not None:
        raise StoreUnavailable(f"{wait[1]}; next attempt in {wait[0]:.0f} s")
    try:
        out = call()
    except StoreDenied as err:
        # It answered: up for every other tenant. Only this one's keys or bucket are wrong.
        BREAKER.succeeded(endpoint)
        raise StoreRefused(f"artifact store {endpoint}: {err}: {_denied_fix(err, store)}") from err
    except StoreError as err:
        delay = BREAKER.failed(endpoint, f"artifact store {endpoint}: {err}")
        raise StoreUnavailable(f"artifact store {endpoint}: {err}; next attempt in {delay:.0f} s") from err
    BREAKER.succeeded(endpoint)
    return out


def read_stored_result(prefix: str, store: StoreAccess) -> JobResult | None:
    """result.json at a cache prefix, or None when absent or unreadable as one; StoreUnavailable
    when the store cannot be read (a miss then would compile again what is there)."""
    uri = join(prefix, RESULT_FILE)
    data = store_call(uri, store, lambda: read_bytes(uri, store.endpoint, store.credentials))
    if data is None:
        return None
    try:
        return JobResult.loads(data)
    except ValueError:
        return None


def read_progress(prefix: str, store: StoreAccess) -> JobProgress | None:
    """What the running compile Job for `prefix` last told (kompile.compile_jobs.progress), or None:
    not written yet, unreadable, or the store is down (progress is never worth a failed reconcile)."""
    uri = progress_uri(prefix)
    try:
        data = store_call(uri, store, lambda: read_bytes(uri, store.endpoint, store.credentials))
        return JobProgress.loads(data) if data else None
    except (StoreUnavailable, ValueError):
        return None


def forget_progress(prefix: str, store: StoreAccess) -> None:
    """Remove the ended Job's progress note: a Job killed outright (OOM, a drain past its grace)
    never removes its own. Best effort: a note left behind is a few hundred bytes, not a failure."""
    uri = progress_uri(prefix)
    try:
        store_call(uri, store, lambda: delete(uri, store.endpoint, store.credentials))
    except StoreUnavailable as err:
        log.warning("progress note %s stays: %s", uri, err)


def entry_complete(prefix: str, result: JobResult, store: StoreAccess) -> bool:
    """Every file the cache entry's result.json names is there at its size: an entry whose upload
    was cut short, or one written before results listed their files, is compiled again."""
    if not result.files:
        return False
    present = store_call(prefix, store, lambda: file_sizes(prefix, store.endpoint, store.credentials))
    missing = sorted(rel for rel, size in result.files.items() if present.get(rel) != size)
    if missing:
        log.warning("cache entry %s lacks %s: compiling again", prefix, ", ".join(missing[:5]))
    return not missing
