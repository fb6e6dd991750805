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
