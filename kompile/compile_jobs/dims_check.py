"""Validation at another size of each dynamic dim besides the batch (a sequence, an image's height):
the reference inputs sit at every dim's opt, and an artifact that declares the range [min, max] is
served every size in it. A trace bakes in installed code's shape arithmetic (export.py lets those
tracer warnings pass) and a compiler can get one shape wrong: right at opt and wrong at the lengths
a server sends, an artifact would pass the gate and be rolled out.

One more size is checked per dim, half its opt (never below its min): most sizes a constant or a
branch was baked at differ from it as they differ from opt, and a shorter feed costs less than the
validation itself. The inputs are the reference inputs cut to that size along the dim's axes: a
dataset's real samples stay real (a sentence's first tokens, an image's corner) and a right-padded
mask keeps its leading tokens, so no row is left with nothing to attend to; a batch a tokenizer
padded on the left (padding_side="left", as decoder models pad) keeps its last tokens instead. A
source whose outputs are NaN or Inf at the cut all the same is not checked there. The batch is held by
kompile.compile_jobs.batch_check; an artifact exported at static shapes (`exportedStatic`) runs
only those and says so, so it is not held here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kompile.api.spec import InputSpec, batch_dim
from kompile.api.status import Thresholds
from kompile.api.vocabulary import TaskKind
from kompile.compile_jobs.backends.base import BackendError, Runner
from kompile.compile_jobs.export import ExportError
from kompile.compile_jobs.inputs import PADDING_MASK_NAMES, Feed, InputMismatch
from kompile.compile_jobs.run_results import RunResults, compare
from kompile.compile_jobs.user_code import first_line


def shorter_sizes(signature: Sequence[InputSpec], feed: Feed) -> dict[str, int]:
    """Each non-batch dynamic dim's size to check: half the size the reference inputs hold (their
    opt), not below the dim's min; a dim with no room below is left out."""
    batch = batch_dim(signature)
    sizes: dict[str, int] = {}
    for spec in signature:
        for d in spec.dynamic_dims or []:
            if d.name == batch or d.name in sizes or spec.name not in feed:
                continue
            held = int(np.asarray(feed[spec.name]).shape[d.axis])
            size = max(d.min, held // 2)
            if size < held:
                sizes[d.name] = size
    return sizes


def _left_padded(feed: Feed, signature: Sequence[InputSpec]) -> set[str]:
    """The dims along which the feed's 2-D padding mask is padded on the left: every row ends in a
    token and some row starts with padding. A token is 1 (True) in an attention_mask, 0 in an
    additive one (-inf or a large negative number marks the padding) and in a key_padding_mask."""
    dims: set[str] = set()
    for spec in signature:
        arr = np.asarray(feed[spec.name])
        if arr.ndim != 2 or arr.shape[1] < 2 or not spec.name.lower().endswith(PADDING_MASK_NAMES):
            continue
        zero_is_token = spec.name.lower().endswith("padding_mask") or bool((arr < 0).any())
        tokens = arr == 0 if zero_is_token else arr != 0
        if tokens[:, -1].all() and not tokens[:, 0].all():
            dims.update(d.name for d in spec.dynamic_dims or [] if d.axis == 1)
    return dims


def cut(feed: Feed, signature: Sequence[InputSpec], sizes: dict[str, int]) -> Feed:
    """The feed's leading `sizes[name]` entries along each axis of a dim named in `sizes`; its last
    ones along a dim its padding mask pads on the left, where a short row's tokens are."""
    tail = _left_padded(feed, signature)
    out: Feed = {}
    for spec in signature:
        arr = np.asarray(feed[spec.name])
        index = [slice(None)] * arr.ndim
        for d in spec.dynamic_dims or []:
            if d.name in sizes:
                n = sizes[d.name]
                index[d.axis] = slice(arr.shape[d.axis] - n, None) if d.name in tail else slice(0, n)
        out[spec.name] = np.ascontiguousarray(arr[tuple(index)])
    return out


def describe(sizes: dict[str, int]) -> str:
    """'seq 8' or 'height 112, width 112'."""
    return ", ".join(f"{name} {size}" for name, size in sizes.items())


@dataclass
class DimsCheck:
    """The reference at the shorter sizes, computed once for every artifact of the run."""

    signature: Sequence[InputSpec]
    reference: RunResults
    reference_of: Callable[[list[Feed]], RunResults]
    """The source model's outputs on some inputs (kompile.compile_jobs.build.reference_results)."""
    task: TaskKind = "auto"
    _at: tuple[dict[str, int], RunResults] | None = None
    unchecked: str | None = None
    """The sizes not held and why, where a dim has room: the source itself refused the shorter
    inputs, or its outputs on them are NaN or Inf ('seq 8: the source model ... failed ...')."""

    def _reference(self) -> tuple[dict[str, int], RunResults] | None:
        if self._at is None and self.unchecked is None:
            feeds = self.reference.inputs
            sizes = shorter_sizes(self.signature, feeds[0]) if feeds else {}
            if not sizes:
                return None
            try:
                at = self.reference_of([cut(f, self.signature, sizes) for f in feeds])
            except (InputMismatch, ExportError) as err:  # the source's own range is narrower than declared
                self.unchecked = f"{describe(sizes)}: {first_line(err)}"
                return None
            if at.nonfinite():
                # No artifact can match NaN (a masked mean over a row the cut left empty).
                self.unchecked = (
                    f"{describe(sizes)}: the source model's outputs there are NaN or Inf "
                    "(the reference inputs cut to that size)"
                )
                return None
            self._at = sizes, at
        return self._at

    @property
    def checked(self) -> str | None:
        """The sizes held ('sequence 16'), once the reference there is computed; None: none."""
        return describe(self._at[0]) if self._at is not None else None

    def failures(self, runner: Runner, thresholds: Thresholds) -> list[str]:
        """What the artifact's outputs at the shorter sizes miss, each prefixed with the sizes; []
        when they pass or there is nothing to check."""
        at = self._reference()
        if at is None:
            return []
        sizes, reference = at
        where = describe(sizes)
        try:
            outputs = [list(runner.run(feed)) for feed in reference.inputs]
        except (BackendError, RuntimeError, ValueError) as err:
            return [f"at {where}: failed on the reference inputs cut to that size: {first_line(err)}"]
        verdict = compare(reference, reference.with_outputs("artifact", outputs), thresholds, self.task)
        return [f"at {where}: {f}" for f in verdict.failures]
