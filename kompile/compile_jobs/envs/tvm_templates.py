"""Register-blocked schedules for the blocked convolutions, offered to MetaSchedule's tuning as
candidates (the `tvm` environment's steps, kompile.compile_jobs.envs.tvm_tuning): measured like the
search's own candidates, recorded in the class's database beside them, applied where they are fastest.

The schedule is the one ONNX Runtime's MLAS and oneDNN write by hand: each thread takes whole output
rows; for a few output pixels along a row and a few channel vectors (a tile that fits the ISA's vector
registers: 16 with AVX2, 32 with AVX-512 or Arm) the whole reduction runs with its partial sums in
registers, then the bias, residual add and activation are applied to the tile and it is stored once.
MetaSchedule's CPU tiling ("SSRSRS") keeps its inner reduction outside its innermost spatial tile, so
its partial sums go through memory between reduction steps; on a 2-core AVX2 AMD EPYC its best
schedule for ResNet-50's layer-2 1x1 128->512 convolution with the residual add (after two 30-minute
tunings) took 3.3-4.0 ms a model call (4 calls, in the model), this one with 4 pixels x 2 vectors 2.5-2.8.
Padded convolutions pad each thread's input rows at the row loop (inlined into the reduction, the
bounds checks cost more than the reuse: 2.7 against 1.55 ms on a 3x3). A row the tile does not divide
(7 or 14 pixels in tiles of 3, 4 or 5) ends in a narrower tile, its own unrolled copy as MLAS keeps
its remainder apart: a bound tested before each multiply-add (TVM's predicated tile, not unrolled)
measured 2.4-3.2x slower.

Imports only the standard library and this environment's packages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kompile.compile_jobs.envs import tvm_tuning

CONV = "conv2d_NCHWc_OIHWo"
"""The blocked convolution's block (TOPI's conv2d_NCHWc_OIHWo, kompile's blocked layout): loops n,
output-channel blocks, rows, columns, lanes, input channels, kernel rows, kernel columns."""
MOST = 8
"""Variants offered per convolution: the fullest register tiles (each costs about a second to build
and measure on 2 cores, a search trial about half that)."""
MAX_PIXELS = 8
MAX_TILES = 10
"""Tiles along a row that a remainder tile may unroll to (a 28-wide row in tiles of 3)."""
SCHEDULE_ERRORS = (RuntimeError, ValueError)
"""What a schedule primitive that does not apply raises (TVM 0.27's ScheduleError is a RuntimeError)."""


@dataclass(frozen=True)
class Variant:
    pixels: int
    """Output pixels along a row in the register tile (the row's last tile may be narrower)."""
    vectors: int
    """Output-channel blocks (one vector register each) per pixel (the last may hold fewer)."""
    reduce: int
    """Input channels per inner reduction step (the input's channel block)."""


def registers(lanes: int, mtriple: str) -> int:
    """Vector registers of the ISA: AVX2 has 16, AVX-512 and Arm's NEON 32."""
    return 32 if lanes == 16 or mtriple.startswith("aarch64") else 16


def conv_extents(func: Any) -> list[int] | None:
    """The blocked convolution's loop extents in `func` (an IRModule of one kernel), or None where it
    has none (matmuls, pools, Winograd's kernels, NCHW convolutions)."""
    import tvm

    sch = tvm.s_tir.Schedule(func)
    try:
        block = sch.get_sblock(CONV)
    except SCHEDULE_ERRORS:
        return None
    loops = sch.get_loops(block)
    if len(loops) != 8:
        return None
    try:
        return [int(sch.get(loop).extent) for loop in loops]
    except TypeError:
        return None  # a symbolic extent


def variants(extents: list[int], regs: int, most: int = MOST) -> list[Variant]:
    """The register tiles to offer for a convolution of these loop extents: pixels x vectors
    accumulators at most `regs` - 4 (the weights and the broadcast input need registers too), the
    fullest first and the fewer pixels (broadcast loads) of two equally full; the reduction step is
    the input's channel block (all of a stem's few channels). A row whose width the pixels do not
    divide is covered by a last, narrower tile (its tile loop unrolled), as long as that is at most
    MAX_TILES tiles; channel blocks the vectors do not divide leave a last, narrower tile too. The
    measurement picks among them: on a 2-core AVX2 EPYC a 4x3 tile was the fastest on 7x7 rows of
    64 blocks and twice as slow as 3x4 on 14x14 rows of 32."""
    _, blocks, _, width, lanes, channels, _, _ = extents
    reduce = lanes if channels % lanes == 0 else channels
    pixels = [
        p for p in range(1, min(width, MAX_PIXELS) + 1) if width % p == 0 or -(-width // p) <= MAX_TILES
    ]
    tiles = [(p, v) for p in pixels for v in range(1, min(blocks, 4) + 1) if 4 <= p * v <= regs - 4]
    tiles.sort(key=lambda t: (regs - 4 - t[0] * t[1], t[0]))
    return [Variant(p, v, reduce) for p, v in tiles[:most]]


def schedule(func: Any, variant: Variant) -> Any:
    """`func`'s convolution scheduled as `variant`; its other blocks inlined (the epilogue into the
    tile's store, padding computed per thread's rows). Raises TVM's errors where it does not apply."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    sch = tvm.s_tir.Schedule(func)
    conv = sch.get_sblock(CONV)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    at = names.index(CONV)
    producers, epilogue = blocks[:at], blocks[-1] if at < len(blocks) - 1 else None
    for block in blocks[at + 1 : -1]:
        sch.compute_inline(block)  # bias and residual adds: into the last elementwise block
    n, oc, h, w, ob, ic, kh, kw = sch.get_loops(conv)
    remainder = int(sch.get(w).extent) % variant.pixels != 0
    oc_out, oc_in = sch.split(oc, [None, variant.vectors])
    w_out, w_in = sch.split(w, [None, variant.pixels])
    ic_out, ic_in = sch.split(ic, [None, variant.reduce])
    sch.reorder(n, oc_out, h, w_out, ic_out, kh, kw, ic_in, oc_in, w_in, ob)
    # The tile's partial sums: a local buffer of pixels x vectors x lanes, promoted to registers.
    store = sch.cache_write(conv, 0, "local")
    if epilogue is not None:
        sch.reverse_compute_inline(epilogue)
    sch.reverse_compute_at(store, w_out)
    if remainder:
        # Each tile of the row its own copy: the last one's pixel bound is then a constant, which
        # drops its missing pixels at build, instead of a test before each of its multiply-adds.
        sch.unroll(w_out)
    rows = sch.fuse(n, oc_out, h)
    sch.parallel(rows)
    inner = sch.get_loops(conv)
    sch.vectorize(inner[-1])
    sch.unroll(inner[-2])
    sch.unroll(inner[-3])
    sch.decompose_reduction(conv, ic_out)
    sch.vectorize(sch.get_loops(store)[-1])
    for block in producers:
        sch.compute_at(block, rows)
    # What follows is MetaSchedule's own postprocessing (the tuner redoes it when it replays a
    # record): the weights read in the layout the tile walks them (prepacked at build).
    sch.enter_postproc()
    ms.postproc.RewriteLayout().apply(sch)
    return sch


def seed(
    tasks: list[Any], database: Any, target: Any, builder: Any, runner: Any, deadline: float, limit: int
) -> dict[int, set[str]]:
    """Measure the variants of each convolution task in `tasks` that the database does not hold yet
    and commit them as tuning records; stops at `deadline` (time.monotonic()) or once `limit` records
    were added. Returns each task's (by id) template traces, so that the caller can tell where one
    became the best."""
    import time

    mtriple = str(target.attrs.get("mtriple", ""))
    offered: dict[int, set[str]] = {}
    start = len(database)
    for task in tasks:
        if time.monotonic() >= deadline or len(database) - start >= limit:
            break
        func = task.dispatched[0]
        extents = conv_extents(func)
        if extents is None:
            continue
        schedules: dict[str, Any] = {}
        for variant in variants(extents, registers(extents[4], mtriple)):
            try:
                sch = schedule(func, variant)
            except SCHEDULE_ERRORS:
                continue  # a variant that does not apply to this kernel's blocks
            schedules[tvm_tuning.trace_key(sch.trace)] = sch
        offered[id(task)] = set(schedules)
        known = {tvm_tuning.trace_key(r.trace) for r in tvm_tuning._top(database, task, 1 << 30)}
        room = limit - (len(database) - start)
        if fresh := [sch for key, sch in schedules.items() if key not in known][:room]:
            _measure_and_commit(func, fresh, database, target, builder, runner)
    return offered


def _measure_and_commit(
    func: Any, candidates: list[Any], database: Any, target: Any, builder: Any, runner: Any
) -> None:
    """Build and run the candidates as the tuner's batches are (same builder, runner and timing),
    and commit each one that ran as a record of `func`'s workload."""
    from tvm.s_tir import meta_schedule as ms

    workload = database.commit_workload(func)
    device = "cpu"  # templates are for llvm targets (the runner takes a device, not a target kind)
    with tvm_tuning.built(builder, [sch.mod for sch in candidates], target) as paths:
        runs, ran = [], []
        for sch, path in zip(candidates, paths, strict=True):
            if path is not None:
                args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
                runs.append(ms.runner.RunnerInput(path, device, args))
                ran.append((sch, args))
        for (sch, args), future in zip(ran, runner.run(runs), strict=True):
            result = future.result()
            if result.error_msg is None and result.run_secs:
                database.commit_tuning_record(
                    ms.database.TuningRecord(sch.trace, workload, result.run_secs, target, args)
                )
