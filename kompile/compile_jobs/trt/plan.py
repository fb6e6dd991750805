"""The TensorRT version a serialized plan was built with, read from its header (pure; no TensorRT).

A plan starts with the magic tag `ftrt`; bytes 24..27 hold the building library's major, minor,
patch and build numbers, one byte each. TensorRT has no API to read them without deserializing the
plan (which fails on another version); NVIDIA gave this layout in NVIDIA/TensorRT issue #3073 and
autoware_universe's engine cache (PR #10320) relies on it. The GPU test checks it against
`tensorrt.__version__` on a freshly built plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAGIC = b"ftrt"
VERSION_OFFSET = 24
HEADER_BYTES = VERSION_OFFSET + 4


class PlanHeaderError(ValueError):
    """The bytes are not a TensorRT plan (or are too short to hold its header)."""


@dataclass(frozen=True)
class PlanHeader:
    major: int
    minor: int
    patch: int
    build: int

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}.{self.build}"


def parse_header(data: bytes) -> PlanHeader:
    """Header of a plan given its first bytes (at least 28)."""
    if data[:4] != MAGIC:
        raise PlanHeaderError(
            f"not a TensorRT plan: it starts with {data[:4]!r}, a plan starts with {MAGIC!r} "
            "(was an ONNX file or a timing cache passed instead?)"
        )
    if len(data) < HEADER_BYTES:
        raise PlanHeaderError(
            f"TensorRT plan truncated: {len(data)} bytes, the header alone is {HEADER_BYTES}"
        )
    major, minor, patch, build = data[VERSION_OFFSET:HEADER_BYTES]
    return PlanHeader(major, minor, patch, build)


def read_header(path: Path) -> PlanHeader:
    """Header of the plan file at `path`."""
    with path.open("rb") as f:
        return parse_header(f.read(HEADER_BYTES))
