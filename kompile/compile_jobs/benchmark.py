"""Timing helpers: warm up, then time every runtime in the same rounds so machine noise hits all alike.

The speedup of an artifact is eager p50 / artifact p50 from one interleaved run: timing eager first
and the artifact a minute later on a shared, noisy machine measures the neighbours, not the compiler.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kompile.api.status import LatencyStats
from kompile.compile_jobs.cores import available_cores

Clock = Callable[[], int]


@dataclass(frozen=True)
class SelfTimed:
    """What a timed fn returns when it measured its call itself: a runtime in another process (a
    backend's own environment) times the call there, so the pipe's round trip is not counted."""

    ns: int


def set_threads(n: int | None = None) -> int:
    """Pin the thread count for every runtime in this process; returns the count used.

    torch's intra-op pool is set directly (imported here, lazily, so the pipeline's light parts do
    not pull torch in). ONNX Runtime takes its count from session options: runners read the returned
    value; OMP_NUM_THREADS is set too for libraries that size OpenMP pools at import.
    """
    threads = n or available_cores()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch
    except ModuleNotFoundError:
        return threads
    torch.set_num_threads(threads)
    return threads


def foreign_cpu_seconds() -> float | None:
    """CPU seconds used so far by everything but this process (Linux /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (
                int(v) for v in f.readline().split()[1:9]
            )
    except (OSError, ValueError):
        return None
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return busy - own.user - own.system


def process_family() -> list[int] | None:
    """This process and its descendants (a backend's own environment runs its runtime in a child),
    from the parent ids in /proc; None where /proc cannot tell (not Linux)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            ppid = int(_stat_fields(f"/proc/{entry}/stat")[1])  # state, then the parent id
        except (OSError, IndexError, ValueError):
            continue  # ended since it was listed
        parents.setdefault(ppid, []).append(int(entry))
    family, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        family.append(pid)
        todo.extend(parents.get(pid, []))
    return family


def running_threads(pids: Sequence[int]) -> int:
    """Threads of `pids` that are running now (state R: on a core or waiting for one), but the
    caller's own. A runtime's pool spinning after its call shows here; a parked pool does not."""
    me = (os.getpid(), str(threading.get_native_id()))
    running = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # the child ended
        for tid in tids:
            if (pid, tid) == me:
                continue
            try:
                running += _stat_fields(f"/proc/{pid}/task/{tid}/stat")[0] == "R"
            except (OSError, IndexError):
                continue
    return running


def _stat_fields(path: str) -> list[str]:
    """A /proc stat line's fields after the command name (which may hold spaces and parentheses):
    state first, then the parent id, ..."""
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().rsplit(")", 1)[1].split()


def wait_until_idle(cap_s: float, family: Sequence[int] | None, step_s: float = 0.001) -> float:
    """Sleep until no other thread of `family` (process_family) runs, at most `cap_s`; the seconds
    waited. A runtime's workers spin after a call (measured on a 2-core EPYC: ONNX Runtime's pool
    ~55 ms, torch's OpenMP ~8 ms, OpenVINO's under 1 ms), and a spinning pool takes cores from
    whatever is timed next: waiting for it, rather than for a fixed pause, is fair to the next
    runtime whichever came before, and waits no longer than the pool spins. No family: `cap_s`."""
    if family is None:
        time.sleep(cap_s)
        return cap_s
    start = time.perf_counter()
    while True:
        waited = time.perf_counter() - start
        if waited >= cap_s or not running_threads(family):
            return waited
        time.sleep(min(step_s, cap_s - waited))


@dataclass
class Stability:
    """Keep timing until each runtime's figure settles (as Triton Model Navigator does): the rounds
    come in windows of `window` rounds, and a runtime is stable once the medians of its last
    `agree` windows lie within `tolerance` of their mean, other processes used at most
    `max_busy_cores` of CPU meanwhile (a steady neighbour slows every window alike, so agreement
    alone would not show it), and its calls did not scatter: p90 at most (1 + `max_spread`) x p50
    and p50 at most that much above p10 (a runtime flipping between two speeds, as a 2-thread GRU
    waking its OpenMP worker after an idle pause does, 0.4 or 4 ms, can have windows agree by
    chance on either speed).
    Timing stops when every runtime is stable or `max_rounds` rounds ran; the figures are those
    of the last `agree` windows."""

    window: int
    tolerance: float = 0.10
    max_rounds: int = 80
    agree: int = 3
    max_busy_cores: float = 0.5
    max_spread: float = 1.0
    probe: Callable[[], float | None] = field(default=foreign_cpu_seconds)

    @classmethod
    def for_iterations(cls, iterations: int, tolerance: float, max_iterations: int | None) -> Stability:
        """Windows of a third of the asked-for iterations, so a steady machine times about as many
        rounds as before; a noisy one up to `max_iterations` (default 4x)."""
        window = max(2, -(-iterations // 3))
        return cls(window, tolerance, max(3 * window, max_iterations or 4 * iterations))


def window_difference(medians: list[float], agree: int = 3) -> float | None:
    """How far apart the last `agree` window medians lie, relative to their mean (None: fewer windows)."""
    if len(medians) < agree:
        return None
    last = medians[-agree:]
    mean = sum(last) / agree
    if max(last) == min(last):
        return 0.0
    return (max(last) - min(last)) / mean if mean > 0 else float("inf")


@dataclass
class QuietRounds:
    """Keep the rounds that other processes disturbed least (shared build machines, CI runners).

    Rounds run until `iterations` of them saw at most `max_foreign_cores` of CPU used by other
    processes (averaged over the round), or `max_rounds_factor * iterations` rounds ran; the
    `iterations` least disturbed rounds are kept. `discarded` counts the rounds dropped.
    """

    max_foreign_cores: float = 0.25
    max_rounds_factor: float = 3.0
    probe: Callable[[], float | None] = foreign_cpu_seconds
    discarded: int = 0


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    batch_size: int,
    warmup: int,
    iterations: int,
    clock: Clock = time.perf_counter_ns,
    pause_s: float = 0.0,
    quiet: QuietRounds | None = None,
    settle: int = 0,
    stability: Stability | None = None,
    until_idle: bool = False,
) -> dict[str, LatencyStats]:
    """Time each fn over `iterations` rounds; every round calls each fn once, in rotating order.

    Warm-up calls (`warmup` per fn, untimed) come first. Rotating the order each round keeps any
    fn from always running right after the same neighbour (cache state, turbo, GC). Latency is per
    call (perf_counter_ns); throughput is samples per second at the median latency,
    batch_size / p50, which a few outliers on a shared machine do not move.

    `pause_s` of idle time before each timed call (not counted) lets the previous runtime's
    spinning worker threads (ONNX Runtime's pool, OpenMP) go to sleep, so they do not steal
    cores from the next runtime and bias its figure; `settle` untimed calls right before each
    timed one wake this runtime's own pool, so every timed call sees the runtime in the steady
    state a server keeps it in. With `until_idle` the pause ends as soon as no other thread of this
    process or its children runs (wait_until_idle), `pause_s` its bound. `quiet` drops rounds that
    other processes disturbed; a whole round goes, so every fn keeps the same rounds. `stability`
    keeps timing in windows until each fn's figure settles (and marks those that never did); it
    replaces `iterations`. A fn that returns SelfTimed is timed by its own measure.
    """
    if iterations < 1:
        raise ValueError("iterations must be at least 1")
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    pause = _pause(pause_s, until_idle)
    if stability is not None:
        return _time_until_stable(fns, names, batch_size, clock, pause, settle, stability)
    limit = quiet.max_foreign_cores if quiet else float("inf")
    probe = quiet.probe if quiet else _no_probe
    max_rounds = max(iterations, int(iterations * quiet.max_rounds_factor)) if quiet else iterations
    rounds: list[tuple[float, dict[str, int]]] = []  # (foreign cores during the round, latencies)
    for order in rotating_orders(names, max_rounds):
        rounds.append(_timed_round(fns, order, clock, pause, settle, probe))
        if sum(1 for load, _ in rounds if load <= limit) >= iterations:
            break
    kept = sorted(rounds, key=lambda r: r[0])[:iterations]  # stable: no probe keeps them all, in order
    if quiet:
        quiet.discarded += len(rounds) - len(kept)
    return {name: latency_stats([d[name] for _, d in kept], batch_size) for name in names}


def _time_until_stable(
    fns: Mapping[str, Callable[[], object]],
    names: list[str],
    batch_size: int,
    clock: Clock,
    pause: Callable[[], object],
    settle: int,
    s: Stability,
) -> dict[str, LatencyStats]:
    """Windows of rounds until every fn's last two window medians agree, or the bound is hit."""
    windows: list[dict[str, list[int]]] = []
    busy: list[float] = []  # cores other processes used, per window
    orders = rotating_orders(names, s.max_rounds)

    def unsettled(name: str) -> str | None:
        """Why `name`'s figure is not yet stable, each failed check in words (None: it is)."""
        why = []
        difference = window_difference([float(np.median(w[name])) for w in windows], s.agree)
        if difference is None:
            why.append(f"timed in fewer than {s.agree} windows")
        elif difference > s.tolerance:
            why.append(
                f"its last {s.agree} windows' medians differed by {_percent(difference)} "
                f"(settleTolerance {_percent(s.tolerance)})"
            )
        if busy and (most := max(busy[-s.agree :])) > s.max_busy_cores:
            why.append(f"other processes kept {most:.2f} cores busy (a quiet machine: {s.max_busy_cores})")
        kept = np.asarray([d for w in windows[-s.agree :] for d in w[name]], dtype=np.float64)
        p10, p50, p90 = np.percentile(kept, [10, 50, 90]) / 1e6
        # Two speeds show at either end: a tail above the median, or a median far above the fast calls.
        if p90 > (1 + s.max_spread) * p50 or p50 > (1 + s.max_spread) * p10:
            why.append(f"its calls ran at two speeds (p10 {p10:.3g}, p50 {p50:.3g}, p90 {p90:.3g} ms)")
        return "; ".join(why) or None

    while len(windows) * s.window + s.window <= s.max_rounds:
        start = len(windows) * s.window
        window: dict[str, list[int]] = {n: [] for n in names}
        loads = []
        for order in orders[start : start + s.window]:
            load, durations = _timed_round(fns, order, clock, pause, settle, s.probe)
            loads.append(load)
            for n in names:
                window[n].append(durations[n])
        windows.append(window)
        busy.append(sum(loads) / len(loads))
        if all(unsettled(n) is None for n in names):
            break
    out: dict[str, LatencyStats] = {}
    recent = busy[-s.agree :]
    for n in names:
        stats = latency_stats([d for w in windows[-s.agree :] for d in w[n]], batch_size)
        why = unsettled(n)
        update = {"stable": why is None, "unsettled": why, "busy_cores": round(sum(recent) / len(recent), 3)}
        out[n] = stats.model_copy(update=update)
    return out


def _percent(fraction: float) -> str:
    """0.1 -> '10%', 0.001 -> '0.1%', 0.07234 -> '7.23%'."""
    return f"{fraction * 100:.3g}%"


def _no_probe() -> float | None:
    return None


def _pause(pause_s: float, until_idle: bool) -> Callable[[], object]:
    """What runs before each timed call: nothing, `pause_s` of sleep, or a wait for idle threads
    bounded by it (the processes are listed once: runners start theirs when loaded, before timing)."""
    if not pause_s:
        return lambda: None
    if not until_idle:
        return lambda: time.sleep(pause_s)
    family = process_family()
    return lambda: wait_until_idle(pause_s, family)


def _timed_round(
    fns: Mapping[str, Callable[[], object]],
    order: list[str],
    clock: Clock,
    pause: Callable[[], object],
    settle: int,
    probe: Callable[[], float | None],
) -> tuple[float, dict[str, int]]:
    """Latency of each fn in one round, and the cores other processes used meanwhile (0 if unknown)."""
    before, wall = probe(), time.perf_counter()
    durations: dict[str, int] = {}
    for name in order:
        pause()
        for _ in range(settle):
            fns[name]()
        start = clock()
        result = fns[name]()
        durations[name] = result.ns if isinstance(result, SelfTimed) else clock() - start
    after = probe()
    if before is None or after is None:
        return 0.0, durations
    return (after - before) / max(time.perf_counter() - wall, 1e-9), durations


def runner_call(runner: Any, feed: Mapping[str, Any]) -> Callable[[], object]:
    """One call of `runner` on `feed` to time: its own measure where it has one (a `timed` method,
    as a runner in a backend's own environment has), else the call itself."""
    timed = getattr(runner, "timed", None)
    if callable(timed):
        return lambda: timed(feed)
    return lambda: runner.run(feed)


def rotating_orders(names: list[str], rounds: int) -> list[list[str]]:
    """Round r calls names[r % n], names[r % n + 1], ...: each fn leads equally often."""
    n = len(names)
    return [[names[(r + i) % n] for i in range(n)] for r in range(rounds)] if n else []


def latency_stats(durations_ns: list[int], batch_size: int) -> LatencyStats:
    """p50/p90/p99 in milliseconds (linear interpolation) and samples/s at the median."""
    ms = np.asarray(durations_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return LatencyStats(
        batch_size=batch_size,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        throughput=batch_size * 1000.0 / p50 if p50 > 0 else float("inf"),
        spread=round((p90 - p50) / p50, 4) if p50 > 0 else None,
    )
