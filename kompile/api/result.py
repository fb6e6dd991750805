"""What a compile Job hands back: result.json in the store (full) and a compact copy that fits the
4 KiB a pod's termination message may hold, so the operator can fill status without a store read."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kompile.api.status import TargetStatus

TERMINATION_LIMIT = 4096


def compact_result(target: TargetStatus, source_digest: str | None, backend_version: str | None) -> str:
    """A JSON document under the termination-message limit; detail is dropped before essentials."""
    doc: dict[str, Any] = {
        "target": target.to_wire(),
        "sourceDigest": source_digest,
        "backendVersion": backend_version,
    }
    t = doc["target"]
    t.pop("conditions", None)
    cands: list[dict[str, Any]] = t.get("candidates", [])
    validation: dict[str, Any] = t.get("validation") or {}

    def each(key: str, fn: Callable[[Any], Any]) -> None:
        for c in cands:
            if key in c:
                c[key] = fn(c[key])

    def trim(d: dict[str, Any], key: str, fn: Callable[[Any], Any]) -> None:
        if d.get(key) is not None:
            d[key] = fn(d[key])

    # Detail goes first; candidates keep their verdict and first-batch figures longest, since
    # they say why the winner won.
    shrinkers: list[Callable[[], object]] = [
        lambda: t.pop("eagerLatency", None),
        lambda: each("options", lambda _: None),
        lambda: each("latency", lambda lat: lat[:1]),
        lambda: each("message", lambda m: m[-200:]),
        lambda: validation.pop("thresholds", None),
        lambda: validation.pop("outputs", None),
        lambda: trim(t, "latency", lambda lat: lat[:1]),
        lambda: trim(t, "message", lambda m: m[-1000:]),
        lambda: validation.pop("failures", None),
        lambda: each("message", lambda _: None),
        lambda: trim(t.get("selection") or {}, "message", lambda m: m[:300]),
    ]
    text = json.dumps(doc, separators=(",", ":"))
    for shrink in shrinkers:
        if len(text.encode()) <= TERMINATION_LIMIT:
            break
        shrink()
        text = json.dumps(doc, separators=(",", ":"))
    return text


def parse_compact(text: str) -> tuple[TargetStatus, str | None, str | None]:
    """Inverse of compact_result. Raises ValueError when the text is not such a document."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or "target" not in doc:
        raise ValueError("not a kompile job result")
    target = TargetStatus.model_validate(_fill_required(doc["target"]))
    return target, doc.get("sourceDigest"), doc.get("backendVersion")


def _fill_required(t: dict[str, Any]) -> dict[str, Any]:
    # Thresholds may have been dropped to fit the limit; the status keeps what it can.
    v = t.get("validation")
    if isinstance(v, dict) and "thresholds" not in v:
        v["thresholds"] = {"minCosine": 0.0, "topK": 1}
    return t
