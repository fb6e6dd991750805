"""Each kernel's re-measured best schedules ranked by their time in the model (the `tvm` environment's
steps, kompile.compile_jobs.envs.tvm): after tvm_verify has ranked each kernel's best records alone,
the model is built `variants` times, variant j with every kernel's j-th of that ranking; the variants
run in this process in interleaved rounds, each kernel call timed by the VM's instrument, and each
kernel keeps the record whose calls took least time in the model.

Why: a kernel timed alone, flushed or warm, is not the kernel in the model. There its input was just
written by the kernel before it, its output is read by the next, and its weights were last read a whole
call ago. Found on a 2-core AMD EPYC (Zen 3, AVX2; 2026-11-28): layer 4's stride-2 1024->2048
downsample's pick re-measured with the caches flushed ran 1.47 ms in the model against 1.25 for the
pick re-measured warm, while layer 1's 64->256 residual kernel went the other way (2.86 flushed pick
against 3.70 warm pick, its three calls). Neither timing alone ranks every kernel as the model runs it.

Measured where it is off by default (`tuningInModel` 0): on a 2-core AVX-512 EPYC (2026-11-28) after a
30-minute tuning of ResNet-50 it changed 14 of the 28 kernels and took 14.6 s (two builds and the
rounds), and the model ran no faster: 38.48 ms against 38.41 without it, ONNX Runtime 38.33
(benchmarks/artifact_rounds.py, fresh processes, 16 rounds). Imports only the standard library and
this environment's packages.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kompile.compile_jobs.envs.tvm_inplace import SUFFIX as IN_PLACE
from kompile.compile_jobs.envs.tvm_verify import Ranking, database_of

ROUNDS = 15
"""Interleaved rounds after a warm-up call: each calls every variant once, in a rotated order."""
_SUFFIXES = re.compile(rf"(_prepacked)?({IN_PLACE}\d+)?$")
"""What the build appends to a kernel's name: its weight rewrite folded, its residual written in place."""


@dataclass
class InModelStats:
    variants: int = 0
    """Candidates per kernel compared in the model (the `tuningInModel` option)."""
    kernels: int = 0
    """Kernels with two or more candidates, timed in the model."""
    changed: int = 0
    """Of those, the kernels whose fastest in the model was not the one re-measured fastest alone."""
    saved_ms: float = 0.0
    """One model call's time saved by the changes, as timed in the model (each kernel's calls counted)."""
    seconds: float = 0.0

    def record(self) -> dict[str, str]:
        return {
            "tuningInModelVariants": str(self.variants),
            "tuningInModelKernels": str(self.kernels),
            "tuningInModelChanged": str(self.changed),
            "tuningInModelSavedMs": f"{self.saved_ms:.3f}",
            "tuningInModelSeconds": f"{self.seconds:.1f}",
        }


def kernel_tasks(mod: Any, ranking: Ranking) -> dict[str, int]:
    """Each kernel of `mod` (before the database is applied) by name -> the index of its task in
    `ranking`: the function and the task's workload hash alike in MetaSchedule's structural sense, as
    MetaScheduleApplyDatabase matches them."""
    from tvm import tirx
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    # A database hands back the workload it holds for a module equal to the one committed.
    scratch = ms.database.MemoryDatabase(module_equality="structural")
    workloads = [scratch.commit_workload(task.dispatched[0]) for task, _ in ranking]
    out: dict[str, int] = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            held = scratch.commit_workload(_normalize_mod(func))
            index = next((i for i, w in enumerate(workloads) if w.same_as(held)), None)
            if index is not None:
                out[gv.name_hint] = index
    return out


def ranked_in_model(
    mod: Any,
    target: Any,
    ranking: Ranking,
    variants: int,
    cores: int,
    feeds: list[Any],
    finish: Callable[[Any, Any], Any],
) -> tuple[Any, InModelStats]:
    """A database holding, for each task of `ranking`, one record: of its first `variants`, the one
    whose calls took least time in the model. `finish(mod, database)` is the build's own
    post-processing of `mod` with a database applied; `feeds` are the model's inputs (numpy arrays)."""
    import tvm
    from tvm import relax

    start = time.monotonic()
    stats = InModelStats(variants=variants)
    depth = min(variants, max((len(records) for _, records in ranking), default=0))
    if depth < 2:
        stats.seconds = time.monotonic() - start
        return database_of(ranking), stats
    names = kernel_tasks(mod, ranking)
    # Built and loaded one after another, all kept: the rounds interleave them.
    os.environ["TVM_NUM_THREADS"] = str(cores)  # before the runtime's pool first starts
    device = tvm.cpu()
    machines = []
    for j in range(depth):
        built = tvm.compile(finish(mod, database_of(ranking, [j] * len(ranking))), target=target)
        machines.append(relax.VirtualMachine(built, device))
    args = [tvm.runtime.tensor(a, device) for a in feeds]
    # times[j][i]: task i's time in each call of variant j (seconds, its calls summed).
    times: list[list[list[float]]] = [[[] for _ in ranking] for _ in range(depth)]
    for r in range(ROUNDS + 1):
        order = [(r + j) % depth for j in range(depth)]
        for j in order:
            spent = _timed_call(machines[j], args, names, len(ranking))
            if r:  # the first round warms the caches and the runtime's pool
                for i, s in enumerate(spent):
                    times[j][i].append(s)
    picks = []
    for i, (_, records) in enumerate(ranking):
        alive = range(min(depth, len(records)))
        medians = [statistics.median(times[j][i]) for j in alive]
        best = min(alive, key=lambda j: (medians[j], j)) if medians and medians[0] > 0 else 0
        picks.append(best)
        if len(records) > 1 and medians and medians[0] > 0:
            stats.kernels += 1
            if best:
                stats.changed += 1
                stats.saved_ms += (medians[0] - medians[best]) * 1e3
    stats.seconds = time.monotonic() - start
    return database_of(ranking, picks), stats


def _timed_call(vm: Any, args: list[Any], names: dict[str, int], tasks: int) -> list[float]:
    """One call of the model's `main`: each task's kernels' time in it (seconds, summed over calls)."""
    spent = [0.0] * tasks
    began: list[float] = [0.0]

    def instrument(_func: Any, symbol: str, before: bool, *_rest: Any) -> int:
        index = names.get(_SUFFIXES.sub("", str(symbol)), -1)
        if index >= 0:
            if before:
                began[0] = time.perf_counter()
            else:
                spent[index] += time.perf_counter() - began[0]
        return 0  # VMInstrumentReturnKind: no-op, go on

    vm.set_instrument(instrument)
    vm["main"](*args)
    return spent
