"""One active operator at a time: leader election on a coordination.k8s.io/v1 Lease.

Kopf's peering only pauses operators that see each other; it elects no leader. Here a process
takes the Lease before Kopf starts (a standby waits, polling), renews it from a thread, and exits
non-zero when it cannot renew in time: its Deployment restarts it into standby. On an orderly exit
it hands the Lease back, so a standby takes over at once instead of after the Lease expires.

In the manner of client-go's leaderelection: a Lease held by another is free once its record has
not changed for leaseDurationSeconds, measured on this process's own clock (no clock comparison
between machines); every write carries the resourceVersion read, so two candidates cannot both win.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from kompile.operator.kube import REQUEST_TIMEOUT

log = logging.getLogger("kompile.operator.leader")
LOST_EXIT_CODE = 3


class LeaseForbidden(RuntimeError):
    """The operator's identity may not use the Lease: waiting would never end."""


def default_identity() -> str:
    """The pod's name (its hostname in Kubernetes) and this process's id."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


def _now() -> datetime:
    now = datetime.now(UTC)
    # A MicroTime must carry its fraction; isoformat() drops a zero one.
    return now.replace(microsecond=now.microsecond or 1)


@dataclass
class _Observed:
    holder: str | None
    record: tuple[object, ...]
    since: float  # time.monotonic() when this record was first seen


class LeaseElector:
    """Acquire, renew and release one Lease for one identity."""

    def __init__(
        self,
        api: client.CoordinationV1Api,
        name: str,
        namespace: str,
        identity: str,
        duration: float = 15.0,
    ) -> None:
        self.api, self.name, self.namespace, self.identity = api, name, namespace, identity
        self.duration = duration
        self.retry_period = max(duration / 5, 0.2)  # how often a standby looks, and the leader renews
        self.renew_deadline = duration * 2 / 3  # the leader gives up before a standby may take over
        self._observed: _Observed | None = None
        self._stop = threading.Event()

    # -- one attempt -----------------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this identity holds the Lease afterwards."""
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status != 404:
                raise
            return self._create()
        spec = lease.spec or client.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions, spec.acquire_time)
        if self._observed is None or self._observed.record != record:
            self._observed = _Observed(spec.holder_identity, record, time.monotonic())
        held_by_other = spec.holder_identity and spec.holder_identity != self.identity
        if held_by_other and time.monotonic() - self._observed.since < self.duration:
            return False
        now = _now()
        if spec.holder_identity != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if spec.holder_identity else 0)
        spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = max(1, round(self.duration))
        lease.spec = spec
        try:  # the read's resourceVersion rides along: a concurrent writer makes this a 409
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def _create(self) -> bool:
        now = _now()
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, round(self.duration)),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            self.api.create_namespaced_lease(self.namespace, body, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 409:  # another candidate created it first
                return False
            raise
        return True

    def holder(self) -> str | None:
        return self._observed.holder if self._observed else None

    # -- the loops -------------------------------------------------------------------------------------

    def _attempt(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except (ApiException, HTTPError) as err:
            if isinstance(err, ApiException) and err.status in (401, 403):
                raise LeaseForbidden(
                    f"Lease {self.namespace}/{self.name}: {err.status} {err.reason}: grant get, create and "
                    "update on leases.coordination.k8s.io there (the chart does in its own namespace), or "
                    "set KOMPILE_LEASE_NAMESPACE to a namespace where it may"
                ) from err
            why = f"{err.status} {err.reason}" if isinstance(err, ApiException) else str(err)
            log.warning("Lease %s/%s: %s", self.namespace, self.name, why)
            return False

    def acquire(self) -> None:
        """Block until this identity holds the Lease; say once per new holder that it waits."""
        said: str | None = None
        while not self._attempt():
            holder = self.holder()
            if holder != said:
                log.info(
                    "standby: Lease %s/%s is held by %s; waiting to take over",
                    self.namespace,
                    self.name,
                    holder,
                )
                said = holder
            time.sleep(self.retry_period)
        log.info("leader: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)

    def keep(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew from a daemon thread; on_lost() when no renewal succeeded for renew_deadline."""

        def loop() -> None:
            last = time.monotonic()
            while not self._stop.wait(self.retry_period):
                if self._attempt():
                    last = time.monotonic()
                elif time.monotonic() - last > self.renew_deadline or self.holder() not in (
                    None,
                    self.identity,
                ):
                    log.error("lost Lease %s/%s (holder now %s)", self.namespace, self.name, self.holder())
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="kompile-lease", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Hand the Lease back (an orderly exit), so a standby need not wait for it to expire."""
        self._stop.set()
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.acquire_time = None
            lease.spec.renew_time = None
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=REQUEST_TIMEOUT
            )
        except (ApiException, HTTPError) as err:
            log.warning("Lease %s/%s not released: %s", self.namespace, self.name, err)
            return
        log.info("released Lease %s/%s", self.namespace, self.name)


def lose_leadership() -> None:
    """Stop at once: another replica may already act, so no handler of this one may go on."""
    logging.shutdown()
    os._exit(LOST_EXIT_CODE)


class _Alive(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # probes every few seconds would flood the log


@contextlib.contextmanager
def standby_health(port: int) -> Iterator[None]:
    """Answer liveness probes on the health port while waiting for the Lease (Kopf serves it
    afterwards), so a standby is not restarted for being idle."""
    server = ThreadingHTTPServer(("0.0.0.0", port), _Alive)
    thread = threading.Thread(target=server.serve_forever, name="kompile-standby-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
