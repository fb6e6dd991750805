"""Steps that run inside a backend's own environment (one module per environment, class Steps), and
what they share: the protocol's `.npz` arrays (keys are positions) and the feeds kept per file.
Imports only the standard library and numpy (every environment has it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


def read_arrays(path: str) -> list[Array]:
    """The arrays of a protocol `.npz` file, in position order."""
    with np.load(path) as data:
        return [data[str(i)] for i in range(len(data.files))]


def write_arrays(path: str, arrays: list[Array]) -> None:
    np.savez(path, **{str(i): a for i, a in enumerate(arrays)})  # type: ignore[arg-type]


class FeedCache:
    """Each feed file read and made ready for the runtime once (the benchmark sends the same file
    many times, and the timed call should not include the read); at most `limit` kept, all dropped
    when full."""

    def __init__(self, limit: int = 8) -> None:
        self.limit = limit
        self._ready: dict[str, list[Any]] = {}

    def get(self, path: str, prepare: Callable[[list[Array]], list[Any]]) -> list[Any]:
        """The feed at `path`, read and passed through `prepare` (which may refuse it with
        StepFailed) on first use."""
        if path not in self._ready:
            if len(self._ready) >= self.limit:
                self._ready.clear()
            self._ready[path] = prepare(read_arrays(path))
        return self._ready[path]

    def clear(self) -> None:
        self._ready.clear()
