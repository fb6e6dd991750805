"""Timing helpers: percentiles from a fake clock, rotating order, thread pinning."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from kompile.compile_jobs.benchmark import (
    QuietRounds,
    foreign_cpu_seconds,
    latency_stats,
    process_family,
    rotating_orders,
    running_threads,
    set_threads,
    time_interleaved,
    wait_until_idle,
)


class FakeClock:
    """A clock that each fake fn advances by its own cost, so latencies are exact."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def fn(self, costs_ms: list[float], calls: list[str], name: str) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            self.now += int(costs_ms[len([c for c in calls if c == name]) - 1] * 1e6)

        return run


def test_percentiles_and_throughput_from_fake_fns() -> None:
    clock = FakeClock()
    calls: list[str] = []
    # 2 warm-up calls (expensive, must not count) then 100 timed calls of 1..100 ms.
    fast = [500.0, 500.0] + [float(i) for i in range(1, 101)]
    slow = [900.0, 900.0] + [10.0 * i for i in range(1, 101)]
    fns = {"fast": clock.fn(fast, calls, "fast"), "slow": clock.fn(slow, calls, "slow")}
    stats = time_interleaved(fns, batch_size=8, warmup=2, iterations=100, clock=clock)
    assert stats["fast"].p50_ms == pytest.approx(50.5)
    assert stats["fast"].p90_ms == pytest.approx(90.1)
    assert stats["fast"].p99_ms == pytest.approx(99.01)
    assert stats["slow"].p50_ms == pytest.approx(505.0)
    assert stats["fast"].throughput == pytest.approx(8 * 1000 / 50.5)
    assert stats["fast"].batch_size == 8


def test_rounds_rotate_and_warmup_comes_first() -> None:
    calls: list[str] = []
    fns = {n: (lambda n=n: calls.append(n)) for n in ("a", "b", "c")}
    time_interleaved(fns, batch_size=1, warmup=1, iterations=3)
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_pause_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    calls: list[str] = []
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # a slow pause: it must not show in the latency
        sleeps.append(seconds)
        clock.now += 10**9

    monkeypatch.setattr("kompile.compile_jobs.benchmark.time.sleep", sleep)
    stats = time_interleaved({"a": clock.fn([2.0] * 4, calls, "a")}, 1, 0, 4, clock=clock, pause_s=0.01)
    assert sleeps == [0.01] * 4
    assert stats["a"].p50_ms == pytest.approx(2.0)


@pytest.fixture
def spinner() -> Iterator[Callable[[float], subprocess.Popen[bytes]]]:
    """A child process that keeps a core busy for `seconds`, as a runtime's pool spins after a call
    in a backend's own environment."""
    children: list[subprocess.Popen[bytes]] = []

    def start(seconds: float) -> subprocess.Popen[bytes]:
        code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
        child = subprocess.Popen([sys.executable, "-c", code])
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread states from Linux's /proc")
def test_the_pause_lasts_while_a_child_spins_and_ends_when_it_stops(
    spinner: Callable[[float], subprocess.Popen[bytes]],
) -> None:
    child = spinner(0.6)
    time.sleep(0.1)  # started and spinning (its interpreter is up)
    family = process_family()
    assert family is not None and os.getpid() in family and child.pid in family
    assert running_threads(family) >= 1
    start = time.perf_counter()
    waited = wait_until_idle(5.0, family)
    assert child.poll() is not None or running_threads(family) == 0  # it ended or stopped spinning
    assert 0.3 < waited < 2.0 and time.perf_counter() - start == pytest.approx(waited, abs=0.05)
    # Nothing running now: the next pause is over at once, not after a fixed sleep.
    assert wait_until_idle(5.0, process_family()) < 0.05


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread states from Linux's /proc")
def test_the_pause_is_bounded_when_something_never_stops(
    spinner: Callable[[float], subprocess.Popen[bytes]],
) -> None:
    spinner(30.0)
    time.sleep(0.1)
    start = time.perf_counter()
    assert wait_until_idle(0.2, process_family()) == pytest.approx(0.2, abs=0.05)
    assert time.perf_counter() - start < 0.5


def test_without_proc_the_pause_is_the_fixed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("kompile.compile_jobs.benchmark.time.sleep", sleeps.append)
    assert wait_until_idle(0.05, None) == 0.05 and sleeps == [0.05]


def test_until_idle_waits_before_each_timed_call_pause_s_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr("kompile.compile_jobs.benchmark.process_family", lambda: [os.getpid()])
    monkeypatch.setattr(
        "kompile.compile_jobs.benchmark.wait_until_idle", lambda cap, family: waits.append(cap) or 0.0
    )
    calls: list[str] = []
    fns = {n: (lambda n=n: calls.append(n)) for n in ("a", "b")}
    time_interleaved(fns, 1, 0, 3, pause_s=0.1, until_idle=True)
    assert waits == [0.1] * 6 and len(calls) == 6


def test_disturbed_rounds_are_dropped_whole() -> None:
    clock = FakeClock()
    calls: list[str] = []
    # The probe is read before and after each round; rounds 2 and 4 see other processes at work.
    readings = iter([0, 0, 0, 5, 5, 5, 5, 9, 9, 9])
    quiet = QuietRounds(max_foreign_cores=0.5, probe=lambda: float(next(readings)))
    fns = {"a": clock.fn([1.0, 2.0, 3.0, 4.0, 5.0], calls, "a")}
    stats = time_interleaved(fns, 1, 0, 3, clock=clock, quiet=quiet)
    assert quiet.discarded == 2
    assert stats["a"].p50_ms == pytest.approx(3.0)  # rounds 1, 3 and 5 kept
    assert len(calls) == 5


def test_quiet_rounds_give_up_and_keep_the_least_disturbed() -> None:
    clock = FakeClock()
    calls: list[str] = []
    readings = iter(range(0, 1000, 1))  # every round disturbed alike
    quiet = QuietRounds(max_foreign_cores=0.0, max_rounds_factor=2.0, probe=lambda: float(next(readings)))
    time_interleaved({"a": clock.fn([1.0] * 10, calls, "a")}, 1, 0, 3, clock=clock, quiet=quiet)
    assert len(calls) == 6 and quiet.discarded == 3


def test_foreign_cpu_probe_reads_linux_counters() -> None:
    value = foreign_cpu_seconds()
    assert value is None or value >= 0.0


def test_rotating_orders_lead_equally() -> None:
    orders = rotating_orders(["x", "y"], 4)
    assert [o[0] for o in orders] == ["x", "y", "x", "y"]
    assert rotating_orders([], 3) == []


def test_latency_stats_single_sample() -> None:
    s = latency_stats([2_000_000], batch_size=1)
    assert s.p50_ms == s.p90_ms == s.p99_ms == 2.0
    assert s.throughput == pytest.approx(500.0)


def test_iterations_must_be_positive() -> None:
    with pytest.raises(ValueError):
        time_interleaved({"a": lambda: None}, batch_size=1, warmup=0, iterations=0)


def test_set_threads_pins_torch_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert set_threads(1) == 1
        assert torch.get_num_threads() == 1
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert set_threads() >= 1
    finally:
        torch.set_num_threads(before)


def test_timing_goes_on_until_figures_settle_and_marks_those_that_never_do() -> None:
    from kompile.compile_jobs.benchmark import Stability

    clock = FakeClock()
    calls: list[str] = []
    steady = [1.0] * 200
    # A busy neighbour: windows of 5 calls alternate between 1 ms and 3 ms, never agreeing.
    noisy = [1.0 if (i // 5) % 2 == 0 else 3.0 for i in range(200)]
    # Disturbed at first, then quiet: settles once three windows agree.
    late = [9.0] * 5 + [2.0] * 195
    fns = {n: clock.fn(c, calls, n) for n, c in (("steady", steady), ("noisy", noisy), ("late", late))}
    stability = replace(Stability.for_iterations(10, tolerance=0.1, max_iterations=40), probe=lambda: None)
    assert (stability.window, stability.max_rounds) == (4, 40)
    stats = time_interleaved(fns, batch_size=1, warmup=0, iterations=10, clock=clock, stability=stability)
    assert calls.count("noisy") == 40  # it never settled: timed up to the bound
    assert stats["noisy"].stable is False
    # Each check that failed is named with its figures: the windows disagree, and its calls run at
    # the two speeds of the neighbour's phases.
    assert stats["noisy"].unsettled == (
        "its last 3 windows' medians differed by 100% (settleTolerance 10%); "
        "its calls ran at two speeds (p10 1, p50 3, p90 3 ms)"
    )
    assert stats["steady"].unsettled is None and stats["late"].unsettled is None
    assert stats["steady"].stable is True and stats["steady"].p50_ms == pytest.approx(1.0)
    assert stats["steady"].spread == 0.0
    assert stats["late"].stable is True and stats["late"].p50_ms == pytest.approx(2.0)  # last two windows


def test_a_steady_machine_times_no_more_rounds_than_asked() -> None:
    from kompile.compile_jobs.benchmark import Stability

    clock = FakeClock()
    calls: list[str] = []
    fns = {n: clock.fn([1.0] * 100, calls, n) for n in ("a", "b")}
    stability = replace(Stability.for_iterations(20, 0.1, None), probe=lambda: None)
    stats = time_interleaved(fns, 1, 0, 20, clock=clock, stability=stability)
    assert stats["a"].stable is True and calls.count("a") == 21  # three windows of 7: about as asked


def test_a_steadily_busy_machine_is_not_called_stable() -> None:
    """A neighbour that keeps one core busy slows every window alike: the medians agree, but the
    figure is not a quiet machine's, so it is marked (and timed up to the bound)."""
    from kompile.compile_jobs.benchmark import Stability

    clock = FakeClock()
    calls: list[str] = []
    fns = {"a": clock.fn([1.0] * 100, calls, "a")}
    foreign = iter(range(0, 10**6))  # another process: one more CPU second at every look

    def busy_probe() -> float:
        return float(next(foreign))

    stability = replace(Stability.for_iterations(6, 0.1, 12), probe=busy_probe)
    stats = time_interleaved(fns, 1, 0, 6, clock=clock, stability=stability)
    assert stats["a"].stable is False and calls.count("a") == 12
    assert stats["a"].busy_cores is not None and stats["a"].busy_cores > 0.5
    assert stats["a"].unsettled is not None and stats["a"].unsettled.startswith("other processes kept ")
    assert stats["a"].unsettled.endswith(" cores busy (a quiet machine: 0.5)")


def test_a_runtime_flipping_between_two_speeds_is_not_stable() -> None:
    """Windows can agree by chance on a bimodal runtime (a GRU waking its threads): its p90 at
    several times its p50 marks it anyway."""
    from kompile.compile_jobs.benchmark import Stability

    clock = FakeClock()
    calls: list[str] = []
    flips = [1.0 if i % 4 else 4.0 for i in range(200)]  # every fourth call 4x slower, steadily
    fns = {"a": clock.fn(flips, calls, "a")}
    stability = replace(Stability.for_iterations(12, 0.1, 24), probe=lambda: None)
    stats = time_interleaved(fns, 1, 0, 12, clock=clock, stability=stability)
    assert stats["a"].p50_ms == 1.0 and stats["a"].p90_ms == 4.0 and stats["a"].stable is False
    assert stats["a"].unsettled == "its calls ran at two speeds (p10 1, p50 1, p90 4 ms)"


def test_a_runtime_mostly_in_its_slow_mode_is_not_stable_either() -> None:
    """Most calls slow, a few fast (a GRU whose worker thread usually sleeps): the median sits on
    the slow mode and the windows agree; the fast calls far below it mark the figure."""
    from kompile.compile_jobs.benchmark import Stability

    clock = FakeClock()
    calls: list[str] = []
    mostly_slow = [0.4 if i % 4 == 0 else 4.0 for i in range(200)]
    fns = {"a": clock.fn(mostly_slow, calls, "a")}
    stability = replace(Stability.for_iterations(12, 0.1, 24), probe=lambda: None)
    stats = time_interleaved(fns, 1, 0, 12, clock=clock, stability=stability)
    assert stats["a"].p50_ms == 4.0 and stats["a"].stable is False
    assert stats["a"].unsettled == "its calls ran at two speeds (p10 0.4, p50 4, p90 4 ms)"
