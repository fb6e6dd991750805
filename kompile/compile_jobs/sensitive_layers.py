"""The layers int8 hurts most, kept in float by the `keepFloat: sensitive` option of both CPU
backends (NNCF's and Olive's recipes keep the same): the first and last weighted layers, the
product of attention's softmax with the values, and every weighted layer whose output reaches a
LayerNorm through Adds alone (attention output and FFN output projections: the residual stream
carries outliers that one int8 scale cannot hold). One rule over any graph API: each backend says
how to walk its own graph."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Node = TypeVar("Node")

# How far a residual Add may sit from the layer: bias Add, residual Add, and one for luck.
_ADD_HOPS = 3


@dataclass(frozen=True)
class GraphView(Generic[Node]):
    """A backend's graph as the rule reads it."""

    nodes: Sequence[Node]
    """Every node, in topological order."""
    kind: Callable[[Node], str]
    """The node's op type."""
    consumers: Callable[[Node], list[Node]]
    """Nodes reading any of its outputs."""
    parents: Callable[[Node], list[Node]]
    """Nodes producing its inputs (graph inputs and constants may be left out)."""


def sensitive_layers(
    graph: GraphView[Node], weighted: Collection[str], norms: Collection[str], attention: Collection[str]
) -> list[Node]:
    """The weighted layers (op types `weighted`) to keep in float, in graph order."""
    layers = [n for n in graph.nodes if graph.kind(n) in weighted]

    def feeds_norm(node: Node, hops: int = _ADD_HOPS) -> bool:
        nexts = graph.consumers(node)
        if any(graph.kind(c) in norms for c in nexts):
            return True
        return hops > 0 and any(graph.kind(c) == "Add" and feeds_norm(c, hops - 1) for c in nexts)

    def after_attention(node: Node) -> bool:
        return any(graph.kind(p) in attention for p in graph.parents(node))

    keep = {id(n) for n in layers[:1] + layers[-1:]}
    keep |= {id(n) for n in layers if after_attention(n) or feeds_norm(n)}
    return [n for n in layers if id(n) in keep]
