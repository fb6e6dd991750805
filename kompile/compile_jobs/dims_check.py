"""Validation at other sizes of each dynamic dim besides the batch (a sequence, an image's height):
the reference inputs sit at every dim's opt, and an artifact that declares the range [min, max] is
served every size in it. A trace bakes in installed code's shape arithmetic (export.py lets those
tracer warnings pass) and a compiler can get one shape wrong: right at opt and wrong at the lengths
a server sends, an artifact would pass the gate and be rolled out.

Three more sizes are checked per dim. Half its opt (on the steps its range is declared in, never
below its min): most sizes a constant or a branch was baked at differ from it as they differ from
opt, and a shorter feed costs less than the validation itself. Its inputs are the reference inputs
cut to that size along the dim's axes: a dataset's real samples stay real (a sentence's first
tokens, an image's corner) and a right-padded mask keeps its leading tokens, so no row is left with
nothing to attend to; a batch a tokenizer padded on the left (padding_side="left", as decoder
models pad) keeps its last tokens instead. A source whose outputs are NaN or Inf at the cut all the
same is not checked there.

And its bounds, the shortest and longest inputs a server is sent, where a model's own limits show
(a convolution wider than the min; BERT's table of 512 positions past the max): the first sample
cut to the min, and repeated along the dim's axes up to the max, real content still (a left-padded
row ends as it did). A source that fails at a declared bound refuses the spec before any compile:
every artifact would be rolled out to fail there. The growth to the max is bounded
(LONGER_GROWTH): beyond it, the largest size it allows is checked and the rest listed as not checked.

The batch is held by kompile.compile_jobs.batch_check; an artifact exported at static shapes
(`exportedStatic`) runs only those and says so, so it is not held here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kompile.api.spec import DynamicDim, InputSpec, batch_dim
from kompile.api.status import Thresholds
from kompile.api.vocabulary import TaskKind
from kompile.compile_jobs import calibration
from kompile.compile_jobs.backends.base import BackendError, Runner
from kompile.compile_jobs.export import ExportError
from kompile.compile_jobs.inputs import Feed, InputMismatch, resize
from kompile.compile_jobs.run_results import RunResults, compare
from kompile.compile_jobs.user_code import first_line


def _held(signature: Sequence[InputSpec], feed: Feed) -> dict[str, tuple[int, DynamicDim]]:
    """Each non-batch dynamic dim (by name, first declared) and the size the feed holds it at."""
    batch = batch_dim(signature)
    dims: dict[str, tuple[int, DynamicDim]] = {}
    for spec in signature:
        for d in spec.dynamic_dims or []:
            if d.name != batch and d.name not in dims and spec.name in feed:
                dims[d.name] = int(np.asarray(feed[spec.name]).shape[d.axis]), d
    return dims


def _step(held: int, d: DynamicDim) -> int:
    """The step a range is declared in: the greatest common divisor of its min, the size held and
    its max (32 for an image 32..512 around 224, whose strides need multiples of 32; 1 for a
    sequence 1..512 around 128). A size checked off those steps may be one the model refuses."""
    return math.gcd(d.min, held, d.max)


def shorter_sizes(signature: Sequence[InputSpec], feed: Feed) -> dict[str, int]:
    """Each non-batch dynamic dim's size to check: half the size the reference inputs hold (their
    opt), down to the range's step, not below the dim's min; a dim with no room below is left out."""
    halves = {
        name: (held, max(d.min, held // 2 // _step(held, d) * _step(held, d)))
        for name, (held, d) in _held(signature, feed).items()
    }
    return {name: size for name, (held, size) in halves.items() if size < held}


def least_sizes(signature: Sequence[InputSpec], feed: Feed) -> dict[str, int]:
    """Each non-batch dynamic dim's min where it lies below the shorter size (a dim whose half opt
    is clipped to its min is held there already)."""
    shorter = shorter_sizes(signature, feed)
    held = _held(signature, feed)
    return {name: d.min for name, (size, d) in held.items() if d.min < shorter.get(name, size)}


LONGER_GROWTH = 32
"""The most the check at the max grows the first sample (the product of its dims' growth): a model's
cost grows with it (a transformer's attention as its square), and so would every validation's."""


def longer_sizes(signature: Sequence[InputSpec], feed: Feed) -> dict[str, int]:
    """Each non-batch dynamic dim's max where it exceeds the size the reference inputs hold; where
    their growth together passes LONGER_GROWTH, each grows by the same factor up to it."""
    room = {name: (held, d) for name, (held, d) in _held(signature, feed).items() if d.max > held}
    growth = float(np.prod([d.max / held for held, d in room.values()])) if room else 1.0
    factor = (LONGER_GROWTH / growth) ** (1 / len(room)) if growth > LONGER_GROWTH else 1.0
    sizes = {}
    for name, (held, d) in room.items():
        step = _step(held, d)
        sizes[name] = min(d.max, max(held + step, int(d.max * factor) // step * step))
    return sizes


def describe(sizes: dict[str, int]) -> str:
    """'seq 8' or 'height 112, width 112'."""
    return ", ".join(f"{name} {size}" for name, size in sizes.items())


def refusal(bound: str, declared: dict[str, int], sizes: dict[str, int], err: BaseException) -> InputMismatch:
    """The spec refused: the source fails at a declared bound of its dynamic dims ('down to' a min,
    'up to' a max, `declared`), run at `sizes` (the bound, or short of a max past LONGER_GROWTH)."""
    fails = "there" if sizes == declared else f"at {describe(sizes)}"
    change, most = ("raise that min", "smallest") if bound == "down to" else ("lower that max", "largest")
    hint = _GUARD_HINT if "Guard failed" in str(err) else ""
    return InputMismatch(
        f"spec.inputs declares {', '.join(f'{n} {bound} {m}' for n, m in declared.items())}, but the "
        f"source model fails {fails}: {_what_failed(err)}{hint}; "
        f"{change} in spec.inputs[].dynamicDims (or `--dim NAME=MIN:OPT:MAX`) to the {most} size the "
        "model holds"
    )


_GUARD_HINT = (
    " (a torch.export program traced with that size fixed: export it again with dynamic_shapes; "
    "MLflow 3's log_model exports each dim its input_example holds at 1 as fixed, so log it with "
    "an input_example of 2 or more rows)"
)


def past_growth(name: str, checked: int, top: int) -> str:
    """notCheckedAt's entry for the sizes of a dim above the largest LONGER_GROWTH lets it be held at."""
    return (
        f"{name} {checked + 1} to {top}: past the {LONGER_GROWTH}x growth of the reference inputs "
        "the check allows"
    )


def _what_failed(err: BaseException) -> str:
    """The source's error without the hints it carries for a run's own inputs ('; check spec...')."""
    return first_line(err).split("; ")[0]


@dataclass
class _Held:
    """One set of sizes and the source's outputs there."""

    sizes: dict[str, int]
    reference: RunResults
    how: str
    samples: list[int]
    """The reference sample each input was made from."""


@dataclass
class DimsCheck:
    """The reference at each dim's min, half its opt and its max, computed once for every artifact of
    the run (prepare(): the pipeline calls it before any compile, so a bound the source fails at is
    refused before a compile is spent)."""

    signature: Sequence[InputSpec]
    reference: RunResults
    reference_of: Callable[[list[Feed]], RunResults]
    """The source model's outputs on some inputs (kompile.compile_jobs.build.reference_results)."""
    task: TaskKind = "auto"
    _held: list[_Held] | None = None
    unchecked: list[str] = field(default_factory=list)
    """The sizes not held and why, where a dim has room: the source itself refused the shorter
    inputs, its outputs there are NaN or Inf ('seq 8: the source model ... failed ...'), or the max
    is past LONGER_GROWTH."""

    def planned(self) -> str:
        """The sizes prepare() computes the source's outputs at ('seq 3, seq 8 and seq 64'); ''
        for none."""
        feeds = self.reference.inputs
        if not feeds:
            return ""
        found = [f(self.signature, feeds[0]) for f in (least_sizes, shorter_sizes, longer_sizes)]
        return " and ".join(describe(s) for s in found if s)

    def prepare(self) -> None:
        """Compute the source's outputs at each dim's min, half its opt and its max; InputMismatch
        where the source fails at a declared min or max: the spec is the user's to change."""
        if self._held is not None:
            return
        self._held = []
        feeds = self.reference.inputs
        if not feeds:
            return
        least = least_sizes(self.signature, feeds[0])
        if least:
            at = self._at_bound(least, [resize(feeds[0], self.signature, least)], "down to")
            self._keep(least, at, "cut to that size", [0])
        shorter = shorter_sizes(self.signature, feeds[0])
        if shorter:
            try:
                at = self.reference_of([resize(f, self.signature, shorter) for f in feeds])
            except (InputMismatch, ExportError) as err:  # the source's own range is narrower than declared
                self.unchecked.append(f"{describe(shorter)}: {_what_failed(err)}")
            else:
                self._keep(shorter, at, "cut to that size", list(range(len(feeds))))
        longer = longer_sizes(self.signature, feeds[0])
        if not longer:
            return
        at = self._at_bound(longer, [resize(feeds[0], self.signature, longer)], "up to")
        self._keep(longer, at, "repeated to that size", [0])
        declared = self._declared(longer, "up to")
        self.unchecked += [past_growth(n, longer[n], top) for n, top in declared.items() if longer[n] < top]

    def _at_bound(self, sizes: dict[str, int], feeds: list[Feed], bound: str) -> RunResults:
        """The source's outputs at a declared min ('down to') or max ('up to'); the spec refused where
        the source fails there (at a max past LONGER_GROWTH: at the size checked)."""
        try:
            return self.reference_of(feeds)
        except (InputMismatch, ExportError) as err:
            raise refusal(bound, self._declared(sizes, bound), sizes, err) from None

    def _declared(self, sizes: dict[str, int], bound: str) -> dict[str, int]:
        """Each dim in `sizes` at its declared min ('down to') or max ('up to')."""
        dims = _held(self.signature, self.reference.inputs[0])
        return {n: dims[n][1].min if bound == "down to" else dims[n][1].max for n in sizes}

    def _keep(self, sizes: dict[str, int], at: RunResults, how: str, samples: list[int]) -> None:
        if at.nonfinite():  # no artifact can match NaN (a masked mean over a row the cut left empty)
            self.unchecked.append(
                f"{describe(sizes)}: the source model's outputs there are NaN or Inf "
                f"(the reference inputs {how})"
            )
        else:
            assert self._held is not None
            self._held.append(_Held(sizes, at, how, samples))

    @property
    def inputs(self) -> list[Feed]:
        """The inputs at every size held made from the calibration samples, once prepared: static
        int8 calibrates on them too (a held-out sample stays unseen at every size)."""
        calibrating = set(calibration.calibrating(len(self.reference.inputs)))
        return [
            f
            for h in self._held or []
            for f, i in zip(h.reference.inputs, h.samples, strict=True)
            if i in calibrating
        ]

    @property
    def checked(self) -> list[str]:
        """The sizes held ('sequence 16'), once prepared."""
        return [describe(h.sizes) for h in self._held or []]

    def failures(self, runner: Runner, thresholds: Thresholds) -> list[str]:
        """What the artifact's outputs at the other sizes miss, each prefixed with the sizes; []
        when they pass or there is nothing to check."""
        self.prepare()
        missed: list[str] = []
        for held in self._held or []:
            where = describe(held.sizes)
            try:
                outputs = [list(runner.run(feed)) for feed in held.reference.inputs]
            except (BackendError, RuntimeError, ValueError) as err:
                missed.append(f"at {where}: failed on the reference inputs {held.how}: {first_line(err)}")
                continue
            artifact = held.reference.with_outputs("artifact", outputs)
            verdict = compare(held.reference, artifact, thresholds, self.task)
            missed += [f"at {where}: {f}" for f in verdict.failures]
        return missed
