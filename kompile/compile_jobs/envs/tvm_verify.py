"""The shared database's best schedules re-measured on this node before a build (the `tvm`
environment's steps, kompile.compile_jobs.envs.tvm): for each kernel of the model, its `k` best
distinct records are built and timed here in interleaved rounds, and the fastest is applied.

Why: a record's time is one measurement, taken on whichever node of the class tuned it. On 2-core
AMD EPYC (Zen 3, AVX2) VMs, the database of an earlier session's tuning ranked ResNet-50's 3x3
128-channel kernel's two best schedules 1.254 and 1.258 ms; re-measured a day later on another such
node they took 1.81 and 1.36 ms (3.99 and 2.70 ms on one thread), and its 1x1 256->1024 kernel's
third best ran at 1.29 ms where it had recorded 0.58. A hardware class names an ISA, not a
microarchitecture or a host's neighbours, and the best of thousands of noisy measurements is the
luckiest of them; the node that builds is the one the artifact runs on.

Imports only the standard library and this environment's packages.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from kompile.compile_jobs.envs import tvm_tuning

ROUNDS = 5
"""Interleaved rounds: each times every candidate of a kernel once, in a rotated order, so that a
node's drift (a neighbour's load, the clock) falls on all of them; the median of its rounds counts."""
REPEATS = 10
"""Calls per round, each after the kernel's weights and output were flushed from the caches (its input
left warm), as a model runs it: the previous kernel just wrote its input, its weights were last read
a whole model call ago."""


@dataclass
class VerifyStats:
    candidates: int = 0
    """Most records re-measured per kernel (the `tuningVerify` option)."""
    kernels: int = 0
    """Kernels with two or more distinct records in the database, re-measured."""
    changed: int = 0
    """Of those, the kernels whose fastest here was not the database's best."""
    saved_ms: float = 0.0
    """One model call's time saved by the changes, as re-measured here (each kernel's calls counted)."""
    failed: int = 0
    """Candidates that did not build or run here (left out of the choice)."""
    seconds: float = 0.0

    def record(self) -> dict[str, str]:
        return {
            "tuningVerifyCandidates": str(self.candidates),
            "tuningVerifiedKernels": str(self.kernels),
            "tuningVerifyChanged": str(self.changed),
            "tuningVerifySavedMs": f"{self.saved_ms:.3f}",
            "tuningVerifyFailed": str(self.failed),
            "tuningVerifySeconds": f"{self.seconds:.1f}",
        }


def distinct_top(database: Any, task: Any, k: int) -> list[Any]:
    """The task's `k` best records with distinct schedules (a merged database may hold one schedule
    measured twice)."""
    seen: set[str] = set()
    out = []
    for record in tvm_tuning._top(database, task, 4 * k):
        key = tvm_tuning.trace_key(record.trace)
        if key not in seen:
            seen.add(key)
            out.append(record)
        if len(out) == k:
            break
    return out


Ranking = list[tuple[Any, list[Any]]]
"""Each task of a module and its records, fastest first as re-measured here (`verified_ranking`)."""


def database_of(ranking: Ranking, picks: list[int] | None = None) -> Any:
    """A database holding, for each ranked task, its record at `picks[i]` (its last where it has
    fewer; its first where `picks` is None): what the build applies."""
    from tvm.s_tir import meta_schedule as ms

    database = ms.database.MemoryDatabase(module_equality="structural")
    for i, (task, records) in enumerate(ranking):
        if records:
            record = records[min(picks[i] if picks else 0, len(records) - 1)]
            workload = database.commit_workload(task.dispatched[0])
            database.commit_tuning_record(
                ms.database.TuningRecord(
                    record.trace, workload, record.run_secs, record.target, record.args_info
                )
            )
    return database


def ranked(times: list[list[float]]) -> list[int]:
    """The candidates that ran, by their median time (the database's order breaks ties)."""
    ran = [c for c, t in enumerate(times) if t]
    return sorted(ran, key=lambda c: (statistics.median(times[c]), c))


def verified_ranking(
    tasks: list[Any], target: Any, database: Any, k: int, cores: int
) -> tuple[Ranking, VerifyStats]:
    """Each of the `tasks` (a module's kernels) and its `k` best records in `database`, fastest here
    first (its best as recorded alone where `k` < 2 or none of its candidates ran here; none where the
    database lacks it). Its first is what the build applies (`database_of`)."""
    start = time.monotonic()
    stats = VerifyStats(candidates=k)
    ranking: Ranking = []
    contested: list[int] = []
    for task in tasks:
        records = distinct_top(database, task, max(1, k))
        if len(records) > 1:
            contested.append(len(ranking))
        ranking.append((task, records))
    if contested:
        os.environ["TVM_NUM_THREADS"] = str(cores)  # the runner's worker inherits it
        tvm_tuning.load_cpu_intrinsics(str(target.kind.name), str(target.attrs.get("mtriple", "")))
        times = _measure([ranking[i] for i in contested], target, cores, stats)
        for i, per in zip(contested, times, strict=True):
            task, records = ranking[i]
            order = ranked(per) or [0]
            ranking[i] = (task, [records[c] for c in order])
            stats.kernels += 1
            if order[0] > 0:
                stats.changed += 1
                saved = statistics.median(per[0]) - statistics.median(per[order[0]]) if per[0] else 0.0
                stats.saved_ms += max(0.0, saved) * 1e3 * max(1, int(task.weight))
    stats.seconds = time.monotonic() - start
    return ranking, stats


def _measure(
    contested: list[tuple[Any, list[Any]]], target: Any, cores: int, stats: VerifyStats
) -> list[list[list[float]]]:
    """Each candidate's times here (seconds, one per round; none where it failed to build or run):
    all candidates built at once by MetaSchedule's builder, then each kernel's timed in rounds."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    mods, owners = [], []
    for t, (task, records) in enumerate(contested):
        for c, record in enumerate(records):
            sch = tvm.s_tir.Schedule(task.dispatched[0])
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            mods.append(sch.mod)
            owners.append((t, c))
    builder = ms.builder.LocalBuilder(
        max_workers=cores, timeout_sec=tvm_tuning.builder_timeout(cores), f_build=tvm_tuning.build
    )
    times: list[list[list[float]]] = [[[] for _ in records] for _, records in contested]
    config = ms.runner.EvaluatorConfig(number=1, repeat=REPEATS, min_repeat_ms=0, enable_cpu_cache_flush=True)
    runner = ms.runner.LocalRunner(timeout_sec=60, evaluator_config=config)
    device = "cpu"  # verify runs on llvm targets only (the runner takes a device, not a target kind)
    with tvm_tuning.built(builder, mods, target) as paths:
        artifacts = {owner: path for owner, path in zip(owners, paths, strict=True) if path is not None}
        stats.failed += len(owners) - len(artifacts)
        for t, (_, records) in enumerate(contested):
            alive = [c for c in range(len(records)) if (t, c) in artifacts]
            if not alive:
                continue
            for r in range(ROUNDS):
                order = alive[r % len(alive) :] + alive[: r % len(alive)]
                runs = [ms.runner.RunnerInput(artifacts[(t, c)], device, records[c].args_info) for c in order]
                for c, future in zip(order, runner.run(runs), strict=True):
                    result = future.result()
                    if result.error_msg is None and result.run_secs:
                        times[t][c].append(statistics.median(float(s) for s in result.run_secs))
            for c in alive:
                if not times[t][c]:
                    stats.failed += 1
    return times
