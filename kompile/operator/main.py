"""The Kopf application: the only module with @kopf decorators, each a thin shim into the controller.

Handlers only enqueue (kompile.operator.controller) and return; no handler needs Kopf's finalizer
(no timers, daemons or delete handlers), so a CompiledModel deleted while the operator is down
goes at once, and Kopf removes the finalizer an older operator put on one when it next sees it.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from prometheus_client import start_http_server

from kompile.api.resource import GROUP, PLURAL, VERSION
from kompile.operator import kube as kube_mod
from kompile.operator import outages
from kompile.operator.controller import Controller
from kompile.operator.jobs import LABEL_NAME
from kompile.operator.settings import Settings

SETTINGS = Settings.from_env()
_kube: kube_mod.Kube | None = None


def kube() -> kube_mod.Kube:
    global _kube
    if _kube is None:
        kube_mod.load_config()
        _kube = kube_mod.Kube()
    return _kube


CONTROLLER = Controller(SETTINGS, kube)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Nothing of Kopf's goes into status; with only event handlers it persists no progress at all.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.kompile.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kopf.kompile.dev")
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.posting.level = logging.INFO
    outages.bound_calls(SETTINGS)
    start_http_server(SETTINGS.metrics_port)
    kube()
    CONTROLLER.start()


@kopf.on.cleanup()
def shutdown(**_: Any) -> None:
    CONTROLLER.stop()


@kopf.index("", "v1", "nodes")
def fleet_nodes(body: kopf.Body, **_: Any) -> None:
    """Keeps the fleet index current; being an index, Kopf holds every other handler back until
    the first listing of Nodes is in, so no CompiledModel is reconciled against half a fleet."""
    CONTROLLER.on_node("MODIFIED", body)


@kopf.on.event("", "v1", "nodes")
def node_event(body: kopf.Body, event: kopf.RawEvent, **_: Any) -> None:
    if event.get("type") == "DELETED":  # the index sees additions and changes, not deletions
        CONTROLLER.on_node("DELETED", body)


@kopf.on.event(GROUP, VERSION, PLURAL)
def model_event(body: kopf.Body, event: kopf.RawEvent, **_: Any) -> None:
    CONTROLLER.on_model_event(event.get("type"), body)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_NAME: kopf.PRESENT})
def job_event(body: kopf.Body, event: kopf.RawEvent, **_: Any) -> None:
    """A compile Job ended: its owner is looked at now rather than at its next requeue."""
    CONTROLLER.on_job_event(event.get("type"), body)
