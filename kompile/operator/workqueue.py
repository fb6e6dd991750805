"""A work queue in the manner of client-go's: Kopf handlers only add keys; a few worker threads
reconcile them.

- A key waits in the queue at most once, however often it is added (dedup).
- A key is processed by one worker at a time; a key added while it is processed is queued again
  when that worker is done, so the change that came in meanwhile is seen (one re-run, not many).
- add_after(key, delay) adds it later; of several delays for one key the earliest wins.
- retry(key) adds it after a per-key exponential backoff; forget(key) resets the backoff.
- An urgent add (a Job's outcome, which a user waits to see in status) goes ahead of the ordinary
  ones (first looks, requeues), so a backlog of new CompiledModels never delays a finished Job;
  taken_urgent(key) tells the worker, which then keeps that run short (the slow part is requeued).
- Within each lane, groups (namespaces: a key's first element) take turns, first come first
  within a group: one tenant's burst waits behind itself, not in front of every other tenant.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger("kompile.operator")


def namespace_of(key: Hashable) -> Hashable:
    """A key's group: the namespace of a (namespace, name) key; one group for any other key."""
    return key[0] if isinstance(key, tuple) and key else None


class FairLane(Generic[K]):
    """A FIFO per group, the groups taken from in turn (round robin over those with keys)."""

    def __init__(self, group: Callable[[K], Hashable]) -> None:
        self._group = group
        self._lanes: dict[Hashable, deque[K]] = {}
        self._turns: deque[Hashable] = deque()  # the groups with keys, next one first
        self._size = 0

    def append(self, key: K) -> None:
        g = self._group(key)
        lane = self._lanes.get(g)
        if lane is None:
            lane = self._lanes[g] = deque()
            self._turns.append(g)
        lane.append(key)
        self._size += 1

    def popleft(self) -> K:
        g = self._turns.popleft()
        lane = self._lanes[g]
        key = lane.popleft()
        self._size -= 1
        if lane:
            self._turns.append(g)  # its next key waits for every other group's turn
        else:
            del self._lanes[g]
        return key

    def remove(self, key: K) -> None:
        g = self._group(key)
        lane = self._lanes[g]
        lane.remove(key)
        self._size -= 1
        if not lane:
            del self._lanes[g]
            self._turns.remove(g)

    def __contains__(self, key: object) -> bool:
        lane = self._lanes.get(self._group(key))  # type: ignore[arg-type]
        return lane is not None and key in lane

    def __len__(self) -> int:
        return self._size


class WorkQueue(Generic[K]):
    def __init__(
        self,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        group: Callable[[K], Hashable] = namespace_of,
    ) -> None:
        self._queue: FairLane[K] = FairLane(group)
        self._urgent: FairLane[K] = FairLane(group)  # taken before _queue
        self._urgent_keys: set[K] = set()  # urgent adds not yet in _urgent (delayed, or in process)
        self._dirty: set[K] = set()  # waiting in _queue, or to be queued again after processing
        self._processing: set[K] = set()
        self._taken_urgent: set[K] = set()  # in process, taken from the urgent lane
        self._waiting: list[tuple[float, int, K]] = []  # (due, tie-breaker, key), a heap
        self._due: dict[K, float] = {}  # earliest due time of each waiting key
        self._failures: dict[K, int] = {}
        self._seq = 0
        self._cond = threading.Condition()
        self._shutdown = False
        self.base_delay, self.max_delay = base_delay, max_delay

    def add(self, key: K, urgent: bool = False) -> None:
        with self._cond:
            self._add_locked(key, urgent)

    def _add_locked(self, key: K, urgent: bool = False) -> None:
        if self._shutdown:
            return
        if key in self._dirty:
            if urgent and key in self._processing:
                self._urgent_keys.add(key)  # its re-run after this one goes ahead
            elif urgent and key not in self._urgent:
                self._queue.remove(key)
                self._urgent.append(key)
            return
        self._dirty.add(key)
        if key in self._processing:
            if urgent:
                self._urgent_keys.add(key)
            return
        (self._urgent if urgent else self._queue).append(key)
        self._cond.notify()

    def add_after(self, key: K, delay: float, urgent: bool = False) -> None:
        if delay <= 0:
            self.add(key, urgent)
            return
        due = time.monotonic() + delay
        with self._cond:
            if urgent:
                self._urgent_keys.add(key)
            if self._shutdown or self._due.get(key, float("inf")) <= due:
                return
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._waiting, (due, self._seq, key))
            self._cond.notify()

    def retry(self, key: K) -> float:
        """Add the key after its backoff (base_delay doubling per failure, at most max_delay)."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay: float = min(self.base_delay * 2.0**n, self.max_delay)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset the key's backoff (it succeeded)."""
        with self._cond:
            self._failures.pop(key, None)

    def discard(self, key: K) -> None:
        """Drop every trace of the key but a run in progress (its object is gone)."""
        with self._cond:
            self._failures.pop(key, None)
            self._due.pop(key, None)  # its heap entry is skipped when it comes due
            self._urgent_keys.discard(key)
            if key in self._dirty and key not in self._processing:
                (self._urgent if key in self._urgent else self._queue).remove(key)
            self._dirty.discard(key)

    def get(self) -> K | None:
        """The next key to process (marked as processing), or None once shut down."""
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                self._promote_due()
                if self._urgent or self._queue:
                    if self._urgent:
                        key = self._urgent.popleft()
                        self._taken_urgent.add(key)
                    else:
                        key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                timeout = self._waiting[0][0] - time.monotonic() if self._waiting else None
                self._cond.wait(timeout)

    def _promote_due(self) -> None:
        now = time.monotonic()
        while self._waiting and self._waiting[0][0] <= now:
            due, _, key = heapq.heappop(self._waiting)
            if self._due.get(key) == due:  # not superseded by an earlier add_after, nor discarded
                del self._due[key]
                urgent = key in self._urgent_keys and key not in self._processing
                if urgent:
                    self._urgent_keys.discard(key)
                self._add_locked(key, urgent)

    def taken_urgent(self, key: K) -> bool:
        """Whether the key's run in progress was taken from the urgent lane."""
        with self._cond:
            return key in self._taken_urgent

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            self._taken_urgent.discard(key)
            if key in self._dirty:
                urgent = key in self._urgent_keys and key not in self._due
                if urgent:
                    self._urgent_keys.discard(key)
                (self._urgent if urgent else self._queue).append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        """Keys waiting to be processed now (not the delayed ones)."""
        with self._cond:
            return len(self._queue) + len(self._urgent)

    @property
    def delayed(self) -> int:
        with self._cond:
            return len(self._due)


def start_workers(queue: WorkQueue[K], process: Callable[[K], None], count: int) -> list[threading.Thread]:
    """`count` daemon threads that take keys from the queue and call process(key) until shutdown.
    process owns its errors (retry or forget); one that escapes is logged and the key retried."""

    def loop() -> None:
        while (key := queue.get()) is not None:
            try:
                process(key)
            except Exception:  # a worker must outlive any one key's failure
                log.exception("processing %s failed; retrying in %.0f s", key, queue.retry(key))
            finally:
                queue.done(key)

    threads = [threading.Thread(target=loop, name=f"kompile-worker-{i}", daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return threads
