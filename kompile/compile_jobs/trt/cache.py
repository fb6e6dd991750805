"""Where a TensorRT timing cache lives: one per (GPU class, TensorRT version).

A timing cache holds measured tactic timings; TensorRT refuses one from another version and its
timings only hold for the device they were measured on, so the key is exactly those two. Every build
in the fleet for a class reads and extends the same file, so the second build of a model family on
that class skips most of the tactic timing.
"""

from __future__ import annotations

import os
import re
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
