"""The `tvm` environment's steps (requirements/env-tvm.txt: apache-tvm 0.27, apache-tvm-ffi pinned,
onnx, xgboost-cpu; no torch), served by kompile.compile_jobs.env_runner.

- compile: the pipeline's fp32 ONNX export through the Relax ONNX frontend at the exported static
  shapes, its plain convolutions blocked (NCHW{lanes}c) unless `activationLayout: nchw`, its
  weights marked layout-free unless `weightLayout: as-is`, its 3x3 stride-1 convolutions as
  Winograd F(4x4, 3x3) with `winograd: on` (kompile.compile_jobs.envs.tvm_winograd) and with `auto`
  built both ways, each shape kept in the form faster in the model after the tuning
  (kompile.compile_jobs.envs.tvm_winograd_pick), then MetaSchedule
  (kompile.compile_jobs.envs.tvm_tuning) into the request's `state` folder, the hardware class's
  shared tuning database, within the target's trial and time budget; the database's best schedules,
  each kernel's few best re-measured on this node (kompile.compile_jobs.envs.tvm_verify) and, with
  `tuningInModel`, the fastest few of those compared in the model
  (kompile.compile_jobs.envs.tvm_inmodel), are applied (also when no trial is run: what the fleet
  tuned before is free), their weight rewrites folded into the constants, the tuned residual
  kernels made to write into their residual where nothing reads it after
  (kompile.compile_jobs.envs.tvm_inplace), and the module is built for the class's CPU
  (`target_for`) into a shared library;
- on a GPU class (`device: cuda`): the module built for `cuda -arch=sm_XY`; on the class's own node
  MetaSchedule tunes it into the class's database as on CPUs, each candidate measured on the GPU,
  the database's schedules applied and TVM's default DLight schedules for the rest; its kernels'
  CUDA source checked by NVRTC for that sm (kompile.compile_jobs.envs.tvm_cuda);
- load/run: the library loaded back with the Relax VM on `threads` threads (TVM_NUM_THREADS, set
  before the runtime's pool starts), or on the GPU (`device: cuda`), each call timed here.

Imports only the standard library, numpy and this environment's packages.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.env_protocol import StepFailed, progress
from kompile.compile_jobs.envs import (
    FeedCache,
    failing_onnx_node,
    read_arrays,
    tvm_cuda,
    tvm_inmodel,
    tvm_inplace,
    tvm_verify,
    tvm_winograd,
    tvm_winograd_pick,
    write_arrays,
)
from kompile.compile_jobs.envs.tvm_target import target_for, target_string, vector_lanes
from kompile.compile_jobs.envs.tvm_winograd_pick import ConvShape

Array = np.ndarray[Any, Any]

TVM_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError, TypeError, IndexError)
"""What TVM 0.27 raises: its FFI turns a C++ error into Python's built-in exception of that kind,
and its own (InternalError, DiagnosticError, OpError) derive from RuntimeError; the
`tvm.error.TVMError` of earlier releases is gone, and naming it in an `except` clause turned every
TVM failure into an AttributeError."""
TVM_LOAD_ERRORS: tuple[type[Exception], ...] = (*TVM_ERRORS, OSError)
WINOGRAD_MODES = ("off", "on", "auto")


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    # TVM's errors end with the message after a C++ traceback.
    return (lines[-1] if lines else type(err).__name__)[:400]


def import_onnx(path: str, shapes: list[tuple[int, ...]]) -> Any:
    """The ONNX export as a Relax module at the exported static shapes, parameters bound as constants."""
    import onnx
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(path)
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    if len(inputs) != len(shapes):
        raise StepFailed(f"the ONNX export has inputs {inputs}, the example {len(shapes)} arrays")
    try:
        mod = from_onnx(model, shape_dict=dict(zip(inputs, [list(s) for s in shapes], strict=True)))
    # Its converters also assert on what they do not support (AssertionError) and index what
    # they expected to find: every failure here is a conversion failure, named with its node.
    except (RuntimeError, KeyError, ValueError, TypeError, AttributeError, AssertionError, IndexError) as err:
        # A Python assert's message is all of it; a C++ error's is its last line.
        text = " ".join(str(err).split()) if isinstance(err, AssertionError) else _first_line(err)
        text = text or type(err).__name__
        # "The following operators are not supported for frontend ONNX: Det, ...": name the ops as
        # the other backends do, with what to change.
        missing = re.search(r"not supported for frontend ONNX: (.+)", text)
        if missing:
            ops = missing.group(1).strip()
            what = f"ops {ops}" if "," in ops else f"op {ops}"
            raise StepFailed(
                f"TVM has no conversion for the ONNX {what}; replace that construct in the model or "
                "build it with another backend"
            ) from err
        node = failing_onnx_node(err)
        where = f" at the ONNX op {node}" if node else ""
        raise StepFailed(
            f"TVM's Relax ONNX frontend could not import the model{where}: {text}; replace that "
            "construct in the model or build it with another backend"
        ) from err
    mod = relax.transform.DecomposeOpsForInference()(mod)
    return relax.transform.CanonicalizeBindings()(mod)


FAST_MATH_OPS = ("relax.exp", "relax.erf", "relax.tanh", "relax.nn.softmax")
"""The ops Relax's FastMathTransform replaces with TVM's polynomial forms (fast_exp, fast_erf,
fast_tanh, fast_softmax)."""


def fast_math(mod: Any) -> tuple[Any, dict[str, int]]:
    """exp, erf, tanh and softmax as TVM's vectorizable polynomial approximations, and how many of
    each were replaced. Why: on CPUs the exact ones are calls to the C library's scalar expf and
    erff, which keep their loops from vectorizing; BERT-base's GELU (erf) then took 12.2 ms of a
    137 ms call where ONNX Runtime's (MLAS's own polynomial) took 2.4 (2026-11-28, 2-core AVX-512
    EPYC). The approximations are within 6 float32 ulps (erf 5.5, exp 4.5, tanh 5.4 at most over a
    million points); validation still gates the artifact."""
    from tvm import relax

    counts: dict[str, int] = {}

    @relax.expr_functor.visitor
    class _Count(relax.PyExprVisitor):  # type: ignore[misc]
        def visit_call_(self, call: Any) -> None:
            name = getattr(call.op, "name", "")
            if name in FAST_MATH_OPS:
                key = name.rsplit(".", 1)[1]
                counts[key] = counts.get(key, 0) + 1
            super().visit_call_(call)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _Count().visit_expr(func)
    return (relax.transform.FastMathTransform()(mod) if counts else mod), counts


def _fast_math_record(approximated: dict[str, int]) -> str:
    replaced = ", ".join(f"{op} {n}" for op, n in sorted(approximated.items()))
    return f"on: {replaced or 'nothing to approximate'}"


class Steps:
    def __init__(self) -> None:
        self.vm: Any = None
        self.device: Any = None
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.feeds = FeedCache()

    def op_compile(self, req: dict[str, Any]) -> dict[str, Any]:
        import tvm

        if req["precision"] != "fp32":
            raise StepFailed(f"the tvm backend builds fp32 only, not {req['precision']}")
        options: dict[str, str] = req.get("options") or {}
        try:
            target_json = target_for(options)
        except ValueError as err:
            raise StepFailed(str(err)) from err
        example = read_arrays(req["example"])
        mod = import_onnx(req["program"], [a.shape for a in example])
        if target_json["kind"] == "cuda":
            return {"record": _compile_cuda(mod, target_json, Path(req["out"]), options, req.get("state"))}
        target = tvm.target.Target(target_json)
        fast = options.get("fastMath", "on") == "on"
        approximated: dict[str, int] = {}
        if fast:
            mod, approximated = fast_math(mod)
        lanes = vector_lanes(options)
        mode = options.get("winograd", "off")
        if mode not in WINOGRAD_MODES:
            raise StepFailed(f"winograd must be one of {', '.join(WINOGRAD_MODES)}, not {mode!r}")
        prepack = options.get("weightLayout", "prepacked") == "prepacked"
        state = req.get("state")
        imported, blocked, unblocked = mod, Blocked(mod, 0, 0, []), ""
        transformed = None  # with `auto`: every eligible convolution as Winograd, to measure against
        if options.get("activationLayout", "blocked") == "blocked":
            try:
                blocked = block_convolutions(imported, lanes, mode == "on")
                if mode == "auto" and state and blocked.eligible:
                    transformed = _prepared(block_convolutions(imported, lanes, True).mod, prepack)
            except TVM_ERRORS as err:
                # The blocked layout is a speed-up: a graph it cannot convert is built as exported.
                blocked, unblocked, transformed = Blocked(imported, 0, 0, []), _first_line(err), None
        mod = _prepared(blocked.mod, prepack)
        out = Path(req["out"])
        record: dict[str, str] = {
            "frontend": "relax-onnx",
            "tvmTarget": target_string(target_json),
            "outputCount": str(_output_count(mod)),
            "weightLayout": "prepacked" if prepack else "as-is",
            "activationLayout": f"NCHW{lanes}c" if blocked.blocked else "NCHW",
            "blockedConvolutions": str(blocked.blocked),
            "winograd": mode,
            "winogradConvolutions": str(blocked.winograd),
            "fastMath": _fast_math_record(approximated) if fast else "off",
        }
        if unblocked:
            record["activationLayoutKept"] = f"NCHW: the blocked layout failed ({unblocked})"
        if mode == "auto" and transformed is None and blocked.eligible:
            record["winogradMeasured"] = "not measured: nothing tuned (no tuning database); direct"
        if state:
            budget = _budget(options, tuning_cores(options, target_json))
            if transformed is not None:
                budget = dataclasses.replace(budget, pick_builds=2)

            def finish(tuned: Any, database: Any) -> Any:
                return _apply(tuned, database, target, prepack)[0]

            variants = [mod] if transformed is None else [mod, transformed]
            database, stats, ranking, complete = _tuned_database(
                variants, target, Path(state), budget, out.parent
            )
            if transformed is not None:
                progress("timing the model with its 3x3 convolutions as Winograd and as direct")
                mod, count, measured = _pick_winograd(
                    imported,
                    mod,
                    transformed,
                    blocked.eligible,
                    complete,
                    (finish, database, example),
                    target,
                    lanes,
                    prepack,
                    budget.cores,
                )
                record.update(measured, winogradConvolutions=str(count))
            if ranking is not None and budget.in_model >= 2:
                database = _ranked_in_model(mod, target, ranking, budget, stats, (finish, example))
            record.update(stats.record())
            mod, applied_record = _apply(mod, database, target, prepack)
            record.update(applied_record)
            applied = stats.reused + stats.tuned if stats.records_after else 0
            record["pipeline"] = "metaschedule-database+default" if applied else "default"
        else:
            record["pipeline"] = "default"
        progress("building the library")
        try:
            executable = tvm.compile(mod, target=target)
            executable.export_library(str(out))
        except TVM_ERRORS as err:
            raise StepFailed(
                f"TVM could not build the model for {target_string(target_json)}: {_first_line(err)}"
            ) from err
        return {"record": record}

    def op_load(self, req: dict[str, Any]) -> dict[str, Any]:
        # The runtime's pool reads TVM_NUM_THREADS once, when it first starts (here: at load).
        os.environ["TVM_NUM_THREADS"] = str(int(req["threads"]))
        cuda = req.get("device", "cpu") == "cuda"
        if cuda:
            tvm_cuda.prepare()
        import tvm
        from tvm.runtime.vm import VirtualMachine  # runtime only: loads without TVM's compiler library

        # On cuda the device first: a library with CUDA kernels does not load without its runtime.
        self.device = tvm_cuda.device() if cuda else tvm.cpu()
        try:
            lib = tvm.runtime.load_module(req["model"])
        except TVM_LOAD_ERRORS as err:
            raise StepFailed(
                f"TVM cannot load {Path(req['model']).name}: {_first_line(err)}; rebuild it"
            ) from err
        self.vm = VirtualMachine(lib, self.device)
        arity = int(self.vm._get_function_arity("main"))
        self.inputs = [str(self.vm._get_function_param_name("main", i)) for i in range(arity)]
        self.feeds.clear()
        return {"inputs": self.inputs, "outputs": []}

    def op_run(self, req: dict[str, Any]) -> dict[str, Any]:
        import tvm

        if self.vm is None:
            raise StepFailed("no model loaded")
        args = self.feeds.get(req["feeds"], lambda feed: [tvm.runtime.tensor(a, self.device) for a in feed])
        start = time.perf_counter_ns()
        try:
            result = self.vm["main"](*args)
        except TVM_ERRORS as err:
            raise StepFailed(f"the TVM library failed on these inputs: {_first_line(err)}") from err
        outs = [o.numpy() for o in _flatten(result)]
        ns = time.perf_counter_ns() - start
        if req["out"]:
            write_arrays(req["out"], outs)
        return {"ns": ns}


def _compile_cuda(
    mod: Any, target_json: dict[str, Any], out: Path, options: dict[str, str], state: str | None
) -> dict[str, str]:
    """A GPU class's library, built and exported here, its CUDA source compiled by NVRTC for the
    class's sm_XY to refuse now what would not build at load. Where the class's shared database is
    handed over (`state`) and this machine has the GPU, MetaSchedule tunes the tasks the database
    lacks, measuring each candidate on the GPU, and the database's schedules are applied; TVM's
    default CUDA pipeline schedules the rest with its DLight rules (matmuls and reductions by their
    rules, the rest, convolutions included, by the fallback that binds loops to threads)."""
    import tvm
    from tvm import relax

    arch = str(target_json["arch"])
    tvm_cuda.prepare()
    target = tvm.target.Target(tvm_cuda.build_target(target_json))
    record = {
        "frontend": "relax-onnx",
        "tvmTarget": target_string(target_json),
        "outputCount": str(_output_count(mod)),
        "activationLayout": "NCHW",
        "pipeline": "dlight-default",
    }
    budget = _budget(options, tuning_cores(options, target_json))
    if not state:
        # The pipeline hands a GPU class's database over only on a node with the class's GPU.
        record["tuning"] = "none: no tuning database (a GPU class tunes on a node with its GPU)"
    else:
        untuned = _why_not_tuned(budget)
        if untuned:
            # The database's schedules still apply; nothing is measured.
            record["tuning"] = f"none: {untuned}"
            budget = dataclasses.replace(budget, trials=0)
        # Legalized and fused first: the fused kernels are MetaSchedule's tasks.
        mod = relax.get_pipeline("zero")(mod)
        mod, stats = _tune_and_apply(mod, target, Path(state), budget, out.parent)
        record.update(stats.record())
        record.setdefault("tuning", "metaschedule")
        if stats.reused + stats.tuned:
            record["pipeline"] = "metaschedule-database+dlight"
    try:
        executable = tvm.compile(mod, target=target)
        executable.export_library(str(out))
    except TVM_ERRORS as err:
        raise StepFailed(f"TVM could not build the model for cuda {arch}: {_first_line(err)}") from err
    return record | tvm_cuda.check_kernels(executable, arch)


def tuning_cores(options: dict[str, str], target_json: dict[str, Any]) -> int:
    """Cores the tuning's builders and runners use: the run's threads the backend sent (a cuda
    target's JSON has no num-cores), else the cores this process may run on. Not os.cpu_count(): a
    GPU node's container sees the host's count (often 100+) where its cgroup grants a few."""
    sent = int(options.get("cores", "0") or 0) or int(target_json.get("num-cores", 0))
    return sent if sent > 0 else available_cores()


def _budget(options: dict[str, str], cores: int) -> Any:
    """The tuning budget the options name; a scope the catalog would refuse fails the step."""
    from kompile.compile_jobs.envs import tvm_tuning

    try:
        return tvm_tuning.budget_from(options, cores)
    except ValueError as err:
        raise StepFailed(str(err)) from err


def _tune_and_apply(mod: Any, target: Any, state: Path, budget: Any, scratch: Path) -> tuple[Any, Any]:
    """Tune the tasks of `mod` the database in `state` lacks (every task with scope "all"), within
    `budget`, then apply the database's schedules: the module and the tuning's stats."""
    from tvm import relax

    database, stats, _, _ = _tuned_database([mod], target, state, budget, scratch)
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase()(mod), stats


InModel = tuple[Callable[[Any, Any], Any], list[Array]]
"""The build's post-processing of a module with a database applied, and the model's example inputs:
what ranking the records by their time in the model (tvm_inmodel) builds and runs."""


def _prepared(mod: Any, prepack: bool) -> Any:
    """A (blocked) module legalized and fused by Relax's default pipeline; with `prepack` its weights
    marked layout-free: each tuned kernel may read the constants in the blocked layout its schedule
    wants (MetaSchedule's RewriteLayout), rewritten once at build, so the library is called as before."""
    from tvm import relax

    mod = relax.get_pipeline("zero")(mod)
    return relax.transform.AttachAttrLayoutFreeBuffers()(mod) if prepack else mod


def _tuned_database(
    mods: list[Any], target: Any, state: Path, budget: Any, scratch: Path
) -> tuple[Any, Any, tvm_verify.Ranking | None, bool]:
    """Tune the tasks of `mods` (builds of one model) the database in `state` lacks (every task with
    scope "all"), within `budget`: the database to apply (on CPUs each kernel's best re-measured
    here), the tuning's stats, the re-measured ranking (None where not re-measured) and whether every
    task has a record."""
    from tvm.s_tir import meta_schedule as ms

    from kompile.compile_jobs.envs import tvm_tuning

    database = tvm_tuning.open_database(state)
    try:
        with target:
            # One list of tasks for the tuning and the re-measuring, so that both see the same kernels.
            tasks = tvm_tuning.distinct_tasks([ms.relax_integration.extract_tasks(m, target) for m in mods])
            stats = tvm_tuning.tune(tasks, target, database, budget, scratch / "tvm-tuning-logs")
    except TVM_ERRORS as err:
        raise StepFailed(f"MetaSchedule tuning failed: {_first_line(err)}") from err
    complete = all(tvm_tuning.has_record(database, t) for t in tasks)
    if not tvm_tuning.verifies(str(target.kind.name), budget):
        return database, stats, None, complete
    # The database's best few per kernel re-measured here (kompile.compile_jobs.envs.tvm_verify).
    progress(f"re-measuring the best {budget.verify} schedules of each of {len(tasks)} kernels")
    try:
        with target:
            ranking, verified = tvm_verify.verified_ranking(
                tasks, target, database, budget.verify, budget.cores
            )
    except TVM_ERRORS as err:
        raise StepFailed(
            f"re-measuring the tuning database's best schedules failed: {_first_line(err)}"
        ) from err
    stats.verified = verified.record()
    return tvm_verify.database_of(ranking), stats, ranking, complete


def _ranked_in_model(
    mod: Any, target: Any, ranking: tvm_verify.Ranking, budget: Any, stats: Any, in_model: InModel
) -> Any:
    """The database of each kernel's record fastest in the model (tvm_inmodel), of its
    `budget.in_model` re-measured fastest; the records re-measured fastest alone where that fails."""
    finish, feeds = in_model
    try:
        database, ranked = tvm_inmodel.ranked_in_model(
            mod, target, ranking, budget.in_model, budget.cores, feeds, finish
        )
    except TVM_ERRORS as err:
        # A speed-up only: the records re-measured fastest alone are built instead.
        stats.in_model = {"tuningInModel": f"not ranked: {_first_line(err)}"}
        return tvm_verify.database_of(ranking)
    stats.in_model = ranked.record()
    return database


def _pick_winograd(
    imported: Any,
    direct: Any,
    transformed: Any,
    eligible: list[ConvShape],
    complete: bool,
    build: tuple[Callable[[Any, Any], Any], Any, list[Array]],
    target: Any,
    lanes: int,
    prepack: bool,
    cores: int,
) -> tuple[Any, int, dict[str, str]]:
    """`winograd: auto`: the module with the eligible convolution shapes that ran faster as Winograd
    in the model as Winograd (tvm_winograd_pick), how many convolutions that is, and the record.
    `build` is the build's post-processing, the database to apply and the model's inputs. Direct
    where a kernel has no tuned schedule yet (an untuned kernel takes seconds: nothing to learn) or
    the measuring fails."""
    finish, database, feeds = build
    if not complete:
        return direct, 0, {"winogradMeasured": "not measured: kernels without a tuned schedule; direct"}
    try:
        picked = tvm_winograd_pick.pick(
            direct, transformed, eligible, target, cores, feeds, lambda m: finish(m, database)
        )
    except TVM_ERRORS as err:
        return direct, 0, {"winogradMeasured": f"not measured: {_first_line(err)}; direct"}
    count = sum(1 for shape in eligible if shape in picked.winograd)
    if count == len(eligible):
        chosen = transformed
    elif count == 0:
        chosen = direct
    else:
        chosen = _prepared(block_convolutions(imported, lanes, picked.winograd).mod, prepack)
    return chosen, count, picked.record()


def _apply(mod: Any, database: Any, target: Any, prepack: bool) -> tuple[Any, dict[str, str]]:
    """`mod` with the database's schedules applied, the tuned kernels' weight rewrites folded into the
    constants (`prepack`) and the residual kernels made in place; what that did, for the record."""
    from tvm import relax

    with target, database:
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
    record: dict[str, str] = {}
    if prepack:
        mod = _fold_weight_rewrites(mod)
        prepacked = [gv for gv in mod.functions if gv.name_hint.endswith("_prepacked")]
        record["prepackedKernels"] = str(len(prepacked))
    mod, record["residualInPlace"] = _residual_in_place(mod)
    return mod, record


def _residual_in_place(mod: Any) -> tuple[Any, str]:
    """The tuned residual kernels made in place (kompile.compile_jobs.envs.tvm_inplace) and how many;
    a speed-up only: where TVM refuses the rewrite, the module is built as it was, with the reason."""
    try:
        mod, count = tvm_inplace.residual_in_place(mod)
    except TVM_ERRORS as err:
        return mod, f"0: {_first_line(err)}"
    return mod, str(count)


def _why_not_tuned(budget: Any) -> str:
    """Why a GPU class's build measures no candidates ('' where it tunes): MetaSchedule measures
    each one on the GPU, so only a build on a node with the class's GPU tunes."""
    if budget.trials <= 0:
        return "tuningTrials is 0"
    try:
        tvm_cuda.device()
    except StepFailed as err:
        return str(err)
    return ""


class Blocked(NamedTuple):
    mod: Any
    blocked: int
    """Convolutions in NCHW{lanes}c."""
    winograd: int
    """Of those, the ones that run as Winograd."""
    eligible: list[ConvShape]
    """The shape of each convolution that could run as Winograd, in the graph's order (a shape once
    per convolution of that shape)."""


def block_convolutions(mod: Any, lanes: int, winograd: bool | Collection[ConvShape] = False) -> Blocked:
    """The 2-D convolutions (groups 1, channels a multiple of `lanes`, or fewer input channels than
    `lanes`: a stem) in NCHW{lanes}c: the channel block is the innermost axis, one vector register
    wide, whatever the image's width. In NCHW a 1x1 convolution on a 7x7 or 14x14 image vectorizes
    along a row of 7 or 14 floats; in ResNet-50 the blocked layout made those tuned kernels 1.1-1.5x
    faster at the same trials, and its 7x7 stem 1.5x (as ONNX Runtime's NCHWc kernels are laid
    out). The pools, adds and activations between convolutions follow the layout; transforms stay
    at the edges. The blocked 3x3 stride-1 convolutions whose input channels are whole blocks run as
    Winograd F(4x4, 3x3) (kompile.compile_jobs.envs.tvm_winograd) where `winograd` is True or names
    their shape."""
    from tvm import relax, topi

    block = [f"NCHW{lanes}c", f"OIHW{lanes}o", f"NCHW{lanes}c"]
    # Named, not left empty: a convolution after a blocked one would otherwise inherit its input's
    # blocked layout without a kernel layout to match ("Layouts must have the same size").
    plain = {"relax.nn.conv2d": ["NCHW", "OIHW", "NCHW"]}

    def pick(call: Any) -> dict[str, list[str]]:
        if call.op.name != "relax.nn.conv2d":
            return {"relax.nn.conv2d": block}
        # Grouped and depthwise convolutions stay NCHW: TOPI's NCHWc kernel has no groups.
        if int(call.attrs.groups) != 1:
            return plain
        try:
            channels, outputs = int(call.args[0].ty.shape[1]), int(call.args[1].ty.shape[0])
        except (TypeError, ValueError, AttributeError):
            return plain  # a symbolic channel count
        if outputs % lanes:
            return plain
        if channels % lanes == 0 and tvm_winograd.eligible(
            (int(call.args[1].ty.shape[2]), int(call.args[1].ty.shape[3])),
            tuple(int(s) for s in call.attrs.strides),
            tuple(int(d) for d in call.attrs.dilation),
        ):
            image = (int(call.args[0].ty.shape[2]), int(call.args[0].ty.shape[3]))
            shape = (channels, outputs, *image, *(int(p) for p in call.attrs.padding))
            eligible.append(shape)
            if winograd if isinstance(winograd, bool) else shape in winograd:
                # The kernel stays OIHW, the mark legalize knows it by: it becomes Winograd's
                # transformed kernel there.
                return {"relax.nn.conv2d": [block[0], "OIHW", block[2]]}
        if channels < lanes:
            # A stem's few input channels (an image's 3) as one block: the input is read
            # channels-innermost and the output comes out blocked, as ONNX Runtime's NCHWc stem does.
            return {"relax.nn.conv2d": [f"NCHW{channels}c", f"OIHW{lanes}o", f"NCHW{lanes}c"]}
        return {"relax.nn.conv2d": block}

    blocked, transformed = 0, 0
    eligible: list[ConvShape] = []

    def legalize(bb: Any, call: Any) -> Any:
        nonlocal blocked, transformed
        if str(call.attrs.data_layout) == "NCHW":
            return call  # left to the default legalization
        blocked += 1
        if str(call.attrs.kernel_layout) == "OIHW":  # pick()'s mark of a Winograd convolution
            transformed += 1
            return tvm_winograd.emit(bb, call, lanes)
        return bb.call_te(
            topi.nn.conv2d_NCHWc_OIHWo,
            data=call.args[0],
            kernel=call.args[1],
            stride=call.attrs.strides,
            padding=call.attrs.padding,
            dilation=call.attrs.dilation,
            layout=call.attrs.data_layout,
            out_layout=call.attrs.out_layout,
            primfunc_name_hint="conv2d_NCHWc",
        )

    mod = relax.transform.ConvertLayout({}, layout_cb=pick)(mod)
    # The weights' layout transforms run once, here, on the constants.
    mod = relax.transform.FoldConstant()(relax.transform.Normalize()(mod))
    mod = relax.transform.LegalizeOps({"relax.nn.conv2d": legalize})(mod)
    return Blocked(mod, blocked, transformed, eligible)


def _fold_weight_rewrites(mod: Any) -> Any:
    """The tuned kernels' weight rewrites split out (`*_weight_prepack`), run once on the constant
    weights here, and dropped: the library holds the rewritten weights, and `main` takes the inputs
    alone, as without prepacking."""
    from tvm import relax

    mod = relax.transform.SplitLayoutRewritePreproc()(mod)
    mod = relax.transform.FoldConstant()(mod)
    return relax.transform.DeadCodeElimination(["main"])(mod)


def _output_count(mod: Any) -> int:
    from tvm import relax

    ret = mod["main"].ret_ty
    return len(ret.fields) if isinstance(ret, relax.TupleType) else 1


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)) or type(value).__name__ in ("Array", "List"):
        return [x for v in value for x in _flatten(v)]
    return [value]
