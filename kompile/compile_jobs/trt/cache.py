"""Where a TensorRT timing cache lives: one per (GPU class, TensorRT version).

A timing cache holds measured tactic timings; TensorRT refuses one from another version and its
timings only hold for the device they were measured on, so the key is exactly those two. Every build
in the fleet for a class reads and extends the same file, so the second build of a model family on
that class skips most of the tactic timing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "KOMPILE_TIMING_CACHE_DIR"
"""Folder of timing caches (a synced copy of `<artifact store>/timing-caches`); unset: no cache."""


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", part).strip("-") or "unknown"


def timing_cache_relpath(gpu_class: str, trt_version: str) -> str:
    """Path of the cache below the store's timing-cache root: `<class>/tensorrt-<version>.cache`."""
    return f"{_safe(gpu_class)}/tensorrt-{_safe(trt_version)}.cache"


def timing_cache_path(root: Path, gpu_class: str, trt_version: str) -> Path:
    return root / timing_cache_relpath(gpu_class, trt_version)


def timing_cache_root(option: str | None = None) -> Path | None:
    """The option's folder, else $KOMPILE_TIMING_CACHE_DIR, else None (no timing cache)."""
    value = option or os.environ.get(ENV_DIR)
    return Path(value) if value else None


URI_ENV = "KOMPILE_TIMING_CACHE_URI"
"""`<artifact store>/timing-caches`, set by the operator on GPU compile Jobs."""


@dataclass
class StoreSync:
    """One timing cache file kept in step between the artifact store and the local folder the
    build reads and extends: pulled before the build, pushed back after it when it grew. Losing a
    race with another build of the class only loses timings, never correctness."""

    remote: str
    local: Path
    endpoint: str | None = None
    pulled: bytes | None = None

    def pull(self) -> bool:
        from kompile.artifact_store import read_bytes

        self.pulled = read_bytes(self.remote, self.endpoint)
        if self.pulled is None:
            return False
        self.local.parent.mkdir(parents=True, exist_ok=True)
        self.local.write_bytes(self.pulled)
        return True

    def push(self) -> bool:
        from kompile.artifact_store import write_bytes

        if not self.local.is_file():
            return False
        data = self.local.read_bytes()
        if data == self.pulled:
            return False
        write_bytes(self.remote, data, self.endpoint)
        self.pulled = data
        return True


def store_sync(
    store_uri: str, root: Path, gpu_class: str, trt_version: str, endpoint: str | None
) -> StoreSync:
    rel = timing_cache_relpath(gpu_class, trt_version)
    return StoreSync(f"{store_uri.rstrip('/')}/{rel}", root / rel, endpoint)


def sync_for_this_machine(endpoint: str | None) -> StoreSync | None:
    """The sync for this node's GPU class and TensorRT version, when the operator named a store
    folder and the image a local one; None where there is no GPU or no TensorRT."""
    store_uri, root = os.environ.get(URI_ENV), timing_cache_root()
    if not store_uri or root is None:
        return None
    from kompile.compile_jobs.backends.base import BackendUnavailable
    from kompile.compile_jobs.hardware import local_cuda_class
    from kompile.compile_jobs.trt.engine import trt_version

    gpu_class = local_cuda_class()
    if gpu_class is None:
        return None
    try:
        version = trt_version()
    except BackendUnavailable:
        return None
    return store_sync(store_uri, root, gpu_class, version, endpoint)
