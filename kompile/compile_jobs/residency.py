"""Which validated artifacts stay loaded until the benchmark: as many as memory allows.

Every runtime holds its own copy of the weights (measured on a 2.15 GB MLP, fleet fp32: ONNX
Runtime +2.3 GB, OpenVINO +2.1 GB, AOTInductor +2.2 GB, each beside the 2.15 GB source), and the
interleaved benchmark wants them all loaded at once: about 6x the model's size, which kills the run
of a 4 GB model on a 24 GB machine (or its compile pod at its memory limit). An artifact whose
copy would leave too little room for the next build is unloaded once validated and loaded again
for a benchmark round of its own, beside eager; its speedup is against the eager of that round.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.backends.base import Feeds, Runner

MEMORY_ENV = "KOMPILE_MEMORY_LIMIT"
"""Bytes (or 8Gi, 512M) this run may use: a bound below the machine's, for a shared machine."""

ROOM_FACTOR = 3
"""Copies of the model's weights that must still fit after an artifact stays loaded: the next
build's compile holds two at its peak (AOTInductor measured +4.2 GB on the 2.15 GB model), and a
benchmark round loads one unloaded artifact again."""

_UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


class MemoryLimitError(ValueError):
    """KOMPILE_MEMORY_LIMIT is not a size: bad input, said before any work starts."""


def parse_bytes(text: str) -> int:
    """512, 512M, 8G, 8Gi (Kubernetes' suffixes) -> bytes; MemoryLimitError naming the forms it takes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?B?\s*", text)
    if not m:
        raise MemoryLimitError(
            f"{MEMORY_ENV}={text!r}: give bytes, or a number with K, M, G, T, Ki, Mi, Gi or Ti"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def _proc_kb(path: str, key: str) -> int | None:
    """A `Key:  N kB` line of a /proc file, in bytes; None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open(path, encoding="ascii") as f:
            line = next(ln for ln in f if ln.startswith(key + ":"))
        return int(line.split()[1]) * 1024
    return None


def _cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What the container's memory limit still allows (cgroup v2, else v1), None without a limit.
    Usage is the working set, as the kubelet counts it: the inactive page cache (files written,
    such as the artifacts) is reclaimed before the limit kills anything."""
    for limit_file, usage_file, stat_file, inactive in (
        ("memory.max", "memory.current", "memory.stat", "inactive_file"),
        (
            "memory/memory.limit_in_bytes",
            "memory/memory.usage_in_bytes",
            "memory/memory.stat",
            "total_inactive_file",
        ),
    ):
        with contextlib.suppress(OSError, ValueError):
            limit = (root / limit_file).read_text().strip()
            if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
                return None
            used = int((root / usage_file).read_text())
            with contextlib.suppress(OSError, ValueError):
                stat = dict(ln.split() for ln in (root / stat_file).read_text().splitlines())
                used -= int(stat.get(inactive, 0))
            return int(limit) - used
    return None


def memory_limit() -> int | None:
    """KOMPILE_MEMORY_LIMIT in bytes, None when unset; read when a run starts, so a bad value
    stops it before any build."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    return parse_bytes(text) if text else None


def memory_room(limit: int | None = None) -> int | None:
    """Bytes this run can still take: the least of the machine's available memory, the container
    limit's room and `limit`'s (KOMPILE_MEMORY_LIMIT). None where none of them can be read."""
    rooms = [r for r in (_proc_kb("/proc/meminfo", "MemAvailable"), _cgroup_room()) if r is not None]
    if limit is not None:
        rooms.append(limit - (_proc_kb("/proc/self/status", "VmRSS") or 0))
    return min(rooms) if rooms else None


def weights_bytes(module: Any, onnx_path: Path | None) -> int:
    """The model's weights in bytes: the module's parameters and buffers, else the ONNX graph's
    folder (graph plus external data)."""
    if module is not None and hasattr(module, "parameters"):
        tensors = [*module.parameters(), *module.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)
    if onnx_path is not None and onnx_path.exists():
        return sum(p.stat().st_size for p in onnx_path.parent.rglob("*") if p.is_file())
    return 0


@dataclass
class Residency:
    """Decides, after each validation, whether that artifact stays loaded."""

    weights: int
    room: Callable[[], int | None] = field(default=memory_room)

    @classmethod
    def for_run(cls, weights: int, limit: int | None) -> Residency:
        return cls(weights, functools.partial(memory_room, limit))

    def keep(self) -> bool:
        room = self.room()
        return room is None or room >= ROOM_FACTOR * self.weights

    def describe(self) -> str:
        room = self.room()
        free = f"{room / 1e9:.1f} GB" if room is not None else "unknown"
        return (
            f"unloaded until its benchmark round: {free} of memory left, under {ROOM_FACTOR}x the "
            f"model's {self.weights / 1e9:.2f} GB of weights"
        )


class UnloadedRunner:
    """A validated runner let go to bound memory; `loaded()` brings it back for its benchmark round."""

    def __init__(self, runner: Runner, load: Callable[[], Runner]) -> None:
        self.input_names, self.output_names = list(runner.input_names), list(runner.output_names)
        self._load = load
        self._runner: Runner | None = None
        _close(runner)

    def run(self, feeds: Feeds) -> list[np.ndarray[Any, Any]]:
        with self.loaded() as runner:
            return runner.run(feeds)

    @contextlib.contextmanager
    def loaded(self) -> Iterator[Runner]:
        """The runner, loaded again for the duration (nested uses share one load)."""
        if self._runner is not None:
            yield self._runner
            return
        self._runner = self._load()
        try:
            yield self._runner
        finally:
            runner, self._runner = self._runner, None
            _close(runner)
            del runner
            gc.collect()  # before the next round loads another copy


def _close(runner: Runner) -> None:
    """Let the runner's memory go: its own close where it has one (a backend environment's process);
    in-process runtimes free theirs with the last reference, which the caller drops."""
    close = getattr(runner, "close", None)
    if callable(close):
        close()
