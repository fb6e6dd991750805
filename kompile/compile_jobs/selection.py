"""Choose a target's winner among its validated, timed candidates. Pure: figures in, verdict out.

minLatency compares median latency at one batch size. maxThroughput takes, per candidate, the
highest throughput among the batch sizes whose p90 stays within the budget (p90, not p99: twenty
timed calls give no stable p99), and compares those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kompile.api.spec import Selection
from kompile.api.status import LatencyStats, SelectionStatus


def selection_batch(selection: Selection | None, batch_sizes: Sequence[int]) -> int:
    """The batch size a minLatency decision is made at."""
    if selection is not None and selection.batch_size is not None:
        return selection.batch_size
    return batch_sizes[0]


def _at(latency: Sequence[LatencyStats], batch: int) -> LatencyStats | None:
    return next((s for s in latency if s.batch_size == batch), None)


def select(
    selection: Selection | None, batch_sizes: Sequence[int], timed: Mapping[str, Sequence[LatencyStats]]
) -> SelectionStatus:
    """The winner among `timed` (candidate name -> latency per batch size; validated ones only).
    Ties go to the earlier candidate (the spec's order)."""
    policy = selection.policy if selection else "minLatency"
    if not timed:
        return SelectionStatus(policy=policy, message="no candidate validated")
    if policy == "maxThroughput":
        assert selection is not None and selection.latency_budget_ms is not None
        return _max_throughput(selection.latency_budget_ms, batch_sizes, timed)
    return _min_latency(selection_batch(selection, batch_sizes), timed, policy)


def _min_latency(
    batch: int, timed: Mapping[str, Sequence[LatencyStats]], policy: str, note: str = ""
) -> SelectionStatus:
    figures = {name: s.p50_ms for name, lat in timed.items() if (s := _at(lat, batch)) is not None}
    if not figures:
        return SelectionStatus(policy=policy, batch_size=batch, message=f"nothing timed at batch {batch}")
    winner = min(figures, key=lambda n: figures[n])
    best = figures[winner]
    parts = [f"{winner} p50 {best:.3f} ms"] + [
        f"{n} {v:.3f} ms ({v / best:.2f}x)"
        for n, v in sorted(figures.items(), key=lambda kv: kv[1])
        if n != winner
    ]
    return SelectionStatus(
        policy=policy,
        batch_size=batch,
        winner=winner,
        message=note + f"lowest median latency at batch {batch}: " + ", ".join(parts),
    )


def _max_throughput(
    budget: float, batch_sizes: Sequence[int], timed: Mapping[str, Sequence[LatencyStats]]
) -> SelectionStatus:
    best: dict[str, LatencyStats] = {}
    for name, latency in timed.items():
        within = [s for s in latency if s.p90_ms <= budget]
        if within:
            best[name] = max(within, key=lambda s: s.throughput)
    if not best:
        smallest = min(batch_sizes)
        note = f"no candidate kept p90 within {budget:g} ms at any batch size; "
        status = _min_latency(smallest, timed, "maxThroughput", note)
        status.latency_budget_ms = budget
        return status
    winner = max(best, key=lambda n: best[n].throughput)
    w = best[winner]
    others = ", ".join(
        f"{n} {s.throughput:.1f}/s at batch {s.batch_size}"
        for n, s in sorted(best.items(), key=lambda kv: -kv[1].throughput)
        if n != winner
    )
    missed = sorted(set(timed) - set(best))
    message = (
        f"highest throughput with p90 within {budget:g} ms: {winner} {w.throughput:.1f}/s at batch "
        f"{w.batch_size} (p90 {w.p90_ms:.3f} ms)"
        + (f"; {others}" if others else "")
        + (f"; over budget at every batch size: {', '.join(missed)}" if missed else "")
    )
    return SelectionStatus(
        policy="maxThroughput",
        batch_size=w.batch_size,
        latency_budget_ms=budget,
        winner=winner,
        message=message,
    )
