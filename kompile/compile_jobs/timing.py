"""The benchmark stage: eager, every validated artifact and candidate, and the optional
torch.compile baseline, timed interleaved per batch size so machine noise hits all alike."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kompile.api.resource import CompiledModel
from kompile.api.status import Baseline, LatencyStats, TargetStatus, Thresholds
from kompile.compile_jobs import benchmark as bench
from kompile.compile_jobs import export, inputs, sources
from kompile.compile_jobs.backends.base import BackendError, Runner
from kompile.compile_jobs.batch_check import BatchCheck, fail_at_other_sizes
from kompile.compile_jobs.residency import UnloadedRunner
from kompile.compile_jobs.user_code import first_line

# Before each timed call the timer waits until the previous runtime's pool stops spinning (ONNX Runtime's
# ~55 ms on a 2-core EPYC, OpenVINO's under 1 ms), at most PAUSE_S: benchmarks/idle_pause.py.
PAUSE_S = 0.1
SETTLE_CALLS = 1


class StageReporter(Protocol):
    def stage(self, target: str | None, message: str) -> None: ...


@dataclass
class Timed:
    """One runtime to time: its label in the round, its runner, and the status that gets figures."""

    label: str
    runner: Runner
    status: TargetStatus
    thresholds: Thresholds | None = None
    """Its validation thresholds, to hold it to at batch sizes other than the reference's."""


def batch_feeds(cm: CompiledModel, batch: int, reference: Sequence[inputs.Feed]) -> inputs.Feed | None:
    """The reference inputs (a dataset's samples, else the generated ones validation used) at
    `batch` along the signature's batch dimension; without one, the first feed at its own batch
    (inputs.static_batch) and None at any other. Timed on other values, a model whose work
    depends on them (Silero VAD branches on its sample rate) ran another path, or failed."""
    if inputs.batch_dim(cm.spec.inputs) is None:
        return reference[0] if batch == inputs.static_batch(cm.spec.inputs) else None
    return inputs.stacked(reference, cm.spec.inputs, batch)


def run_benchmark(
    cm: CompiledModel,
    loaded: sources.LoadedSource,
    reference_runner: Runner | None,
    timed: Sequence[Timed],
    batch_sizes: Sequence[int],
    reporter: StageReporter,
    check: BatchCheck | None = None,
) -> list[Baseline]:
    """Fill each Timed's status.latency / eager_latency / speedup; return the baselines. With
    `check`, each artifact is validated at a batch size before it is timed there: one that misses
    is failed (kompile.compile_jobs.batch_check)."""
    b = cm.spec.benchmark
    if not timed:
        return []
    compiled_module = _torch_compile(loaded, cm, reporter) if b.torch_compile else None
    eager: list[LatencyStats] = []
    compiled: list[LatencyStats] = []
    own_eager: dict[str, list[LatencyStats]] = {t.label: [] for t in timed}
    # Artifacts unloaded to bound memory (kompile.compile_jobs.residency) get a round each, beside
    # eager, after the round of those that stayed loaded.
    loaded_now = [t for t in timed if not isinstance(t.runner, UnloadedRunner)]
    rounds = [[t] for t in timed if isinstance(t.runner, UnloadedRunner)]
    if loaded_now or not rounds:
        rounds.insert(0, loaded_now)
    # The check's reference inputs are what validation compared; without one (a unit's stub run),
    # generated ones.
    reference = check.reference.inputs if check else inputs.generate_feeds(cm.spec.inputs, 1, 0)
    for batch in batch_sizes:
        feed = batch_feeds(cm, batch, reference)
        if feed is None:
            continue
        for i, group in enumerate(rounds):
            with contextlib.ExitStack() as held:
                try:
                    runners = {t.label: _held(t.runner, held) for t in group}
                except (BackendError, RuntimeError, OSError) as err:
                    # Loaded once already, at validation: say why it is not timed, and go on.
                    reporter.stage(
                        group[0].label,
                        f"not timed at batch {batch}: loading it again failed: {first_line(err)}",
                    )
                    continue
                what = (
                    f"eager and {group[0].label} (loaded again for its own round)"
                    if isinstance(group[0].runner, UnloadedRunner)
                    else f"eager and {len(group)} artifact(s)"
                )
                reporter.stage(None, f"benchmarking batch {batch}: {what}")
                fns: dict[str, Callable[[], object]] = {
                    "eager": _reference_call(loaded, reference_runner, feed, cm)
                }
                if compiled_module is not None and i == 0:
                    fns["torch.compile"] = export.eager_callable(compiled_module[0], feed, cm.spec.inputs)
                for t in group:
                    runner = runners[t.label]
                    if (
                        _passed(t)
                        and _runs_at(t.label, runner, feed, batch, reporter)
                        and _holds_at(check, t, runner, batch, reporter)
                    ):
                        fns[t.label] = _runner_call(runner, feed)
                stats = _round(cm, fns, batch)
                # Nothing may hold the runner as the round ends: its memory goes before the next loads.
                fns.clear()
                runners.clear()
            if i == 0:
                eager.append(stats["eager"])
                if "torch.compile" in stats:
                    compiled.append(stats["torch.compile"])
            for t in group:
                own_eager[t.label].append(stats["eager"])
                if t.label in stats:
                    t.status.latency.append(stats[t.label])
    for t in timed:
        if not _passed(t):
            continue  # failed at a batch size: no figures
        t.status.eager_latency = own_eager[t.label]
        first = t.status.latency[0] if t.status.latency else None
        # Against eager at the same batch size, in the same round (an artifact of a static shape
        # skips the other batch sizes).
        same = next((e for e in own_eager[t.label] if first and e.batch_size == first.batch_size), None)
        if first and same:
            t.status.speedup = round(same.p50_ms / first.p50_ms, 3)
            t.status.speedup_stable = bool(same.stable and first.stable)
    baselines = [Baseline(name="eager", latency=eager)]
    if compiled_module is not None:
        baselines.append(Baseline(name="torch.compile", latency=compiled, compile_seconds=compiled_module[1]))
    return baselines


PROBE_ROUNDS = 10


def quick_speedups(
    cm: CompiledModel,
    loaded: sources.LoadedSource,
    reference_runner: Runner | None,
    runners: dict[str, Runner],
    reference: Sequence[inputs.Feed],
) -> dict[str, float]:
    """Each runner's speedup over eager in a short interleaved timing at the first benchmark batch,
    on the reference inputs: enough to tell a clear loss (the precision ladder asks it), not a
    figure to report."""
    batch = inputs.static_batch(cm.spec.inputs) or cm.spec.benchmark.batch_sizes[0]
    feed = batch_feeds(cm, batch, reference)
    if feed is None or not runners:
        return {}
    fns = {"eager": _reference_call(loaded, reference_runner, feed, cm)}
    fns |= {label: _runner_call(runner, feed) for label, runner in runners.items()}
    stats = bench.time_interleaved(
        fns, batch, 2, PROBE_ROUNDS, pause_s=PAUSE_S, settle=SETTLE_CALLS, until_idle=True
    )
    return {label: stats["eager"].p50_ms / max(stats[label].p50_ms, 1e-9) for label in runners}


def _runs_at(label: str, runner: Runner, feed: inputs.Feed, batch: int, reporter: StageReporter) -> bool:
    """Whether the artifact takes this batch: one exported at a static shape (an ExecuTorch
    program) runs only that one, and is left out of the other batch sizes' rounds."""
    try:
        runner.run(feed)
    except (BackendError, RuntimeError, ValueError) as err:
        reporter.stage(label, f"not timed at batch {batch}: {first_line(err)}")
        return False
    return True


def _passed(t: Timed) -> bool:
    """Not failed at a batch size (run_benchmark is given validated artifacts only)."""
    return t.status.validation is None or t.status.validation.passed


def _holds_at(
    check: BatchCheck | None, t: Timed, runner: Runner, batch: int, reporter: StageReporter
) -> bool:
    """Whether the artifact's outputs at this batch pass its thresholds (True where validation
    already held it: the reference batch). A miss fails the target, and it is timed no more."""
    if check is None or t.thresholds is None or not check.needs(batch):
        return True
    failures = check.failures(batch, runner, t.thresholds)
    if not failures:
        if t.status.validation is not None:
            t.status.validation.checked_at.append(f"batch {batch}")
        return True
    fail_at_other_sizes(t.status, failures)
    reporter.stage(t.label, f"failed validation at batch {batch}, not timed: {'; '.join(failures)}")
    return False


def _held(runner: Runner, stack: contextlib.ExitStack) -> Runner:
    """The runner to time: an unloaded one loaded again until the round ends."""
    return stack.enter_context(runner.loaded()) if isinstance(runner, UnloadedRunner) else runner


def _round(cm: CompiledModel, fns: dict[str, Callable[[], object]], batch: int) -> dict[str, LatencyStats]:
    # ONNX Runtime's and OpenMP's idle workers spin after a call and slow whatever runs next: before
    # each timed call the timer waits until they stop (benchmarks/idle_pause.py), and one untimed
    # call right before it wakes the runtime's own pool, as a server under load keeps it.
    b = cm.spec.benchmark
    stability = bench.Stability.for_iterations(b.iterations, b.settle_tolerance, b.max_iterations)
    return bench.time_interleaved(
        fns,
        batch,
        b.warmup,
        b.iterations,
        pause_s=PAUSE_S,
        settle=SETTLE_CALLS,
        stability=stability,
        until_idle=True,
    )


def _runner_call(runner: Runner, feed: inputs.Feed) -> Callable[[], object]:
    return bench.runner_call(runner, feed)


def _reference_call(
    loaded: sources.LoadedSource, runner: Runner | None, feed: inputs.Feed, cm: CompiledModel
) -> Callable[[], object]:
    if runner is not None:
        return lambda: runner.run(feed)
    fn: Callable[[], object] = export.eager_callable(loaded.module, feed, cm.spec.inputs)
    return fn


def _torch_compile(
    loaded: sources.LoadedSource, cm: CompiledModel, reporter: StageReporter
) -> tuple[Any, float] | None:
    import torch

    if loaded.module is None:
        return None
    reporter.stage(None, "torch.compile baseline")
    start = time.perf_counter()
    module = torch.compile(loaded.module)
    feed = inputs.generate_feeds(cm.spec.inputs, 1, 0)[0]
    export.eager_callable(module, feed, cm.spec.inputs)()  # compile happens on first call
    return module, time.perf_counter() - start
