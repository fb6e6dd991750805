"""What the build stage hands on: built artifacts, and per target the candidates it compiled and
how the winner among them becomes the target's result."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kompile.api.spec import Target
from kompile.api.status import CandidateStatus, TargetStatus
from kompile.compile_jobs.backends.base import CompiledArtifact, Runner
from kompile.compile_jobs.selection import select

# Fields a winning candidate hands to its target's status.
_WINNER_FIELDS = (
    "backend",
    "precision",
    "artifact",
    "latency",
    "eager_latency",
    "speedup",
    "speedup_stable",
    "validation",
    "compile_seconds",
    "validation_seconds",
)


@dataclass
class BuiltTarget:
    """A target (or candidate) that compiled: what the benchmark and the registry need."""

    target: Target
    status: TargetStatus
    artifact: CompiledArtifact
    runner: Runner | None
    """None for an export-only artifact (phase Exported): nothing here can run it."""
    repo_dir: Path
    params: dict[str, str]


@dataclass
class PlannedTarget:
    """One target of the run: a single build, or candidates of which the fastest validated wins."""

    target: Target
    status: TargetStatus
    multi: bool
    built: list[BuiltTarget] = field(default_factory=list)
    candidates: list[TargetStatus] = field(default_factory=list)

    def labelled(self) -> Iterator[tuple[str, BuiltTarget]]:
        """Each built artifact with its unique label in the benchmark round."""
        for b in self.built:
            yield (f"{self.target.name}/{b.target.name}" if self.multi else self.target.name), b

    def finish(self, batch_sizes: Sequence[int]) -> BuiltTarget | None:
        """Pick the winner (multi only), fold its figures into the target's status, return it."""
        ts = self.status
        policy = self.target.selection
        by_name = {b.target.name: b for b in self.built}
        timed = {
            c.name: c.latency
            for c in self.candidates
            if c.name in by_name and c.validation and c.validation.passed and c.latency
        }
        ts.selection = select(policy, batch_sizes, timed)
        winner = ts.selection.winner
        ts.candidates = [_candidate_status(c, by_name.get(c.name), c.name == winner) for c in self.candidates]
        if ts.phase == "Skipped":
            return None
        if winner is None:
            if all(c.phase == "Skipped" for c in self.candidates):
                ts.phase, ts.reason = "Skipped", self.candidates[0].reason
            elif all(c.phase in ("Skipped", "Exported") for c in self.candidates):
                # Only export-only candidates built: recorded, never a winner.
                ts.phase, ts.reason = "Exported", "Exported"
            else:
                ts.phase, ts.reason = "Failed", "NoCandidateValidated"
            ts.message = "; ".join(
                f"{c.name}: {c.reason}: {c.message or ''}".rstrip(": ") for c in self.candidates
            )
            return None
        w = by_name[winner]
        for name in _WINNER_FIELDS:
            setattr(ts, name, getattr(w.status, name))
        ts.phase, ts.reason, ts.message = "Succeeded", "Validated", w.status.message
        params = {
            **w.params,
            "candidate": winner,
            "selection.policy": ts.selection.policy,
            "selection.candidates": ",".join(c.name for c in self.candidates),
        }
        return BuiltTarget(self.target, ts, w.artifact, w.runner, w.repo_dir, params)


def _candidate_status(c: TargetStatus, built: BuiltTarget | None, selected: bool) -> CandidateStatus:
    v = c.validation
    return CandidateStatus(
        name=c.name,
        backend=c.backend,
        precision=c.precision,
        phase="Failed" if c.phase == "Succeeded" and not (v and v.passed) else c.phase,
        reason=c.reason,
        message=c.message,
        selected=selected,
        options=dict(built.artifact.options) if built else None,
        compile_seconds=c.compile_seconds,
        max_abs_error=max((o.max_abs_error for o in v.outputs), default=None) if v else None,
        min_cosine=min((o.cosine for o in v.outputs), default=None) if v else None,
        accuracy=v.task_accuracy.accuracy if v and v.task_accuracy else None,
        accuracy_drop=v.task_accuracy.drop if v and v.task_accuracy else None,
        latency=list(c.latency),
        speedup=c.speedup,
        speedup_stable=c.speedup_stable,
        artifact_digest=c.artifact.digest if c.artifact else None,
    )
