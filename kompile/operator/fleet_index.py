"""The fleet as the Node watch last showed it: an in-memory index that reconciles read instead of
listing every Node each time. Fed by the operator's Node watch (kompile.operator.main)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kompile.operator.fleet import HardwareClass, discover


def _essence(node: Mapping[str, Any]) -> dict[str, Any]:
    """What discovery reads of a Node: its name, labels and schedulability (heartbeats are not kept)."""
    meta = node.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name", ""), "labels": dict(meta.get("labels") or {})},
        "spec": {"unschedulable": bool((node.get("spec") or {}).get("unschedulable", False))},
    }


def _shape(classes: list[HardwareClass]) -> list[tuple[Any, ...]]:
    """A class list without its node names: a node joining an existing class changes nothing."""
    return [
        (
            c.name,
            c.kind,
            c.arch,
            c.product,
            c.compute_capability,
            c.isa,
            tuple(sorted(c.node_selector.items())),
            c.products,
        )
        for c in classes
    ]


class FleetIndex:
    """Node essences by name and the hardware classes they make; safe to use from any thread."""

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, Any]] = {}
        self._classes: list[HardwareClass] = []
        self._lock = threading.Lock()

    def upsert(self, node: Mapping[str, Any]) -> bool:
        """Record a Node as seen; True when the set of hardware classes changed."""
        essence = _essence(node)
        with self._lock:
            name = essence["metadata"]["name"]
            if self._nodes.get(name) == essence:
                return False
            self._nodes[name] = essence
            return self._rediscover()

    def remove(self, name: str) -> bool:
        """Forget a deleted Node; True when the set of hardware classes changed."""
        with self._lock:
            if self._nodes.pop(name, None) is None:
                return False
            return self._rediscover()

    def _rediscover(self) -> bool:
        before = _shape(self._classes)
        self._classes = discover(self._nodes.values())
        return _shape(self._classes) != before

    def classes(self) -> list[HardwareClass]:
        with self._lock:
            return list(self._classes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)
