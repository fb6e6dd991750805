"""The operator's loop: watch events become keys in a work queue, a few workers reconcile them.

Kopf's handlers (kompile.operator.main) only call the `on_*` methods here, which are cheap and
never touch the API server. What each costs:
- a CompiledModel listed at start, created, or given a new spec: one reconcile;
- its own status patches: nothing (they do not change the generation);
- a compile Job's change: one reconcile of its owner, deduplicated while queued;
- a change of the fleet's hardware classes: one reconcile of every known CompiledModel;
- work in flight after a reconcile: one more after KOMPILE_RESYNC_SECONDS; a settled
  CompiledModel is not looked at again until one of the above happens;
- deletion: its queue entry, backoff and metric series go; its Jobs go by ownerReferences.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from kompile.operator import metrics
from kompile.operator.fleet_index import FleetIndex
from kompile.operator.kube import Kube
from kompile.operator.reconcile import reconcile
from kompile.operator.settings import Settings
from kompile.operator.workqueue import WorkQueue, start_workers

log = logging.getLogger("kompile.operator")

Key = tuple[str, str]
"""(namespace, name) of a CompiledModel."""


def key_of(body: Mapping[str, Any]) -> Key:
    meta = body.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


def needs_reconcile(event_type: str | None, body: Mapping[str, Any]) -> bool:
    """Listed at start (type None), created, or its spec changed since the status last observed it.
    A status patch (the operator's own) changes no generation, so it wakes nothing."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return False  # going: nothing new is started for it
    if event_type in (None, "ADDED"):
        return True
    if event_type != "MODIFIED":
        return False
    generation = (body.get("metadata") or {}).get("generation")
    return bool((body.get("status") or {}).get("observedGeneration") != generation)


class Controller:
    def __init__(self, settings: Settings, kube: Callable[[], Kube]) -> None:
        self.settings = settings
        self.kube = kube
        self.fleet = FleetIndex()
        self.queue: WorkQueue[Key] = WorkQueue()
        self._known: set[Key] = set()
        self._known_lock = threading.Lock()
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        self._workers = start_workers(self.queue, self.process, self.settings.workers)

    def stop(self) -> None:
        self.queue.shutdown()
        for t in self._workers:
            t.join(timeout=30)  # a reconcile in progress finishes its API calls (bounded by timeouts)

    # -- from Kopf's handlers: cheap, no API calls ---------------------------------------------------

    def on_model_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = key_of(body)
        if event_type == "DELETED":
            self.forget(key)
            return
        with self._known_lock:
            self._known.add(key)
        if needs_reconcile(event_type, body):
            self._add(key)

    def on_job_event(self, body: Mapping[str, Any]) -> None:
        namespace = (body.get("metadata") or {}).get("namespace") or "default"
        for owner in (body.get("metadata") or {}).get("ownerReferences") or []:
            if owner.get("kind") == "CompiledModel" and owner.get("name"):
                self._add((namespace, owner["name"]))

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type == "DELETED":
            changed = self.fleet.remove((body.get("metadata") or {}).get("name") or "")
        else:
            changed = self.fleet.upsert(body)
        if changed:
            with self._known_lock:
                known = list(self._known)
            names = ", ".join(c.name for c in self.fleet.classes())
            log.info("hardware classes now: %s; looking at %d CompiledModel(s) again", names, len(known))
            for key in known:
                self._add(key)

    def forget(self, key: Key) -> None:
        with self._known_lock:
            self._known.discard(key)
        self.queue.discard(key)
        metrics.forget(*key)

    def _add(self, key: Key) -> None:
        self.queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self.queue))

    # -- in a worker thread ------------------------------------------------------------------------------

    def process(self, key: Key) -> None:
        namespace, name = key
        kube = self.kube()
        try:
            doc = kube.get_compiled_model(namespace, name)
            if doc is None:
                self.forget(key)  # deleted meanwhile: its Jobs go with it (ownerReferences)
                return
            if doc["metadata"].get("deletionTimestamp"):
                return  # being deleted: no Job is started for it

            def event(kind: str, reason: str, message: str) -> None:
                try:
                    kube.post_event(doc, kind, reason, message)
                except (ApiException, HTTPError) as err:  # an Event is a courtesy, never a failure
                    log.warning("%s/%s: Event %s not posted: %s", namespace, name, reason, err)

            outcome = reconcile(doc, kube, self.settings, event, classes=self.fleet.classes())
        except (ApiException, HTTPError) as err:
            metrics.RETRIES.inc()
            why = f"{err.status} {err.reason}" if isinstance(err, ApiException) else str(err)
            log.warning(
                "%s/%s: API call failed (%s); retrying in %.0f s", namespace, name, why, self.queue.retry(key)
            )
            return
        finally:
            metrics.QUEUE_DEPTH.set(len(self.queue))
        self.queue.forget(key)
        if outcome.requeue:
            self.queue.add_after(key, self.settings.resync_seconds)
        metrics.QUEUE_DELAYED.set(self.queue.delayed)
