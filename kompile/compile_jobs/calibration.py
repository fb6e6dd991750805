"""Which reference samples an int8 build calibrates on, and which it never sees.

The gate judges every reference sample. Were the calibration samples all of them, the gate would
judge int8 only on inputs whose activation ranges it was fitted to: nothing there is clipped, and
NNCF's accuracy control (which reverts layers to float until the gate's metric holds) tunes on the
very samples it is then judged on. Real MobileNetV2 on 8 crops of one photo: OpenVINO's
accuracy-controlled int8 held cosine 0.991 there and 0.956 on crops of six other photos. So every
fourth sample (at least one where there are two or more) is held out of calibration and judged as
unseen input, as a deployed model's inputs are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

# One sample in this many is held out: three of four still calibrate.
EVERY = 4


def held_out(samples: int) -> list[int]:
    """Indices of the samples calibration leaves out: every fourth (3, 7, ...), the last of two or
    three, none of one (a single sample must calibrate)."""
    every = [i for i in range(EVERY - 1, samples, EVERY)]
    return every or ([samples - 1] if samples >= 2 else [])


def calibrating(samples: int) -> list[int]:
    """Indices of the samples calibration uses, ascending."""
    out = set(held_out(samples))
    return [i for i in range(samples) if i not in out]


def calibration_part(items: Sequence[T]) -> list[T]:
    """The items (one per reference sample) of the samples calibration uses."""
    return [items[i] for i in calibrating(len(items))]
