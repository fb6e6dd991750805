"""The `tvm` environment's steps (requirements/env-tvm.txt: apache-tvm 0.27, apache-tvm-ffi pinned,
onnx, xgboost-cpu; no torch), served by kompile.compile_jobs.env_runner.

- compile: the pipeline's fp32 ONNX export through the Relax ONNX frontend at the exported static
  shapes, its plain convolutions blocked (NCHW{lanes}c) unless `activationLayout: nchw`, its
  weights marked layout-free unless `weightLayout: as-is`, its 3x3 stride-1 convolutions as
  Winograd F(4x4, 3x3) with `winograd: on` (kompile.compile_jobs.envs.tvm_winograd), then MetaSchedule
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.env_protocol import StepFailed
from kompile.compile_jobs.envs import (
    FeedCache,
    read_arrays,
    tvm_cuda,
    tvm_inmodel,
    tvm_inplace,
    tvm_verify,
    tvm_winograd,
    write_arrays,
)
from kompile.compile_jobs.envs.tvm_target import target_for, target_string, vector_lanes

Array = np.ndarray[Any, Any]

TVM_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError, TypeError, IndexError)
"""What TVM 0.27 raises: its FFI turns a C++ error into Python's built-in exception of that kind,
and its own (InternalError, DiagnosticError, OpError) derive from RuntimeError; the
`tvm.error.TVMError` of earlier releases is gone, and naming it in an `except` clause turned every
TVM failure into an AttributeError."""
TVM_LOAD_ERRORS: tuple[type[Exception], ...] = (*TVM_ERRORS, OSError)


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
    except (NotImplementedError, KeyError, ValueError, TypeError, AttributeError) as err:
        raise StepFailed(f"TVM's Relax ONNX frontend could not import the model: {_first_line(err)}") from err
    mod = relax.transform.DecomposeOpsForInference()(mod)
    return relax.transform.CanonicalizeBindings()(mod)


class Steps:
    def __init__(self) -> None:
        self.vm: Any = None
        self.device: Any = None
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.feeds = FeedCache()

    def op_compile(self, req: dict[str, Any]) -> dict[str, Any]:
        import tvm
        from tvm import relax

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
        blocked, winograd, unblocked, lanes = 0, 0, "", vector_lanes(options)
        wants_winograd = options.get("winograd", "off") == "on"
        if options.get("activationLayout", "blocked") == "blocked":
            try:
                mod, blocked, winograd = block_convolutions(mod, lanes, wants_winograd)
            except TVM_ERRORS as err:
                # The blocked layout is a speed-up: a graph it cannot convert is built as exported.
                unblocked = _first_line(err)
        mod = relax.get_pipeline("zero")(mod)
        prepack = options.get("weightLayout", "prepacked") == "prepacked"
        if prepack:
            # The weights are constants: marked layout-free, each tuned kernel may read them in the
            # blocked layout its schedule wants (MetaSchedule's RewriteLayout); the rewrite of the
            # constants is folded at build, so the library is called as before.
            mod = relax.transform.AttachAttrLayoutFreeBuffers()(mod)
        out = Path(req["out"])
        record: dict[str, str] = {
            "frontend": "relax-onnx",
            "tvmTarget": target_string(target_json),
            "outputCount": str(_output_count(mod)),
            "weightLayout": "prepacked" if prepack else "as-is",
            "activationLayout": f"NCHW{lanes}c" if blocked else "NCHW",
            "blockedConvolutions": str(blocked),
            "winograd": "on" if wants_winograd else "off",
            "winogradConvolutions": str(winograd),
        }
        if unblocked:
            record["activationLayoutKept"] = f"NCHW: the blocked layout failed ({unblocked})"
        state = req.get("state")
        if state:
            budget = _budget(options, int(target_json.get("num-cores", os.cpu_count() or 1)))

            def finish(tuned: Any, database: Any) -> Any:
                return _apply(tuned, database, target, prepack)[0]

            database, stats = _tuned_database(
                mod, target, Path(state), budget, out.parent, in_model=(finish, example)
            )
            record.update(stats.record())
            mod, applied_record = _apply(mod, database, target, prepack)
            record.update(applied_record)
            applied = stats.reused + stats.tuned if stats.records_after else 0
            record["pipeline"] = "metaschedule-database+default" if applied else "default"
        else:
            record["pipeline"] = "default"
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
    # The builder's workers: the cores the pipeline runs with (the run's threads, else this
    # process's affinity), not the host's count.
    budget = _budget(options, int(options.get("cores", "0") or 0) or len(os.sched_getaffinity(0)))
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

    database, stats = _tuned_database(mod, target, state, budget, scratch)
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase()(mod), stats


InModel = tuple[Callable[[Any, Any], Any], list[Array]]
"""The build's post-processing of a module with a database applied, and the model's example inputs:
what ranking the records by their time in the model (tvm_inmodel) builds and runs."""


def _tuned_database(
    mod: Any, target: Any, state: Path, budget: Any, scratch: Path, in_model: InModel | None = None
) -> tuple[Any, Any]:
    """Tune the tasks of `mod` the database in `state` lacks (every task with scope "all"), within
    `budget`: the database to apply (on CPUs each kernel's best re-measured here, then ranked in the
    model where `in_model` is given) and the tuning's stats."""
    from tvm.s_tir import meta_schedule as ms

    from kompile.compile_jobs.envs import tvm_tuning

    database = tvm_tuning.open_database(state)
    try:
        with target:
            # One list of tasks for the tuning and the re-measuring, so that both see the same kernels.
            tasks = ms.relax_integration.extract_tasks(mod, target)
            stats = tvm_tuning.tune(tasks, target, database, budget, scratch / "tvm-tuning-logs")
    except TVM_ERRORS as err:
        raise StepFailed(f"MetaSchedule tuning failed: {_first_line(err)}") from err
    if not tvm_tuning.verifies(str(target.kind.name), budget):
        return database, stats
    # The database's best few per kernel re-measured here (kompile.compile_jobs.envs.tvm_verify).
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
    if in_model is None or budget.in_model < 2:
        return tvm_verify.database_of(ranking), stats
    finish, feeds = in_model
    try:
        database, ranked = tvm_inmodel.ranked_in_model(
            mod, target, ranking, budget.in_model, budget.cores, feeds, finish
        )
    except TVM_ERRORS as err:
        # A speed-up only: the records re-measured fastest alone are built instead.
        stats.in_model = {"tuningInModel": f"not ranked: {_first_line(err)}"}
        return tvm_verify.database_of(ranking), stats
    stats.in_model = ranked.record()
    return database, stats


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


def block_convolutions(mod: Any, lanes: int, winograd: bool = False) -> tuple[Any, int, int]:
    """The 2-D convolutions (groups 1, channels a multiple of `lanes`, or fewer input channels than
    `lanes`: a stem) in NCHW{lanes}c: the channel block is the innermost axis, one vector register
    wide, whatever the image's width. In NCHW a 1x1 convolution on a 7x7 or 14x14 image vectorizes
    along a row of 7 or 14 floats; in ResNet-50 the blocked layout made those tuned kernels 1.1-1.5x
    faster at the same trials, and its 7x7 stem 1.5x (as ONNX Runtime's NCHWc kernels are laid
    out). The pools, adds and activations between convolutions follow the layout; transforms stay
    at the edges. With `winograd`, the blocked 3x3 stride-1 ones whose input channels are whole
    blocks run as Winograd F(4x4, 3x3) (kompile.compile_jobs.envs.tvm_winograd). Returns the
    module, how many convolutions were blocked and how many of those run as Winograd."""
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
        if (
            winograd
            and channels % lanes == 0
            and tvm_winograd.eligible(
                (int(call.args[1].ty.shape[2]), int(call.args[1].ty.shape[3])),
                tuple(int(s) for s in call.attrs.strides),
                tuple(int(d) for d in call.attrs.dilation),
            )
        ):
            # The kernel stays OIHW, the mark legalize knows it by: it becomes Winograd's
            # transformed kernel there.
            return {"relax.nn.conv2d": [block[0], "OIHW", block[2]]}
        if channels < lanes:
            # A stem's few input channels (an image's 3) as one block: the input is read
            # channels-innermost and the output comes out blocked, as ONNX Runtime's NCHWc stem does.
            return {"relax.nn.conv2d": [f"NCHW{channels}c", f"OIHW{lanes}o", f"NCHW{lanes}c"]}
        return {"relax.nn.conv2d": block}

    blocked, transformed = 0, 0

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
    return mod, blocked, transformed


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
