"""Progress notes no compile Job is writing any more, removed.

A Job removes its own note when it ends, and the operator removes it once it sees the Job ended
(store_access.forget_progress). Neither happens for a Job killed outright (OOM, a drain past its
grace) whose CompiledModel is deleted before the operator looks: the Job goes with its owner and
its note would stay in the store for good. No Job outlives its deadline (activeDeadlineSeconds
counts from its creation, retries included), so a note untouched for longer than that is no
running Job's: twice the deadline, for a Job made under a longer deadline setting than today's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kompile.artifact_store import delete, files_older_than, join
from kompile.operator.store_access import StoreAccess, StoreUnavailable, store_call

log = logging.getLogger("kompile.operator")


class ProgressSweep:
    """Sweeps each progress folder at most once per `every` seconds (one listing, then a delete per
    stale note); what the store refuses or cannot answer waits for the next turn."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def _due(self, folder: str, every: float) -> bool:
        now = self._clock()
        with self._lock:
            last = self._last.get(folder)
            if last is not None and now - last < every:
                return False
            self._last[folder] = now  # claimed: a concurrent worker does not list it too
            return True

    def __call__(self, folder: str, store: StoreAccess, stale_after: float, every: float) -> list[str]:
        """Remove the notes under `folder` untouched for `stale_after` seconds, unless it was swept
        less than `every` seconds ago; returns the names removed."""
        if store.refused or not self._due(folder, every):
            return []
        try:
            stale = store_call(
                folder,
                store,
                lambda: files_older_than(folder, stale_after, store.endpoint, store.credentials),
            )
            for name in stale:
                _delete(join(folder, name), store)
        except StoreUnavailable as err:
            log.info("progress notes under %s not swept: %s", folder, err)
            return []
        if stale:
            log.info(
                "removed %d progress note(s) no compile Job writes: %s", len(stale), ", ".join(stale[:5])
            )
        return stale


def _delete(uri: str, store: StoreAccess) -> None:
    store_call(uri, store, lambda: delete(uri, store.endpoint, store.credentials))


SWEEP = ProgressSweep()
"""The operator's: one per process, as the store breaker is."""
