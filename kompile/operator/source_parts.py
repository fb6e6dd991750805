"""The external data files an s3:// ONNX source names, for the operator's cache key: retraining
rewrites `model.onnx.data` and leaves the graph file byte for byte the same, so the graph's ETag
alone would hand back the old weights' artifact.

The operator has no `onnx` package (its image stays light), so the names are read from the graph's
protobuf bytes: each external tensor carries a StringStringEntryProto {key: "location", value: ...},
whose encoding is fixed (field 1 "location", then field 2 with the file name).
"""

from __future__ import annotations

import functools
import posixpath

from kompile.artifact_store import Credentials, read_bytes

_LOCATION = b"\x0a\x08location\x12"  # field 1, length 8, "location", then field 2's tag
SCAN_LIMIT = 64 * 1024 * 1024
"""Graphs over this size are not read: a graph with external data is small (a few MiB even for a
large language model); a bigger .onnx file holds its weights inline, and its own ETag covers them."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data):
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7
    return -1, at


def external_data_names(graph: bytes) -> list[str]:
    """The relative file names an ONNX ModelProto's external tensors point at, sorted; names that
    would leave the model's folder are left out (the compile Job refuses those)."""
    names: set[str] = set()
    at = graph.find(_LOCATION)
    while at >= 0:
        length, start = _varint(graph, at + len(_LOCATION))
        raw = graph[start : start + length] if length > 0 else b""
        try:
            name = raw.decode()
        except UnicodeDecodeError:
            name = ""
        if name and not name.startswith("/") and ".." not in name.split("/") and name.isprintable():
            names.add(name)
        at = graph.find(_LOCATION, at + 1)
    return sorted(names)


@functools.lru_cache(maxsize=256)
def _names(
    uri: str, version: str, endpoint: str | None, credentials: tuple[tuple[str, str], ...] | None
) -> tuple[str, ...]:
    """Names per graph version (its ETag and size): the graph is read once, not per reconcile."""
    size = version.rpartition(":")[2]
    if size.isdigit() and int(size) > SCAN_LIMIT:
        return ()
    graph = read_bytes(uri, endpoint, None if credentials is None else dict(credentials))
    return tuple(external_data_names(graph)) if graph is not None else ()


def external_data_uris(
    uri: str, version: str, endpoint: str | None, credentials: Credentials | None
) -> list[str]:
    """The s3:// URIs of the external data files beside the ONNX graph at `uri` (whose ETag and
    size are `version`, as object_version gives them)."""
    if not uri.endswith(".onnx"):
        return []
    frozen = None if credentials is None else tuple(sorted(credentials.items()))  # hashable, for the cache
    names = _names(uri, version, endpoint, frozen)
    folder = posixpath.dirname(uri)
    return [posixpath.join(folder, name) for name in names]
