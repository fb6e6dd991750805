"""MLflow and the artifact store going away: every call bounded in time, and after a failure an
endpoint is left alone for a backoff instead of each reconcile spending its timeout on it.

Without this, MLflow's client retries a dead server for minutes (7 retries, 120 s timeout each)
and botocore for as long, holding an operator worker per CompiledModel the whole time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kompile.operator.settings import Settings
from kompile.operator.tenancy import host_of

# How many tries one logical call gets: one retry rides out a dropped connection, not an outage.
CALL_ATTEMPTS = 2
BACKOFF_FIRST_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 120.0


def bound_calls(settings: Settings, env: dict[str, str] | None = None) -> None:
    """Set MLflow's and the artifact store's per-call bounds for this process, unless the
    operator's environment sets them already (an administrator's choice wins)."""
    target = os.environ if env is None else env
    timeout = str(int(settings.call_timeout_seconds))
    target.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", timeout)
    target.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(CALL_ATTEMPTS - 1))
    target.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    target.setdefault("KOMPILE_STORE_TIMEOUT_SECONDS", timeout)
    target.setdefault("KOMPILE_STORE_MAX_ATTEMPTS", str(CALL_ATTEMPTS))


@dataclass
class _Trip:
    failures: int
    retry_at: float
    why: str


class Breaker:
    """Per endpoint (host:port): closed until a call fails; then open for a backoff that doubles
    with each further failure (capped), and one caller at a time probes when it runs out."""

    def __init__(
        self,
        first: float = BACKOFF_FIRST_SECONDS,
        cap: float = BACKOFF_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._first, self._cap, self._clock = first, cap, clock
        self._trips: dict[str, _Trip] = {}
        self._guard = threading.Lock()

    def wait(self, url: str) -> tuple[float, str] | None:
        """None when a call to url may go ahead now; else (seconds to wait, the last failure)."""
        key = host_of(url) or url
        with self._guard:
            trip = self._trips.get(key)
            if trip is None:
                return None
            left = trip.retry_at - self._clock()
            if left <= 0:
                # This caller probes; the others keep waiting until it reports.
                trip.retry_at = self._clock() + self._first
                return None
            return left, trip.why

    def failed(self, url: str, why: str) -> float:
        """Record a failed call; returns the seconds until the next attempt."""
        key = host_of(url) or url
        with self._guard:
            trip = self._trips.get(key)
            failures = trip.failures + 1 if trip else 1
            delay = min(self._cap, self._first * 2.0 ** (failures - 1))
            self._trips[key] = _Trip(failures, self._clock() + delay, why)
            return delay

    def succeeded(self, url: str) -> None:
        with self._guard:
            self._trips.pop(host_of(url) or url, None)

    def reset(self) -> None:
        with self._guard:
            self._trips.clear()


BREAKER = Breaker()
"""The process's one breaker: endpoints are shared by every CompiledModel that names them."""


def is_outage(err: BaseException) -> bool:
    """A transport failure, a timeout, a 5xx or a 429 (worth waiting out), as opposed to a
    refusal that says what is wrong with the request."""
    if isinstance(err, OSError):  # TimeoutError and ConnectionError among them
        return True
    text = str(err)
    code = getattr(err, "get_http_status_code", lambda: None)()
    if isinstance(code, int) and (code >= 500 or code == 429):
        return True
    markers = ("Max retries exceeded", "timed out", "Connection refused", "Connection reset", "503", "502")
    return any(m in text for m in markers)
