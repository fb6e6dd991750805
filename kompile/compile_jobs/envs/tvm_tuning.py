"""MetaSchedule tuning for the `tvm` environment's steps (kompile.compile_jobs.envs.tvm): the tasks of
a Relax module tuned into a JSON database (workloads + tuning records) that the pipeline shares per
hardware class, bounded by a trial budget and a time budget, sized for small machines.

What was measured on 2 loaded cores (TVM 0.27, apache-tvm-ffi 0.1.14.post0) shaped it:
- the stock builder's first build in each worker imports `tvm.s_tir.tensor_intrin`, parsing ~500
  TVMScript intrinsics through `inspect.stack()`: 20 s per worker, and the builder starts fresh
  workers for every batch, so every candidate ran into the 30 s default timeout. `build` here is
  the stock build without that import (an fp32 CPU schedule never tensorizes with them; a traced
  schedule is already applied when it reaches the builder);
- MetaSchedule has no time budget, and terminating tasks from a measure callback races the
  scheduler's own termination (InternalError "!task->is_terminated"): the budget is kept by tuning
  in rounds (each task one batch per round) with one cost model kept across rounds.

Tasks whose workload already has a record in the database are not tuned again (`scope` "missing"):
the fleet tunes each operator shape once. With `scope` "all" a compile spends its budget on every task
of the model, the ones that cost most in it first, each search starting from the database's best: a
class's schedules keep improving over later compiles (ResNet-50's convolutions got 64-128 trials each
in a first 30-minute tuning on 2 cores, and their best was still falling). Imports only the standard
library and this environment's packages.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kompile.compile_jobs.env_protocol import progress

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
PROGRESS_SECONDS = 20.0
"""At most one progress line per this many seconds: a 30-minute tuning says where it is about 90
times, in a Job's log as on the terminal."""


@dataclass
class Progress:
    """The tuning's progress lines (kompile.compile_jobs.env_protocol.progress), throttled."""

    total_trials: int
    minutes: float
    start: float = field(default_factory=time.monotonic)
    last: float = float("-inf")

    def __call__(self, tasks: int, trials: int, rounds: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        progress(
            f"tuning {tasks} kernels: round {max(rounds, 1)}, {trials} of {self.total_trials} trials, "
            f"{(now - self.start) / 60:.0f} of {self.minutes:g} minutes"
        )


def build(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's default build without importing tvm.s_tir.tensor_intrin (see the module's
    note): runs in the builder's worker processes, which import this module by name."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


@dataclass
class Budget:
    trials: int
    """Measured candidates in all, over the tasks not yet in the database; 0: no tuning."""
    minutes: float
    """Wall-clock bound of the tuning; checked between rounds."""
    cores: int
    per_batch: int = 64
    """Most candidates measured per task and round: each batch costs one evolutionary search
    (seconds whatever the batch), so larger batches measure more candidates per minute."""
    scope: str = "missing"
    """missing: only the tasks the database lacks; all: every task, by its time in the model."""
    verify: int = 8
    """Best records per kernel re-measured on this node before the build (tvm_verify); < 2: none."""
    in_model: int = 0
    """Of those, the fastest few per kernel then compared in the model (tvm_inmodel); < 2: none."""
    templates: bool = True
    """Offer the register-blocked convolution schedules (tvm_templates) as candidates."""
    pick_builds: int = 0
    """Whole-model builds timed after the tuning to pick the Winograd convolutions (`winograd: auto`,
    tvm_winograd_pick): 2 where the model has convolutions to pick, else 0."""


SCOPES = ("missing", "all")


def budget_from(options: dict[str, str], cores: int) -> Budget:
    """The budget the step's options name (`tuningTrials`, `tuningMinutes`, `tuningScope`)."""
    scope = options.get("tuningScope", "missing") or "missing"
    if scope not in SCOPES:
        raise ValueError(f"tuningScope must be one of {', '.join(SCOPES)}, not {scope!r}")
    return Budget(
        trials=int(options.get("tuningTrials", "0") or 0),
        minutes=float(options.get("tuningMinutes", "30") or 30),
        cores=cores,
        scope=scope,
        verify=int(options.get("tuningVerify", "8") or 0),
        in_model=int(options.get("tuningInModel", "0") or 0),
        templates=(options.get("tuningTemplates", "register-blocked") or "register-blocked") != "none",
    )


@dataclass
class TuneStats:
    tasks: int = 0
    """Tuning tasks of the model (distinct fused kernels)."""
    reused: int = 0
    """Tasks whose best schedule was already in the database (the shared database's hits)."""
    refined: int = 0
    """Of those, the tasks measured again now (scope "all")."""
    tuned: int = 0
    """Tasks that got their first record now (the time budget may stop before every task had one)."""
    trials: int = 0
    """Candidates measured now (records added)."""
    records_before: int = 0
    records_after: int = 0
    seconds: float = 0.0
    stopped_by_time: bool = False
    rounds: int = 0
    scope: str = "missing"
    templates: int = 0
    """Register-blocked convolution schedules measured now (tvm_templates); not in `trials`."""
    templates_best: int = 0
    """Tasks whose best record is now one of those schedules."""
    verified: dict[str, str] = field(default_factory=dict)
    """What re-measuring the database's best on this node did (tvm_verify's record); empty: not run."""
    in_model: dict[str, str] = field(default_factory=dict)
    """What ranking those by their time in the model did (tvm_inmodel's record); empty: not run."""

    def record(self) -> dict[str, str]:
        hit = self.reused / self.tasks if self.tasks else 0.0
        return (
            self.verified
            | self.in_model
            | {
                "tuningTasks": str(self.tasks),
                "tuningTasksFromDatabase": str(self.reused),
                "tuningDatabaseHitRate": f"{hit:.2f}",
                "tuningTasksTuned": str(self.tuned),
                "tuningTasksRefined": str(self.refined),
                "tuningTrialsRun": str(self.trials),
                "tuningRecordsBefore": str(self.records_before),
                "tuningRecordsAfter": str(self.records_after),
                "tuningSeconds": f"{self.seconds:.1f}",
                "tuningStoppedByTime": str(self.stopped_by_time).lower(),
                "tuningRounds": str(self.rounds),
                "tuningScope": self.scope,
                "tuningTemplatesMeasured": str(self.templates),
                "tuningTemplatesBest": str(self.templates_best),
            }
        )


def open_database(folder: Path) -> Any:
    from tvm.s_tir import meta_schedule as ms

    folder.mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(
        str(folder / WORKLOADS), str(folder / RECORDS), allow_missing=True, module_equality="structural"
    )


def _top(database: Any, task: Any, k: int) -> list[Any]:
    """The task's `k` best valid tuning records in the database (none where it lacks the task)."""
    mod = task.dispatched[0]
    if not database.has_workload(mod):
        return []
    return list(database.get_top_k(database.commit_workload(mod), k))


def trace_key(trace: Any) -> str:
    """A schedule's identity across databases: its trace as Python. The JSON form (`as_json`) of a
    trace read back from a database's file differs from the same schedule's fresh one."""
    return str(trace)


def _best_record(database: Any, task: Any) -> Any:
    """The task's best tuning record in the database, or None."""
    top = _top(database, task, 1)
    return top[0] if top else None


def has_record(database: Any, task: Any) -> bool:
    """Whether the database holds a valid record of the task (a schedule that ran)."""
    return bool(_top(database, task, 1))


def distinct_tasks(extracted: list[list[Any]]) -> list[Any]:
    """The tasks of several builds of one model, each workload once (the first task found for it):
    MetaSchedule extracts each build's tasks apart, and kernels the builds share are one workload."""
    from tvm.s_tir import meta_schedule as ms

    seen = ms.database.MemoryDatabase(module_equality="structural")
    workloads: list[Any] = []
    out: list[Any] = []
    for tasks in extracted:
        for task in tasks:
            workload = seen.commit_workload(task.dispatched[0])
            if not any(w.same_as(workload) for w in workloads):
                workloads.append(workload)
                out.append(task)
    return out


def _trials_of(database: Any, task: Any) -> int:
    """The task's valid records in the database (its measured candidates that ran)."""
    return len(_top(database, task, 1 << 30))


def tune(tasks: list[Any], target: Any, database: Any, budget: Budget, logs: Path) -> TuneStats:
    """Tune the `tasks` (MetaSchedule's extracted tasks of a module) that the database lacks (or, with
    scope "all", every task), into the database, within the budget."""
    from tvm.s_tir import meta_schedule as ms

    start = time.monotonic()
    stats = TuneStats(tasks=len(tasks), records_before=len(database), scope=budget.scope)
    # Each task's valid records now: whether the database knows it, and later whether it got more.
    before = {id(t): _trials_of(database, t) for t in tasks}
    stats.reused = sum(1 for t in tasks if before[id(t)])
    todo = list(tasks) if budget.scope == "all" else [t for t in tasks if not before[id(t)]]
    if budget.trials <= 0 or not todo:
        stats.records_after, stats.seconds = len(database), time.monotonic() - start
        return stats
    os.environ["TVM_NUM_THREADS"] = str(budget.cores)  # the runner's workers inherit it
    load_cpu_intrinsics(str(target.kind.name), str(target.attrs.get("mtriple", "")))
    # First round: heaviest first, trials in proportion to each task's share of the model's FLOPs
    # (a ResNet-50's pools and adds need a handful; its convolutions hundreds), at least one small
    # batch each, so that every task has a schedule before the heavy ones get their second batch;
    # later rounds by each task's measured time (below).
    weighed = sorted(((task_flops(t), t) for t in todo), key=lambda pair: pair[0], reverse=True)
    todo = [t for _, t in weighed]
    allotted = allot_trials([f for f, _ in weighed], budget.trials, MIN_TRIALS)
    spent = [0] * len(todo)
    builder = ms.builder.LocalBuilder(
        max_workers=budget.cores, timeout_sec=builder_timeout(budget.cores), f_build=build
    )
    runner = runner_for(target)
    cost_model = ms.cost_model.XGBModel(num_tuning_cores=budget.cores)
    # The re-measuring of the best schedules after the tuning (tvm_verify) is paid from the same
    # minutes, so that a compile keeps to its budget.
    deadline = start + budget.minutes * 60 - verify_reserve(len(tasks), budget, str(target.kind.name))
    tell = Progress(budget.trials, budget.minutes, start)
    tell(len(todo), 0, 0, force=True)
    offered: dict[int, set[str]] = {}
    if budget.templates and str(target.kind.name) == "llvm":
        # The register-blocked convolution schedules first: measured like a batch, they give each
        # convolution a good record before the search (which starts from the database's best).
        from kompile.compile_jobs.envs import tvm_templates

        offered = tvm_templates.seed(todo, database, target, builder, runner, deadline, budget.trials)
        stats.templates = len(database) - stats.records_before
    # Where some tasks already have records (scope "all"), even the first round goes by time.
    by_time = any(before[id(t)] for t in todo)
    while stats.trials < budget.trials:
        if stats.rounds or by_time:
            # Every task has been measured: the trials left follow each task's time in the model
            # now, not its FLOPs. A ResNet-50 max pool whose first 8 candidates took 0.68 ms (its
            # FLOPs gave it no more) gets its next batch and runs in 0.03 ms.
            times = [task_time(database, t) for t in todo]
            allotted = reallot(spent, times, budget.trials - stats.trials, MIN_TRIALS)
        pending = [i for i in range(len(todo)) if spent[i] < allotted[i]]
        if not pending:
            break
        if stats.rounds or by_time:
            pending.sort(key=lambda i: times[i], reverse=True)
        stats.rounds += 1
        round_start = stats.trials
        # A round: every unfinished task, one batch each, heaviest first; the time budget is
        # checked before each task's batch (a batch takes seconds to a minute on 2 cores).
        for i in pending:
            if time.monotonic() >= deadline:
                stats.stopped_by_time = True
                break
            batch = min(budget.per_batch, allotted[i] - spent[i], budget.trials - stats.trials)
            if batch <= 0:
                break
            _tune_one(todo[i], batch, logs, builder, runner, database, cost_model, budget.cores)
            spent[i] += batch
            stats.trials = len(database) - stats.records_before - stats.templates
            tell(len(todo), stats.trials, stats.rounds)
        # A task's small search space can run dry (MetaSchedule then measures fewer candidates
        # than asked): a round that records nothing new ends the tuning.
        if stats.stopped_by_time or stats.trials == round_start:
            break
    after = {id(t): _trials_of(database, t) for t in todo}
    stats.templates_best = sum(
        1
        for t in todo
        if (best := _best_record(database, t)) and trace_key(best.trace) in offered.get(id(t), ())
    )
    stats.tuned = sum(1 for t in todo if before[id(t)] == 0 < after[id(t)])
    stats.refined = sum(1 for t in todo if 0 < before[id(t)] < after[id(t)])
    stats.records_after, stats.seconds = len(database), time.monotonic() - start
    return stats


def runner_for(target: Any) -> Any:
    """MetaSchedule's runner: each candidate measured on the target's device in a worker process,
    which on a GPU class prepares CUDA as the `load` step does (kompile.compile_jobs.envs.tvm_cuda)."""
    from tvm.s_tir import meta_schedule as ms

    config = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=50)
    if str(target.kind.name) == "cuda":
        from kompile.compile_jobs.envs import tvm_cuda

        return ms.runner.LocalRunner(
            timeout_sec=60, evaluator_config=config, initializer=tvm_cuda.runner_worker
        )
    return ms.runner.LocalRunner(timeout_sec=60, evaluator_config=config)


VERIFY_SECONDS = 0.75
"""A candidate's build and interleaved timing in tvm_verify on 2 cores (ResNet-50's 28 kernels x 8
candidates: 167 s)."""


def verifies(kind: str, budget: Budget) -> bool:
    """Whether the build re-measures the database's best schedules (tvm_verify): on CPUs (`llvm`)
    with two or more candidates a kernel; on GPUs each record is applied as measured."""
    return kind == "llvm" and budget.verify > 1


IN_MODEL_SECONDS = 0.25
"""A task's share of one whole-model build and its timing in tvm_inmodel or tvm_winograd_pick, per
build, on 2 cores (ResNet-50's 30 tasks, 2 ranks: 14.6 s on an AVX-512 EPYC)."""


def verify_reserve(tasks: int, budget: Budget, kind: str) -> float:
    """Seconds of the tuning's time budget kept for re-measuring its best schedules, ranking them in
    the model and timing the Winograd pick's builds: at most a quarter."""
    measured = verifies(kind, budget)
    builds = budget.pick_builds + (budget.in_model if measured and budget.in_model > 1 else 0)
    verify = tasks * budget.verify * VERIFY_SECONDS * 2 / max(2, budget.cores) if measured else 0.0
    return min(budget.minutes * 15.0, verify + tasks * builds * IN_MODEL_SECONDS)


MIN_TRIALS = 8
"""Trials of the lightest tasks (elementwise ops, pools): enough for a vectorized schedule."""


def task_flops(task: Any) -> float:
    """The task's floating-point work in the model: one call's FLOPs times its calls."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(task.dispatched[0])) * max(1, int(task.weight))
    except Exception:  # noqa: BLE001 - an op TVM cannot count still gets its minimum
        return 0.0


def allot_trials(flops: list[float], trials: int, least: int) -> list[int]:
    """Each task's trials: `least` each, the rest of the budget in proportion to its FLOPs."""
    floor = [min(least, trials) for _ in flops]
    rest = max(0, trials - sum(floor))
    total = sum(flops) or 1.0
    return [f + int(rest * w / total) for f, w in zip(floor, flops, strict=True)]


def task_time(database: Any, task: Any) -> float:
    """The task's time in one call of the model: its best measured kernel times its calls (0.0
    before it has a valid record)."""
    best = _best_record(database, task)
    if best is None or not best.run_secs:
        return 0.0
    secs = [float(s) for s in best.run_secs]
    return sum(secs) / len(secs) * max(1, int(task.weight))


def reallot(spent: list[int], times: list[float], left: int, least: int) -> list[int]:
    """Each task's allotment for the trials `left`: what it has spent plus its share of them by its
    time in the model; a share under `least` (too small for a useful batch) is dropped unless every
    share is (then the slowest task gets them all), and a task with no valid record yet counts as the
    slowest one."""
    slowest = max(times, default=0.0)
    weights = [t if t > 0 else slowest for t in times]
    total = sum(weights)
    if total <= 0 or left <= 0:
        return list(spent)
    shares = [int(left * w / total) for w in weights]
    if all(share < least for share in shares):
        # A budget too small to split into useful batches goes to the slowest task whole (a
        # refining compile with a few dozen trials and several tasks would otherwise measure none).
        heaviest = weights.index(max(weights))
        return [s + (left if i == heaviest else 0) for i, s in enumerate(spent)]
    return [s + (share if share >= least else 0) for s, share in zip(spent, shares, strict=True)]


def _tune_one(
    task: Any, batch: int, logs: Path, builder: Any, runner: Any, database: Any, cost_model: Any, cores: int
) -> None:
    """One batch of one task. MetaSchedule has no time budget, and terminating tasks from a measure
    callback races the scheduler's own termination, so the budget is kept between batches; the
    cost model is shared across them, and the search restarts from the database's best."""
    from tvm.s_tir import meta_schedule as ms

    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [task],
        str(logs),
        strategy=ms.search_strategy.EvolutionarySearch(
            population_size=search_population(batch), genetic_num_iters=GENETIC_ITERS
        ),
        num_threads=cores,
    )
    ms.tune_tasks(
        tasks=contexts,
        task_weights=weights,
        work_dir=str(logs),
        max_trials_global=batch,
        max_trials_per_task=batch,
        num_trials_per_iter=batch,
        builder=builder,
        runner=runner,
        database=database,
        cost_model=cost_model,
        task_scheduler="round-robin",
    )


GENETIC_ITERS = 2
"""Evolution rounds of each batch's search (MetaSchedule's default: 4)."""


def search_population(batch: int) -> int:
    """The evolutionary search's population for a batch of `batch` candidates. Its default (512,
    evolved 4 times) took ~20 s of every 25-30 s batch of 32 on 2 cores, the measuring the rest;
    4x the batch, at most 256, evolved twice, measures twice the candidates per minute, and in a
    150 s-per-task A/B on ResNet-50's three heaviest convolutions it reached 197, 211 and 199
    GFLOP/s where the default reached 188, 188 and 199."""
    return min(256, max(64, 4 * batch))


def load_cpu_intrinsics(kind: str, mtriple: str) -> None:
    """Register only the CPU tensor intrinsics the target can use before MetaSchedule imports
    `tvm.s_tir.tensor_intrin`: that package parses every intrinsic (CUDA's, ROCm's, Hexagon's...)
    as TVMScript at import, 20 s on a free core and 100 s on 2 loaded ones; x86's alone take 0.7 s."""
    import importlib
    import importlib.util
    import sys
    import types

    import tvm.s_tir

    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules or kind != "llvm":
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__, package.__package__ = spec, name
    sys.modules[name] = package
    tvm.s_tir.tensor_intrin = package
    importlib.import_module(f"{name}.{'arm_cpu' if mtriple.startswith('aarch64') else 'x86'}")


@contextmanager
def built(builder: Any, mods: list[Any], target: Any) -> Iterator[list[str | None]]:
    """Each module built by MetaSchedule's `builder` for `target` (outside a search: the templates,
    the re-measuring): its artifact's path, None where the build failed; the artifacts removed on
    leaving, whatever happened."""
    from tvm.s_tir import meta_schedule as ms

    results = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    try:
        yield [r.artifact_path if r.error_msg is None and r.artifact_path else None for r in results]
    finally:
        for result in results:
            if result.artifact_path:
                shutil.rmtree(Path(result.artifact_path).parent, ignore_errors=True)


def builder_timeout(cores: int) -> float:
    """A candidate's build: about a second on a free core; generous where cores are few and shared."""
    return 60.0 if cores >= 8 else 120.0
