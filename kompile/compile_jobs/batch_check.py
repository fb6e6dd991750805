"""Validation beyond the reference batch: an artifact is held to the source model at every batch
size the benchmark times it at, not only at the batch its reference inputs hold (the batch dim's
opt). A trace bakes in shape-dependent control flow of installed code (export.py lets those tracer
warnings pass) and a compiler can get one shape wrong: right at opt and wrong at batch 8, an
artifact timed at 8 could win a selection made there and be rolled out. The batch dim's max is
held too, at validation, where no benchmark batch is there: a server is sent batches up to it
(Triton's max_batch_size), timed or not; a source that fails there refuses the spec before any
compile (kompile.compile_jobs.dims_check holds the other dims' bounds the same way).

The inputs at another batch are the reference inputs themselves, stacked along the batch axis and
cycled to the size: a dataset's real samples stay real (random inputs would hold a quantized model
to data it was never meant to see), and generated ones keep their ranges and padding masks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kompile.api.spec import InputSpec, batch_dim, batch_max, leading
from kompile.api.status import TargetStatus, Thresholds
from kompile.api.vocabulary import TaskKind
from kompile.compile_jobs.backends.base import BackendError, Runner
from kompile.compile_jobs.dims_check import LONGER_GROWTH, past_growth, refusal
from kompile.compile_jobs.export import ExportError
from kompile.compile_jobs.inputs import Feed, InputMismatch, stacked
from kompile.compile_jobs.run_results import RunResults, compare
from kompile.compile_jobs.user_code import first_line


@dataclass
class BatchCheck:
    """The reference at other batch sizes, computed once per size for every artifact of the run."""

    signature: Sequence[InputSpec]
    reference: RunResults
    reference_of: Callable[[list[Feed]], RunResults]
    """The source model's outputs on some inputs, as the run's reference was computed
    (kompile.compile_jobs.build.reference_results); its errors are the source's, not an artifact's."""
    task: TaskKind = "auto"
    _at: dict[int, tuple[Feed, RunResults]] = field(default_factory=dict)
    largest_batch: int | None = None
    """The batch dim's max (bounded at LONGER_GROWTH times the reference's batch) where no benchmark
    batch holds it: held at validation (prepare())."""
    unchecked: list[str] = field(default_factory=list)
    """The batch sizes past that bound, and why."""

    def largest(self, timed: Sequence[int]) -> int | None:
        """The batch to hold every artifact at besides the timed ones: the batch dim's max (a
        server is sent batches up to it: Triton's max_batch_size), at most LONGER_GROWTH times the
        reference's batch; None where the reference or a timed batch is there already."""
        checked, top = self.checked_batch, batch_max(self.signature)
        if checked is None or top is None:
            return None
        size = min(top, checked * LONGER_GROWTH)
        return None if size <= checked or size in timed else size

    def prepare(self, batch: int) -> None:
        """The source's outputs at `batch` (from largest()), before any compile; the spec refused
        where the source fails there."""
        name, top = batch_dim(self.signature) or "batch", batch_max(self.signature) or batch
        try:
            self._reference_at(batch)
        except (InputMismatch, ExportError) as err:  # the source's own batch range is narrower
            raise refusal("up to", {name: top}, {name: batch}, err) from None
        self.largest_batch = batch
        if batch < top:
            self.unchecked.append(past_growth("batch", batch, top))

    def at_largest(self, runner: Runner, thresholds: Thresholds) -> list[str]:
        """What the artifact's outputs at the prepared largest batch miss; [] where none is."""
        return [] if self.largest_batch is None else self.failures(self.largest_batch, runner, thresholds)

    @property
    def checked_batch(self) -> int | None:
        """The batch the reference inputs are at (validation checked it); None without a batch dim."""
        name, feeds = batch_dim(self.signature), self.reference.inputs
        if name is None or not feeds:
            return None
        return int(np.asarray(feeds[0][leading(self.signature).name]).shape[0])

    def needs(self, batch: int) -> bool:
        checked = self.checked_batch
        return checked is not None and batch != checked

    def feed(self, batch: int) -> Feed:
        """The reference inputs stacked along each input's batch axis and cycled to `batch` rows."""
        return stacked(self.reference.inputs, self.signature, batch)

    def failures(self, batch: int, runner: Runner, thresholds: Thresholds) -> list[str]:
        """What the artifact's outputs at `batch` miss, each prefixed with the batch; [] when they
        pass. An artifact that fails on these inputs misses; the source failing raises."""
        feed, reference = self._reference_at(batch)
        try:
            outputs = list(runner.run(feed))
        except (BackendError, RuntimeError, ValueError) as err:  # it ran this batch a moment ago
            return [f"at batch {batch}: failed on the reference inputs: {first_line(err)}"]
        verdict = compare(reference, reference.with_outputs("artifact", [outputs]), thresholds, self.task)
        return [f"at batch {batch}: {f}" for f in verdict.failures]

    def _reference_at(self, batch: int) -> tuple[Feed, RunResults]:
        if batch not in self._at:
            feed = self.feed(batch)
            self._at[batch] = feed, self.reference_of([feed])
        return self._at[batch]


def fail_at_other_sizes(status: TargetStatus, failures: list[str]) -> None:
    """An artifact that validated at the reference inputs' sizes and misses at another batch or
    another size of a dynamic dim (kompile.compile_jobs.dims_check): failed, like one that missed at the
    first, and without figures (it is never selected nor served)."""
    v = status.validation
    if v is not None:
        v.passed = False
        v.failures.extend(failures)
    status.phase, status.reason = "Failed", "ValidationFailed"
    status.message = "; ".join(v.failures if v is not None else failures)
    status.latency, status.eager_latency, status.speedup, status.speedup_stable = [], [], None, None
