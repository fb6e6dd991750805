"""A compile Job's progress, told to the operator while it runs.

Every progress line still goes to the pod's log; the latest one is also written to the store
(kompile.api.cache.progress_uri) at most every PROGRESS_EVERY_SECONDS, from a thread, so a long
stage (a compile, a tuning) shows in the target's status as soon as it starts rather than only when
the Job ends. Best effort: a store that refuses the write costs one log line, never the compile.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from kompile.api.job_contract import PROGRESS_EVERY_SECONDS, JobProgress
from kompile.api.status import TargetStatus, now_rfc3339
from kompile.artifact_store import StoreError, delete, write_bytes
from kompile.compile_jobs.pipeline import Reporter, progress_line


class StoreProgress:
    """A pipeline Reporter that passes each line to `inner` and keeps the store's copy of the latest
    one fresh. close() stops the writer and removes the store's copy (the result says the rest)."""

    def __init__(
        self,
        inner: Reporter,
        uri: str,
        endpoint: str | None,
        every: float | None = None,
        write: Callable[[str, bytes, str | None], None] | None = None,
    ) -> None:
        self.inner, self.uri, self.endpoint = inner, uri, endpoint
        self.every = PROGRESS_EVERY_SECONDS if every is None else every
        self._write = write or write_bytes
        self.started = now_rfc3339()
        self._latest: str | None = None
        self._written: str | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="kompile-progress", daemon=True)
        self._thread.start()

    def stage(self, target: str | None, message: str) -> None:
        self.inner.stage(target, message)
        self._latest = progress_line(target, message)
        self._wake.set()

    def finished(self, target: TargetStatus) -> None:
        self.inner.finished(target)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            line = self._latest
            if line is not None and line != self._written and not self._stop.is_set():
                self._put(line)
            self._stop.wait(self.every)  # at most one write per interval; the latest line wins

    def _put(self, line: str) -> None:
        doc = JobProgress(line=line[:1000], at=now_rfc3339(), started=self.started)
        try:
            self._write(self.uri, doc.dumps().encode(), self.endpoint)
            self._written = line
        except StoreError as err:
            if not self._failed:  # once: the compile goes on without it
                print(f"kompile-job: progress not shown in status: {err}", file=sys.stderr, flush=True)
            self._failed = True

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.every + 30)
        try:
            delete(self.uri, self.endpoint)
        except StoreError as err:
            print(f"kompile-job: {err} (a stale progress note stays)", file=sys.stderr, flush=True)
