"""Optimization profiles from the signature's dynamic ranges (pure; no TensorRT).

A TensorRT engine with dynamic shapes needs, per input, a (min, opt, max) shape per profile; kernels
are tuned for `opt`. One profile across a wide batch range (1..256, say) tunes every batch for the
same opt, so when max/min reaches `split_ratio` the batch range is cut into profiles that each span
at most that ratio, each tuned for its own middle (a power of two where one fits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kompile.api.catalog.tensorrt import DEFAULT_PROFILE_SPLIT
from kompile.api.spec import InputSpec

DEFAULT_SPLIT_RATIO = DEFAULT_PROFILE_SPLIT  # the catalog's default of option profileSplit

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """min, opt and max shape of every input for one optimization profile."""

    shapes: dict[str, tuple[Shape, Shape, Shape]]

    def batch_range(self) -> tuple[int, int]:
        """(min, max) of axis 0 over the inputs (the batch range this profile serves)."""
        lows = [s[0][0] for s in self.shapes.values() if s[0]]
        highs = [s[2][0] for s in self.shapes.values() if s[2]]
        return (min(lows), max(highs)) if lows else (1, 1)


def _batch_range(signature: Sequence[InputSpec]) -> tuple[int, int, int] | None:
    """(min, opt, max) of the shared batch axis (a dynamic axis 0), or None when there is none."""
    for spec in signature:
        for d in spec.dynamic_dims or []:
            if d.axis == 0:
                return d.min, d.opt, d.max
    return None


def _pow2_near(low: int, high: int) -> int:
    """A power of two in [low, high] near their geometric middle, else the middle itself."""
    middle = math.sqrt(low * high)
    candidates = [2**k for k in range(0, 31) if low <= 2**k <= high]
    if not candidates:
        return max(low, min(high, round(middle)))
    best: int = min(candidates, key=lambda c: abs(math.log(c) - math.log(middle)))
    return best


def batch_ranges(
    lo: int, opt: int, hi: int, split_ratio: int = DEFAULT_SPLIT_RATIO
) -> list[tuple[int, int, int]]:
    """Cut [lo, hi] into (min, opt, max) pieces whose max/min stays within split_ratio.

    The piece holding the signature's opt keeps it; the others are tuned near their middle.
    """
    if split_ratio < 2 or hi < lo * split_ratio:
        return [(lo, opt, hi)]
    pieces: list[tuple[int, int, int]] = []
    start = lo
    while start <= hi:
        end = hi if start * split_ratio >= hi else start * split_ratio - 1
        tuned = opt if start <= opt <= end else _pow2_near(start, end)
        pieces.append((start, tuned, end))
        start = end + 1
    return pieces


def derive_profiles(signature: Sequence[InputSpec], split_ratio: int = DEFAULT_SPLIT_RATIO) -> list[Profile]:
    """One profile, or several when the batch range is wide; fixed shapes give min = opt = max."""
    batch = _batch_range(signature)
    pieces = batch_ranges(*batch, split_ratio) if batch else [(0, 0, 0)]
    profiles: list[Profile] = []
    for b_min, b_opt, b_max in pieces:
        shapes: dict[str, tuple[Shape, Shape, Shape]] = {}
        for spec in signature:
            triple = []
            for which, b in (("min", b_min), ("opt", b_opt), ("max", b_max)):
                shape = spec.concrete_shape(which=which)
                if batch and spec.shape[0] == -1:
                    shape[0] = b
                triple.append(tuple(shape))
            shapes[spec.name] = (triple[0], triple[1], triple[2])
        profiles.append(Profile(shapes))
    return profiles


def triton_max_batch(profiles: Sequence[Profile], batched: bool) -> int:
    """max_batch_size for Triton: the largest batch any profile serves (Triton refuses a larger one).

    0 when the model has no dynamic batch axis (Triton then passes shapes through unchanged).
    """
    if not batched or not profiles:
        return 0
    return max(p.batch_range()[1] for p in profiles)


def describe(profiles: Sequence[Profile]) -> str:
    """A compact record: batch ranges as min:opt:max, one per profile."""
    out = []
    for p in profiles:
        first = next(iter(p.shapes.values()), None)
        if first is None or not first[0]:
            out.append("static")
            continue
        out.append(f"{first[0][0]}:{first[1][0]}:{first[2][0]}")
    return ",".join(out)
