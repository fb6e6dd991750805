"""The layers int8 hurts most, kept in float by the `keepFloat: sensitive` option of both CPU
backends (NNCF's and Olive's recipes keep the same): the first and last weighted layers, the
product of attention's softmax with the values, and every weighted layer whose output reaches a
LayerNorm through Adds alone (attention output and FFN output projections: the residual stream
carries outliers that one int8 scale cannot hold). One rule over any graph API: each backend says
how to walk its own graph. `output_tail` adds the float post-processing after the last weighted
layers (ONNX Runtime's keep-sensitive; OpenVINO's NNCF int8 of NudeNet's detector found 9 of its 10
objects without it)."""

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

    keep = {id(n) for n in layers[:1] + layers[-1:]}
    keep |= {id(n) for n in layers if after_attention(graph, n, attention) or feeds_norm(n)}
    return [n for n in layers if id(n) in keep]


def after_attention(
    graph: GraphView[Node], node: Node, attention: Collection[str], through: Collection[str] = ()
) -> bool:
    """Whether `node` reads an attention op's output (op types `attention`: a softmax), directly or
    across ops of the types `through` (casts): the product of attention's probabilities with the
    values. A classifier head's softmax feeds the graph's output instead."""
    for parent in graph.parents(node):
        while graph.kind(parent) in through and graph.parents(parent):
            parent = graph.parents(parent)[0]
        if graph.kind(parent) in attention:
            return True
    return False


def output_tail(graph: GraphView[Node], weighted: Collection[str], norms: Collection[str]) -> list[Node]:
    """The float post-processing between the last weighted layers and the graph's outputs, in graph
    order: every node reached walking back from a node nothing reads (an output) without crossing a
    weighted layer or a norm. A detector decodes there: NudeNet's YOLOv8n concatenates its box
    coordinates (pixels, up to 320) with its class probabilities (0-1) into one output, and one int8
    scale over that concatenation rounded every probability to 0 (ONNX Runtime's static QDQ: 0 of the
    10 detections the source found on photos of people; 10 of 10 with this tail in float). The walk
    stops at norms, which the rule above handles: it would otherwise follow a transformer's residual
    stream through every layer."""
    stops = set(weighted) | set(norms)
    tail: dict[int, Node] = {}
    stack = [n for n in graph.nodes if not graph.consumers(n)]
    while stack:
        node = stack.pop()
        if id(node) in tail or graph.kind(node) in stops:
            continue
        tail[id(node)] = node
        stack.extend(graph.parents(node))
    return [n for n in graph.nodes if id(n) in tail]
