"""The compile cache key: a content address for "this source, compiled this way, for this hardware".

Pure and shared: the operator computes it to look for a validated artifact before launching a Job,
the Job computes the same to know where to publish. Any field that changes the artifact or its
verdict is in the key; names and benchmark settings are not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from kompile.api.spec import InputSpec, Target, Validation

# 2: int8 calibrates without the held-out reference samples (kompile.compile_jobs.calibration);
# an entry keyed under 1 was judged on its own calibration samples, so it is built again.
KEY_VERSION = "2"


def cache_key(
    source_fingerprint: str,
    target: Target,
    backend_version: str,
    hardware_class: str,
    inputs: Sequence[InputSpec],
    validation: Validation,
    model_name: str,
) -> str:
    """40 hex characters of sha256 over a canonical JSON of everything that shapes the artifact."""
    doc = {
        "v": KEY_VERSION,
        "source": source_fingerprint,
        "backend": target.backend,
        "backendVersion": backend_version,
        "hardwareClass": hardware_class,
        "precision": target.precision,
        "quantization": target.quantization,
        "options": dict(sorted((target.options or {}).items())),
        "tolerances": target.tolerances.to_wire() if target.tolerances else None,
        "inputs": [i.to_wire() for i in inputs],
        "validation": validation.to_wire(),
        "model": model_name,
    }
    if target.candidates or target.selection:
        # Only multi-candidate targets carry these, so single-backend keys stay as they were.
        doc["candidates"] = [c.to_wire() for c in target.candidates or []]
        doc["selection"] = target.selection.to_wire() if target.selection else None
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:40]


def artifact_prefix(store_root: str, namespace: str, key: str) -> str:
    """Where the artifact for `key` lives: a Triton repository root plus result.json. Each
    namespace has its own folder, so one tenant's entry is never another's cache hit, and a store's
    policy can scope a namespace's credentials to `<root>/cache/<namespace>/`."""
    return f"{store_root.rstrip('/')}/cache/{namespace}/{key}"


def progress_uri(prefix: str) -> str:
    """Where the compile Job for an artifact prefix tells its progress while it runs: beside the
    namespace's cache entries (a tenant's store credentials reach it), never inside the entry,
    which KServe copies whole to the server."""
    folder, key = prefix.rstrip("/").rsplit("/", 1)
    return f"{folder}/progress/{key}.json"


def progress_folder(store_root: str, namespace: str) -> str:
    """The folder of a namespace's progress notes (progress_uri's)."""
    return artifact_prefix(store_root, namespace, "progress")


def prefix_root(prefix: str) -> str:
    """The store root of a prefix made by artifact_prefix (its last three segments dropped)."""
    return prefix.rstrip("/").rsplit("/", 3)[0]
