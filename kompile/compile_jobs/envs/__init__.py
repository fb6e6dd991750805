"""Steps that run inside a backend's own environment (one module per environment, class Steps), and
what they share: the protocol's `.npz` arrays (keys are positions), the feeds kept per file, and the
fixing of an ONNX export's dynamic input dimensions. Imports only the standard library and numpy
(every environment has it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]
PROTOBUF_LIMIT = 2**31 - 1
"""Protobuf's message limit: an ONNX model above it is saved with its weights as external data."""


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


def fix_input_dims(model: Any, shapes: Mapping[str, Sequence[int]]) -> None:
    """Each graph input of the ONNX `model` (a ModelProto) named in `shapes` fixed at that shape:
    the export's dynamic axes made static. ValueError naming an input whose rank differs."""
    for inp in model.graph.input:
        if inp.name in shapes:
            dims, shape = inp.type.tensor_type.shape.dim, shapes[inp.name]
            if len(dims) != len(shape):
                raise ValueError(f"input {inp.name} has rank {len(dims)}, not {len(shape)}")
            for dim, size in zip(dims, shape, strict=True):
                dim.Clear()
                dim.dim_value = int(size)


STANDARD_DOMAINS = ("", "ai.onnx")


def foreign_ops(model: Any) -> list[str]:
    """`domain.op` for each op type of the ONNX `model`'s graph outside the standard ONNX domain,
    sorted: another runtime's own ops (ONNX Runtime's transformer optimizer writes com.microsoft
    Attention, SkipLayerNormalization, ...), which a compiler's importer may not know."""
    return sorted({f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain not in STANDARD_DOMAINS})


def failing_onnx_node(err: BaseException) -> str | None:
    """The ONNX node a frontend was converting when it raised `err`: the innermost frame of its
    traceback holding a `node` NodeProto (TVM's converter loop names it so), as `Op (domain, node
    'name')`; None where no frame holds one."""
    found = None
    tb = err.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("node")
        if hasattr(node, "op_type") and hasattr(node, "domain"):
            found = node
        tb = tb.tb_next
    if found is None:
        return None
    return f"{found.op_type} ({found.domain or 'ai.onnx'}, node {found.name!r})"
