"""The operator's loop: watch events become keys in a work queue, a few workers reconcile them.

Kopf's handlers (kompile.operator.main) only call the `on_*` methods here, which are cheap and
never touch the API server. What each costs:
- a CompiledModel listed at start, created, or given a new spec: one reconcile;
- its own status patches: nothing (they do not change the generation);
- a compile Job's outcome (or deletion): one reconcile of its owner a second later (the ends of
  its other Jobs meanwhile join it), deduplicated while queued, ahead of other work; when it
  settles the last target, the MLflow record and rollout follow in an ordinary pass after it;
  its other changes (a pod placed, started) wait for the in-flight requeue;
- a change of the fleet's hardware classes: one reconcile of every known CompiledModel;
- work in flight after a reconcile: one more after KOMPILE_RESYNC_SECONDS (or a slow safety look
  while only running Jobs are awaited: their ends are watched); a settled CompiledModel is not
  looked at again until one of the above happens;
- deletion: its queue entry, backoff and metric series go; its Jobs go by ownerReferences.
"""

from __future__ import annotations

import logging
import queue
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


JOB_COALESCE_SECONDS = 1.0


def job_decided(event_type: str | None, body: Mapping[str, Any]) -> bool:
    """A Job event worth its owner's reconcile now: the Job has an outcome (a True condition:
    SuccessCriteriaMet, Complete, FailureTarget, Failed...) or is gone."""
    if event_type == "DELETED":
        return True
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("status") == "True" for c in conditions)


class Controller:
    def __init__(self, settings: Settings, kube: Callable[[], Kube]) -> None:
        self.settings = settings
        self.kube = kube
        self.fleet = FleetIndex()
        self.queue: WorkQueue[Key] = WorkQueue()
        self._known: set[Key] = set()
        self._known_lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        # Events are posted from their own thread: a worker never waits on one.
        self._events: queue.Queue[tuple[Mapping[str, Any], str, str, str] | None] = queue.Queue()
        self._poster = threading.Thread(target=self._post_events, name="kompile-events", daemon=True)

    def start(self) -> None:
        self._poster.start()
        self._workers = start_workers(self.queue, self.process, self.settings.workers)

    def stop(self) -> None:
        self.queue.shutdown()
        for t in self._workers:
            t.join(timeout=30)  # a reconcile in progress finishes its API calls (bounded by timeouts)
        self._events.put(None)
        self._poster.join(timeout=30)

    def _post_events(self) -> None:
        while (item := self._events.get()) is not None:
            doc, kind, reason, message = item
            try:
                self.kube().post_event(dict(doc), kind, reason, message)
            except (ApiException, HTTPError) as err:  # an Event is a courtesy, never a failure
                meta = doc.get("metadata") or {}
                log.warning(
                    "%s/%s: Event %s not posted: %s", meta.get("namespace"), meta.get("name"), reason, err
                )

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

    def on_job_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if not job_decided(event_type, body):
            return  # a pod placed or started: the in-flight requeue shows it, no reconcile per step
        namespace = (body.get("metadata") or {}).get("namespace") or "default"
        for owner in (body.get("metadata") or {}).get("ownerReferences") or []:
            if owner.get("kind") == "CompiledModel" and owner.get("name"):
                # A short delay gathers the ends of several Jobs (and each Job's two conditions,
                # SuccessCriteriaMet then Complete) into one reconcile.
                self.queue.add_after((namespace, owner["name"]), JOB_COALESCE_SECONDS, urgent=True)

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
                self._events.put((doc, kind, reason, message))

            outcome = reconcile(
                doc,
                kube,
                self.settings,
                event,
                classes=self.fleet.classes(),
                quick=self.queue.taken_urgent(key),
            )
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
        if outcome.requeue_after is not None:
            self.queue.add_after(key, outcome.requeue_after)
        metrics.QUEUE_DELAYED.set(self.queue.delayed)
