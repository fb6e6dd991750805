"""The Kopf application: the only module with @kopf decorators, each a thin shim into reconcile."""

from __future__ import annotations

import logging
import threading
from typing import Any, cast

import kopf
from prometheus_client import start_http_server

from kompile.api.resource import GROUP, PLURAL, VERSION
from kompile.operator import kube as kube_mod
from kompile.operator import outages
from kompile.operator.jobs import LABEL_NAME
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings

SETTINGS = Settings.from_env()
_kube: kube_mod.Kube | None = None


def kube() -> kube_mod.Kube:
    global _kube
    if _kube is None:
        kube_mod.load_config()
        _kube = kube_mod.Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Kopf's own bookkeeping goes to annotations: status belongs to the typed API alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.kompile.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kopf.kompile.dev")
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.posting.level = logging.INFO
    outages.bound_calls(SETTINGS)
    start_http_server(SETTINGS.metrics_port)
    kube()


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


def _run(body: kopf.Body, logger: kopf.Logger) -> None:
    def event(kind: str, reason: str, message: str) -> None:
        (kopf.info if kind == "Normal" else kopf.warn)(body, reason=reason, message=message[:1000])

    # Spec handlers, the resync timer and Job events may fire together for one CompiledModel; one
    # reconcile at a time keeps an older view from overwriting a newer status.
    with _lock_for(body.metadata.uid or ""):
        fresh = kube().get_compiled_model(body.metadata.namespace or "default", body.metadata.name or "")
        if fresh is None or fresh["metadata"].get("uid") != body.metadata.uid:
            return  # deleted meanwhile: its Jobs go with it (ownerReferences)
        reconcile(fresh, kube(), SETTINGS, event)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def on_spec(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    _run(body, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.resync_seconds, initial_delay=SETTINGS.resync_seconds)
def resync(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    # Level-triggered catch-all: Job ends, new hardware classes, store changes.
    _run(body, logger)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_NAME: kopf.PRESENT})
def on_job(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    """A compile Job changed: reconcile its owner now rather than at the next resync."""
    owners = [o for o in body.metadata.get("ownerReferences", []) if o.get("kind") == "CompiledModel"]
    for owner in owners:
        doc = kube().get_compiled_model(body.metadata.namespace or "default", owner["name"])
        if doc is not None and doc["metadata"].get("uid") == owner.get("uid"):
            _run(kopf.Body(cast(kopf.RawBody, doc)), logger)
