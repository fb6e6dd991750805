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
    shrinkers: list[Callable[[], object]] = [
        lambda: t.pop("eagerLatency", None),
        lambda: t.get("validation", {}).get("thresholds") and t["validation"].pop("thresholds"),
        lambda: t.get("validation", {}).pop("outputs", None),
        lambda: t.__setitem__("latency", t.get("latency", [])[:1]),
        lambda: t.__setitem__("message", (t.get("message") or "")[-1000:]),
        lambda: t.get("validation", {}).pop("failures", None),
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
