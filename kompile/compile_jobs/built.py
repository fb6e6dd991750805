"""What the build stage hands on: built artifacts, and per target the candidates it compiled and
how the winner among them becomes the target's result."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kompile.api.spec import Target
from kompile.api.status import CandidateStatus, LatencyStats, TargetStatus
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
        validated = [
            c
            for c in self.candidates
            if c.name in by_name and c.validation and c.validation.passed and c.latency
        ]
        timed = _on_one_eager(validated)
        ts.selection = select(policy, batch_sizes, timed)
        if timed != {c.name: c.latency for c in validated} and ts.selection.message:
            ts.selection.message += (
                " (candidates unloaded to bound memory were timed in rounds of their own: latencies "
                "compared after scaling each round by its eager)"
            )
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
    worst = v.worst_float_figures() if v else (None, None)
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
        max_abs_error=worst[0],
        min_cosine=worst[1],
        accuracy=v.task_accuracy.accuracy if v and v.task_accuracy else None,
        accuracy_drop=v.task_accuracy.drop if v and v.task_accuracy else None,
        detection_agreement=v.detection_agreement() if v else None,
        latency=list(c.latency),
        speedup=c.speedup,
        speedup_stable=c.speedup_stable,
        artifact_digest=c.artifact.digest if c.artifact else None,
    )


def _on_one_eager(candidates: Sequence[TargetStatus]) -> dict[str, list[LatencyStats]]:
    """Each candidate's latencies, comparable across benchmark rounds: a candidate timed in a round
    of its own (kompile.compile_jobs.residency) had its own eager beside it, and a machine busier
    in that round slowed both alike. Scaled by reference eager / own eager per batch size, the
    ratio to eager decides, as it would have in one round; one shared round changes nothing."""
    if not candidates:
        return {}
    reference = {e.batch_size: e.p50_ms for e in candidates[0].eager_latency}
    out: dict[str, list[LatencyStats]] = {}
    for c in candidates:
        own = {e.batch_size: e.p50_ms for e in c.eager_latency}
        out[c.name] = [
            s
            if own.get(s.batch_size) in (None, reference.get(s.batch_size)) or s.batch_size not in reference
            else _scaled(s, reference[s.batch_size] / own[s.batch_size])
            for s in c.latency
        ]
    return out


def _scaled(s: LatencyStats, factor: float) -> LatencyStats:
    return s.model_copy(
        update={
            "p50_ms": s.p50_ms * factor,
            "p90_ms": s.p90_ms * factor,
            "p99_ms": s.p99_ms * factor,
            "throughput": s.throughput / factor,
        }
    )
