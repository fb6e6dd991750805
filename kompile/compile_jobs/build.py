"""The build stage, one target (or candidate) at a time: plan its candidates, then for each one
compile it, run it on the reference inputs, compare its outputs with the saved reference outputs,
and package it in the Triton layout. Each step is a function named for what it does; a failure is
recorded in the candidate's status and never stops the others."""

from __future__ import annotations

import functools
import gc
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kompile.api.candidates import candidate_targets, is_generated, is_multi, rungs_left_out
from kompile.api.catalog import AUTO, CATALOG, OptionsError, auto_left_out, entry
from kompile.api.job_contract import JobDeadline
from kompile.api.resource import CompiledModel
from kompile.api.spec import InputSpec, Selection, Target, Validation, batch_max
from kompile.api.status import CANDIDATES_MAX, Artifact, TargetStatus, Thresholds
from kompile.api.vocabulary import NAME_MAX
from kompile.compile_jobs import calibration, export, sources, timing, triton, validate
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    Runner,
    get_backend,
)
from kompile.compile_jobs.batch_check import BatchCheck, fail_at_other_sizes
from kompile.compile_jobs.built import BuiltTarget, PlannedTarget
from kompile.compile_jobs.dims_check import DimsCheck
from kompile.compile_jobs.hardware import cpu_description, has_fast_bf16, local_cuda_class
from kompile.compile_jobs.inputs import InputMismatch
from kompile.compile_jobs.residency import Residency, UnloadedRunner
from kompile.compile_jobs.run_results import OUTPUTS_FILE, REFERENCE_FILE, RunResults

# Runtimes raise these when an artifact cannot run on the reference inputs.
RUN_ERRORS = (RuntimeError, ValueError)
_NOT_OFFERED_MAX = 15  # status.notOffered holds 16; the ladder's own note takes the last
# Reasons an auto target drops a backend silently: auto only offers what can build the target.
_SILENT_FOR_AUTO = ("UnsupportedPrecision", "UnsupportedDevice", "UnsupportedSource", "NoFastBf16")


class StageReporter(Protocol):
    def stage(self, target: str | None, message: str) -> None: ...


@dataclass
class BuildContext:
    """What every build of a run shares: the source, its export and the saved reference outputs."""

    cm: CompiledModel
    onnx_path: Path | None
    reference: RunResults
    reference_file: Path
    threads: int
    loaded: sources.LoadedSource
    work_dir: Path
    artifact_root: Path
    hardware_class: str
    reporter: StageReporter
    arch: str | None = None
    """The class's architecture (kubernetes.io/arch); None: any (auto offers every CPU backend)."""
    packaged: list[Path] = field(default_factory=list)
    """Build folders whose files are in an artifact now: removed when the run ends."""
    residency: Residency | None = None
    """Whether each validated artifact stays loaded for the benchmark (None: all do)."""
    deadline: JobDeadline | None = None
    """When the compile Job's deadline ends (None: a local run, or no deadline told)."""
    reference_runner: Runner | None = None
    """What runs an ONNX source as given (eager for a PyTorch source is ctx.loaded.module)."""
    dims: DimsCheck | None = None
    """The reference at other sizes of the non-batch dynamic dims (None: not held there)."""
    export_error: str | None = None
    """Why the PyTorch source has no ONNX export (None: it has one, or none was needed): each
    candidate of a backend that compiles ONNX fails with it (ExportFailed)."""
    batches: BatchCheck | None = None
    """The reference at the batch max where no benchmark batch holds it (None: not held there)."""

    def build_dir(self, label: str) -> Path:
        return self.work_dir / "build" / label


def plan_target(ctx: BuildContext, target: Target, device: str) -> PlannedTarget:
    """Build the target, or each of its candidates; the winner is picked after the benchmark."""
    ts = _pending(target, ctx.hardware_class)
    planned = PlannedTarget(target=target, status=ts, multi=is_multi(target))
    if target.precision == "int8" and ctx.loaded.quantized:
        ts.phase, ts.reason, ts.message = "Skipped", "AlreadyQuantized", _already_quantized(ctx)
        return planned
    if not planned.multi:
        skip = skip_reason(target, device, ctx.loaded.kind)
        if skip:
            ts.phase, ts.reason, ts.message = "Skipped", skip[0], skip[1]
        elif built := build_target(ctx, target, ts, target.name, device):
            planned.built.append(built)
        return planned
    _Tournament(ctx, planned, device).run()
    if not planned.candidates:
        ts.phase, ts.reason = "Skipped", "UnsupportedPrecision"
        ts.message = f"no backend for {device} can build precision {target.precision}"
    return planned


def _deadline_near(deadline: JobDeadline | None) -> str | None:
    """Why no candidate starts now: the Job's deadline would stop it with SIGTERM, and a stopped Job
    publishes nothing, the candidates already validated included."""
    now = time.time()
    if deadline is None or not deadline.stop_starting(now):
        return None
    return (
        f"not started: the compile Job's deadline ({deadline.seconds} s, the operator's "
        f"KOMPILE_JOB_DEADLINE_SECONDS) ends in {max(deadline.left(now), 0):.0f} s, and its last "
        f"{deadline.KEPT_SHARE:.0%} is kept to time and publish what was built"
    )


class _Tournament:
    """A multi target's candidates built in order: with precision auto, rung by rung of the ladder
    until one validates; a generated int8 candidate that fails validation followed by its backend's
    remedies until one passes; nothing new started once the time budget is spent."""

    def __init__(self, ctx: BuildContext, planned: PlannedTarget, device: str) -> None:
        self.ctx, self.planned, self.device = ctx, planned, device
        target = planned.target
        self.generated = is_generated(target)
        selection = target.selection or Selection()
        self.budget = selection.time_budget_seconds
        self.try_remedies = self.generated and selection.remedies
        self.started = time.monotonic()

    def run(self) -> None:
        target, ts = self.planned.target, self.planned.status
        ladder = target.precision == AUTO
        passed: str | None = None
        probed: set[str] = set()
        not_tried: list[str] = []
        served = _served(self.ctx.cm)
        notes = (
            arch_notes(target, self.device, self.ctx.arch)
            + device_only_notes(target, self.device, self.ctx.arch, served)
            + ladder_notes(target, self.device, self.ctx.arch)
        )
        ts.not_offered += notes[:_NOT_OFFERED_MAX]
        requantize = False
        for cand in candidate_targets(target, self.device, self.ctx.arch):
            if served and _auto_device_only(target, cand.backend):
                continue
            if cand.precision == "int8" and self.ctx.loaded.quantized:
                requantize = True
                continue
            if ladder and passed is not None and cand.precision != passed and passed not in probed:
                probed.add(passed)
                if not self._beats_source(passed, cand.precision):
                    passed = None  # a rung slower than the source ends nothing: the next is built too
            if ladder and passed is not None and cand.precision != passed:
                if cand.precision not in not_tried:
                    not_tried.append(cand.precision)
                continue
            built, cs = self._build(cand)
            validated = _validated(cs)
            # Remedies win back what quantizing lost: a float build that failed has none to try.
            int8_failed = cand.precision == "int8" and cs.reason == "ValidationFailed"
            if not validated and built is not None and int8_failed and self.try_remedies:
                validated = self._remedy(cand, built)
            if validated and ladder:
                passed = cand.precision
        if requantize:
            ts.not_offered.append(f"int8: {_already_quantized(self.ctx)}")
        if not_tried:
            ts.not_offered.append(
                f"{', '.join(not_tried)}: not tried, {passed} validated first (precision auto stops at "
                "the first precision that passes; each later one is expected slower)"
            )

    def _beats_source(self, precision: str, following: str) -> bool:
        """Whether the rung's fastest validated candidate ran faster than the source in a quick
        timing: "each later rung is slower" holds for a model big enough to be bound by its
        arithmetic, not for a small one, where int8's quantize and dequantize steps cost more than
        they save (a 16x4 MatMul: 0.5x eager). Unknown (nothing to time, a runner failed): yes."""
        runners = {
            b.target.name: b.runner
            for b in self.planned.built
            if b.target.precision == precision
            and b.runner is not None
            and not isinstance(b.runner, UnloadedRunner)  # unloaded to bound memory: a big model
            and _validated(b.status)
        }
        try:
            speedups = timing.quick_speedups(
                self.ctx.cm, self.ctx.loaded, self.ctx.reference_runner, runners, self.ctx.reference.inputs
            )
        except (BackendError, *RUN_ERRORS) as err:
            self.ctx.reporter.stage(self.planned.target.name, f"quick timing of {precision} failed: {err}")
            return True
        best = max(speedups.values(), default=None)
        if best is None or best >= 1.0:
            return True
        self.ctx.reporter.stage(
            self.planned.target.name,
            f"{precision} validated but ran at {best:.2f}x the source in a quick timing: building "
            f"{following} too",
        )
        return False

    def _remedy(self, failed: Target, built: BuiltTarget) -> bool:
        """The failed int8 candidate's remedies in order, until one validates."""
        for remedy in get_backend(failed.backend).remedies(built.artifact):
            options = {**(failed.options or {}), **remedy.options}
            quantization = remedy.quantization or failed.quantization
            attempt = failed.model_copy(
                update={
                    "name": f"{failed.name}-{remedy.name}"[:NAME_MAX].rstrip("-"),
                    "options": options or None,
                    "quantization": quantization,
                }
            )
            self.ctx.reporter.stage(
                f"{self.planned.target.name}/{failed.name}", f"failed validation; trying {remedy.summary}"
            )
            _, cs = self._build(attempt)
            if _validated(cs):
                return True
        return False

    def _build(self, cand: Target) -> tuple[BuiltTarget | None, TargetStatus]:
        """One candidate: skipped (and for a generated target, silently dropped) when it cannot build
        here, or when the budget is spent; else built, run and compared."""
        ctx, planned, device = self.ctx, self.planned, self.device
        ts, target = planned.status, planned.target
        cs = _pending(cand, ctx.hardware_class)
        skip = skip_reason(cand, device, ctx.loaded.kind)
        if self.generated and skip is None:
            skip = slow_here(cand, device)
        if skip and self.generated and skip[0] in _SILENT_FOR_AUTO:
            # The ladder offers every precision to every backend: that one lacks a rung is no news.
            ladder_gap = target.precision == AUTO and skip[0] == "UnsupportedPrecision"
            if not ladder_gap and len(ts.not_offered) < _NOT_OFFERED_MAX:
                what = f"{cand.backend} {cand.precision}" if target.precision == AUTO else cand.backend
                ts.not_offered.append(f"{what}: {skip[1]}")
            return None, cs
        if len(planned.candidates) >= CANDIDATES_MAX:
            return None, cs
        if skip is None and ctx.export_error and entry(cand.backend).consumes == "onnx":
            cs.phase, cs.reason, cs.message = "Failed", "ExportFailed", ctx.export_error
            planned.candidates.append(cs)
            return None, cs
        spent = time.monotonic() - self.started
        if skip is None and planned.candidates and spent > self.budget:
            skip = (
                "BudgetSpent",
                (
                    f"not started: the target's time budget of {self.budget} s was spent ({spent:.0f} s) "
                    "on the candidates before it (selection.timeBudgetSeconds)"
                ),
            )
        if skip is None and planned.candidates and (near := _deadline_near(ctx.deadline)):
            skip = ("DeadlineNear", near)
        built = None
        if skip:
            cs.phase, cs.reason, cs.message = "Skipped", skip[0], skip[1]
        elif built := build_target(ctx, cand, cs, target.name, device, f"{target.name}/{cand.name}"):
            planned.built.append(built)
        planned.candidates.append(cs)
        return built, cs


def ladder_notes(target: Target, device: str, arch: str | None) -> list[str]:
    """The GPU rungs a CPU class's ladder leaves out (candidates.GPU_RUNGS), one note per backend."""
    return [
        f"{backend} {rung}: precision auto climbs {rung} on GPU classes only: a CPU computes it no "
        f"faster than fp32, so a validated {rung} would end the climb before a faster fp32 rung "
        f"(name precision {rung} in a candidate to build it)"
        for backend, rung in rungs_left_out(target, device, arch)
    ]


def arch_notes(target: Target, device: str, arch: str | None) -> list[str]:
    """What auto leaves out on this class's architecture (catalog `auto_arches`), one note per
    backend, said before any build; nothing for listed candidates (built as written)."""
    if arch is None or target.backend != AUTO or target.candidates:
        return []
    return [f"{name}: {why}" for name, why in auto_left_out(device, arch)]


def _served(cm: CompiledModel) -> bool:
    return cm.spec.rollout is not None and cm.spec.rollout.enabled


def _auto_device_only(target: Target, backend: str) -> bool:
    """An auto candidate whose artifact only devices run (catalog serving None: ExecuTorch, Core
    ML): on a class KServe serves it could win and leave the class with nothing to roll out."""
    return target.backend == AUTO and not target.candidates and CATALOG[backend].serving is None


def device_only_notes(target: Target, device: str, arch: str | None, served: bool) -> list[str]:
    """What auto leaves out because KServe serves the class (spec.rollout.enabled), one per backend."""
    if not served:
        return []
    left = dict.fromkeys(
        c.backend for c in candidate_targets(target, device, arch) if _auto_device_only(target, c.backend)
    )
    return [
        f"{b}: its artifacts run on devices, not KServe, and spec.rollout serves this class "
        "(list it in spec.targets[].candidates to build it anyway)"
        for b in left
    ]


def _validated(cs: TargetStatus) -> bool:
    return cs.phase == "Succeeded" and cs.validation is not None and cs.validation.passed


def _pending(target: Target, hardware_class: str) -> TargetStatus:
    return TargetStatus(
        name=target.name,
        backend=target.backend,
        precision=target.precision,
        phase="Pending",
        hardware_class=hardware_class,
    )


def slow_here(target: Target, device: str) -> tuple[str, str] | None:
    """What auto does not offer because it would be slow on this machine: bf16 on a CPU that only
    emulates it (no AVX-512 BF16 or AMX) ran 30-50x slower than fp32 (inductor, small CNN)."""
    if device == "cpu" and target.precision == "bf16" and not has_fast_bf16():
        return (
            "NoFastBf16",
            f"this CPU ({cpu_description()}) has no bf16 instructions: bf16 would be emulated",
        )
    return None


def _already_quantized(ctx: BuildContext) -> str:
    return (
        f"the source is quantized already ({ctx.loaded.quantized}): an int8 build would quantize it "
        "twice, a second rounding on the first (ONNX Runtime's quantizer refuses the graph, others "
        "re-round it); an fp32 target compiles it as it is, its int8 operators included, held to "
        "int8's validation limits"
    )


def skip_reason(target: Target, device: str, source: str = "torch") -> tuple[str, str] | None:
    """Why this machine cannot build `target` for `device` from this source (LoadedSource.kind),
    or None. Precision, device and source kind come first: `auto` drops a backend that cannot
    build them without reporting it."""
    e = entry(target.backend)
    onnx_backends = ", ".join(n for n, c in CATALOG.items() if c.consumes == "onnx" and not c.stand_in)
    if e.consumes == "torch" and source == "onnx":
        return "UnsupportedSource", (
            f"backend {target.backend} compiles PyTorch modules and this source is ONNX; use a backend "
            f"that compiles ONNX ({onnx_backends})"
        )
    if e.consumes == "torch" and source == "torchscript" and not e.stand_in:
        return "UnsupportedSource", (
            f"backend {target.backend} compiles what torch.export traces and this source is TorchScript, "
            "which torch.export cannot take: give it the model as a .pt2 (torch.export.save) or a "
            f"python:// factory, or use a backend that compiles ONNX ({onnx_backends})"
        )
    if target.precision not in e.precisions:
        return "UnsupportedPrecision", (
            f"backend {target.backend} supports {sorted(e.precisions)}, not {target.precision}"
        )
    if device not in e.devices:
        return "UnsupportedDevice", f"backend {target.backend} does not build for {device}"
    try:
        backend = get_backend(target.backend)
    except BackendUnavailable as err:
        return "BackendUnavailable", str(err)
    reason = backend.unavailable_reason()
    if reason:
        return "BackendUnavailable", reason
    if device == "cuda" and local_cuda_class() is None:
        return "NoMatchingHardware", "needs an NVIDIA GPU; this machine has none"
    return None


def build_target(
    ctx: BuildContext, target: Target, ts: TargetStatus, repo_name: str, device: str, label: str = ""
) -> BuiltTarget | None:
    """Compile one target (or candidate), run it on the reference inputs, compare and package it.
    `repo_name` names the artifact's folder: a candidate's artifact is its target's if it wins."""
    label = label or target.name
    backend = get_backend(target.backend)
    compiled = compile_step(ctx, backend, target, ts, device, label)
    if compiled is None:
        return None
    artifact, runner = compiled
    if runner is None:
        exported = export_only(ctx, backend, target, ts, artifact, repo_name, device)
        ctx.packaged.append(ctx.build_dir(label))
        return exported
    started = time.perf_counter()
    ctx.reporter.stage(label, "validating against the source model")
    outputs = run_step(ctx, runner, target, ts)
    if outputs is None:
        return None
    compare_step(ctx, target, ts, outputs, "heldOutSamples" in artifact.options)
    static = artifact.options.get("exportedStatic")
    if static and ts.phase == "Succeeded":  # status says a dynamic signature was fixed
        ts.message = f"exported at static shapes {static} (the signature's opt): it runs only at these"
    elif ts.phase == "Succeeded":
        dims_step(ctx, runner, target, ts, label)
    ts.validation_seconds = round(time.perf_counter() - started, 3)
    repo_root = package_step(ctx, target, ts, artifact, outputs, repo_name, device)
    ctx.packaged.append(ctx.build_dir(label))
    digest = ts.artifact.digest if ts.artifact else ""
    params = {
        "backend": target.backend,
        "backend_version": backend.version(),
        "precision": target.precision,
        "hardware_class": ts.hardware_class or "",
        **{f"option.{k}": v for k, v in artifact.options.items()},
    }
    ctx.reporter.stage(label, f"packaged {digest[:19]}")
    passed = bool(ts.validation and ts.validation.passed)
    if not passed or (ctx.residency is not None and not ctx.residency.keep()):
        # A failed artifact is never timed: its copy of the weights goes at once.
        if passed and ctx.residency is not None:
            ctx.reporter.stage(label, ctx.residency.describe())
        runner = UnloadedRunner(runner, functools.partial(backend.load, artifact, ctx.threads, device))
        del compiled
        gc.collect()
    return BuiltTarget(target, ts, artifact, runner, repo_root, params)


def export_only(
    ctx: BuildContext,
    backend: Backend,
    target: Target,
    ts: TargetStatus,
    artifact: CompiledArtifact,
    repo_name: str,
    device: str,
) -> BuiltTarget:
    """An export-only backend's artifact (Core ML on Linux): packaged and recorded as Exported with
    the catalog's note, never validated, so neither selected nor served."""
    repo_root = package_step(ctx, target, ts, artifact, None, repo_name, device)
    ts.phase, ts.reason, ts.message = "Exported", "Exported", backend.entry.exported_note
    params = {
        "backend": target.backend,
        "backend_version": backend.version(),
        "precision": target.precision,
        "hardware_class": ts.hardware_class or "",
        **{f"option.{k}": v for k, v in artifact.options.items()},
    }
    return BuiltTarget(target, ts, artifact, None, repo_root, params)


def _fail(ts: TargetStatus, reason: str, err: BaseException, limit: int = 600) -> None:
    text = str(err).strip() or type(err).__name__
    ts.phase, ts.reason = "Failed", reason
    ts.message = text if len(text) <= limit else "..." + text[-limit:]


def compile_step(
    ctx: BuildContext, backend: Backend, target: Target, ts: TargetStatus, device: str, label: str
) -> tuple[CompiledArtifact, Runner | None] | None:
    """The backend builds the artifact and loads exactly what it built (nothing to load for an
    export-only backend); CompileFailed otherwise."""
    cm = ctx.cm
    out_dir = ctx.build_dir(label)
    # An empty folder: nothing an earlier run left here can reach this artifact (and no file that
    # an earlier artifact shares by hard link is written over).
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx.reporter.stage(label, f"compiling with {target.backend} {backend.version()} at {target.precision}")
    started = time.perf_counter()
    try:
        request = compile_request(
            target,
            out_dir=out_dir,
            signature=cm.spec.inputs,
            reference=ctx.reference,
            onnx_path=ctx.onnx_path,
            module=ctx.loaded.module,
            threads=ctx.threads,
            device=device,
            validation=cm.spec.validation,
            progress=lambda text: ctx.reporter.stage(label, text),
            source_quantized=bool(ctx.loaded.quantized),
            sized_inputs=ctx.dims.inputs if ctx.dims else (),
        )
        artifact = backend.compile(request)
        if int(artifact.options.get("calibrationSamples", "0")):
            # Said beside the count: the gate judged these samples as inputs calibration never saw.
            artifact.options["heldOutSamples"] = str(len(request.held_out_samples))
        runner = backend.load(artifact, ctx.threads, device) if backend.entry.validates else None
    except (BackendError, OptionsError) as err:
        # A backend's own environment names its failures (EnvironmentMissing, EnvironmentFailed).
        _fail(ts, getattr(err, "reason", "CompileFailed"), err)
        # Said as it happens, as a failed validation is: the summary table shows only the reason.
        ctx.reporter.stage(label, f"failed to compile: {ts.message}")
        return None
    ts.compile_seconds = round(time.perf_counter() - started, 3)
    return artifact, runner


def thresholds_of(cm: CompiledModel, target: Target, loaded: sources.LoadedSource) -> Thresholds:
    """The target's thresholds in a run of `cm` on the source `loaded`."""
    return _thresholds(target, cm.spec.validation, bool(loaded.quantized))


def _thresholds(target: Target, validation: Validation, source_quantized: bool) -> Thresholds:
    """Precision defaults (int8's for a source quantized already), then spec.validation's, then
    the target's."""
    precision = validate.gate_precision(target.precision, source_quantized)
    resolved = validate.resolve_thresholds(precision, validation.tolerances, target.tolerances)
    return resolved.model_copy(update={"detection_head": validation.detection_head})


def compile_request(
    target: Target,
    *,
    out_dir: Path,
    signature: Sequence[InputSpec],
    reference: RunResults | None = None,
    feeds: Sequence[Feeds] | None = None,
    onnx_path: Path | None = None,
    module: Any = None,
    threads: int | None = None,
    device: str = "cpu",
    validation: Validation | None = None,
    progress: Callable[[str], None] | None = None,
    source_quantized: bool = False,
    sized_inputs: Sequence[Feeds] = (),
) -> CompileRequest:
    """A backend's request for `target`: its options parsed by its catalog entry (OptionsError when
    bad), its thresholds and task from `validation` and the target, and the reference outputs: the
    run's saved ones, or (for backend tests and benchmarks) computed here on `feeds` from the
    module, else from the ONNX graph on ONNX Runtime without optimization."""
    validation = validation or Validation()
    if reference is None:
        reference = reference_results(list(feeds or []), signature, module, onnx_path, threads)
    return CompileRequest(
        onnx_path=onnx_path,
        out_dir=out_dir,
        target=target,
        signature=signature,
        reference=reference,
        options=entry(target.backend).parse_options(target.options),
        thresholds=_thresholds(target, validation, source_quantized),
        task=validation.task,
        threads=threads,
        module=module,
        device=device,
        progress=progress,
        sized_inputs=sized_inputs,
    )


def reference_results(
    feeds: list[Feeds],
    signature: Sequence[InputSpec],
    module: Any,
    onnx_path: Path | None,
    threads: int | None = None,
    label: str = "source",
    runner: Runner | None = None,
) -> RunResults:
    """The source model's outputs on `feeds`: eager when the module is at hand, else the ONNX graph
    on ONNX Runtime with every optimization off (`runner`, when the caller already has one)."""
    if not feeds:
        return RunResults(f"source:{label}", [], [], [])
    if module is not None:
        outputs = [list(o) for o in export.eager_outputs(module, feeds, signature)]
        inputs = [s.name for s in signature]
        names = export.names_for_outputs(len(outputs[0]), module, inputs) if outputs else []
        if onnx_path is not None:
            names = [o.name for o in triton.onnx_io(onnx_path)[1]]
        return RunResults(f"eager:{label}", names, outputs, feeds)
    if runner is None:
        if onnx_path is None:
            raise ValueError("reference outputs need the source module or its ONNX graph")
        from kompile.compile_jobs.reference import OnnxReferenceRunner

        runner = OnnxReferenceRunner(onnx_path, threads or 1)
    outputs = []
    for feed in feeds:
        try:
            outputs.append(runner.run(feed))
        except RUN_ERRORS as err:  # the source itself refused the inputs: the spec's to change
            shapes = {k: list(v.shape) for k, v in feed.items()}
            raise InputMismatch(
                f"the source model {label} failed on inputs shaped {shapes}: {err}; "
                f"{export.dims_hint(signature, feed)}"
                "check spec.inputs (names, dtypes, shapes) against the model"
            ) from None
    return RunResults(f"onnx:{label}", list(runner.output_names), outputs, feeds)


def run_step(ctx: BuildContext, runner: Runner, target: Target, ts: TargetStatus) -> RunResults | None:
    """The artifact's outputs on the saved reference inputs; RuntimeFailed when it cannot run."""
    try:
        outputs = [runner.run(f) for f in ctx.reference.inputs]
    except RUN_ERRORS as err:
        _fail(ts, getattr(err, "reason", "RuntimeFailed"), err)
        return None
    return ctx.reference.with_outputs(f"{target.backend}-{target.precision}", outputs)


def compare_step(
    ctx: BuildContext, target: Target, ts: TargetStatus, outputs: RunResults, calibrated: bool = False
) -> None:
    """Hold the outputs to the saved reference with the target's thresholds: the verdict.
    `calibrated`: the artifact's calibration left out calibration.held_out's samples."""
    from kompile.compile_jobs import run_results

    held = calibration.held_out(len(ctx.reference.inputs)) if calibrated else []
    thresholds = thresholds_of(ctx.cm, target, ctx.loaded)
    ts.validation = run_results.compare(ctx.reference, outputs, thresholds, ctx.cm.spec.validation.task, held)
    if ts.validation.passed:
        ts.phase, ts.reason, ts.message = "Succeeded", "Validated", None
    else:
        ts.phase, ts.reason = "Failed", "ValidationFailed"
        ts.message = "; ".join(ts.validation.failures)


def dims_step(ctx: BuildContext, runner: Runner, target: Target, ts: TargetStatus, label: str) -> None:
    """Hold a validated artifact to the source at the min, half the opt and the max of its dynamic
    dims besides the batch (kompile.compile_jobs.dims_check) and at the batch max where no benchmark
    batch holds it (kompile.compile_jobs.batch_check): a miss fails it as one at opt would."""
    thresholds = thresholds_of(ctx.cm, target, ctx.loaded)
    failures = ctx.dims.failures(runner, thresholds) if ctx.dims else []
    batch = ctx.batches.at_largest(runner, thresholds) if ctx.batches else []
    unchecked = [*(ctx.dims.unchecked if ctx.dims else []), *(ctx.batches.unchecked if ctx.batches else [])]
    for why in unchecked:
        ctx.reporter.stage(label, f"not checked at {why}")
        if ts.validation is not None:
            ts.validation.not_checked_at.append(why)
    if failures or batch:
        fail_at_other_sizes(ts, failures + batch)
        ctx.reporter.stage(label, f"failed validation {'; '.join(failures + batch)}")
    elif ts.validation is not None:
        ts.validation.checked_at += ctx.dims.checked if ctx.dims else []
        if ctx.batches and ctx.batches.largest_batch:
            ts.validation.checked_at.append(f"batch {ctx.batches.largest_batch}")


def package_step(
    ctx: BuildContext,
    target: Target,
    ts: TargetStatus,
    artifact: CompiledArtifact,
    outputs: RunResults | None,
    repo_name: str,
    device: str,
) -> Path:
    """The Triton model repository (`<root>/<model>/config.pbtxt`, `<root>/<model>/1/<files>`), with
    the saved reference and the artifact's own outputs beside it; the artifact's digest in status."""
    cm, name = ctx.cm, ctx.cm.metadata.name
    files = artifact.files()
    digest = sources.sha256_files([path for path, _ in files])
    repo_root = ctx.artifact_root / name / f"{repo_name}-{digest.split(':')[1][:12]}"
    serving = artifact.serving
    config = None
    if serving is not None and outputs is not None:
        if ctx.onnx_path is not None:
            in_specs, out_specs = triton.onnx_io(ctx.onnx_path)
        else:
            in_specs, out_specs = export.torch_io(ctx.loaded.module, cm.spec.inputs, outputs.output_names)
        if serving.triton_platform == triton.AOTI_PLATFORM:
            in_specs, out_specs = triton.aoti_io(in_specs, out_specs, target.precision)
        config = triton.config_pbtxt(
            name,
            serving.triton_platform,
            in_specs,
            out_specs,
            batch_max(cm.spec.inputs) or 0,
            "KIND_GPU" if device == "cuda" else "KIND_CPU",
            backend=serving.triton_backend,
            cuda_graphs=artifact.options.get("cudaGraphs") == "true",
            parameters=artifact.serving_parameters,
        )
    triton.write_model_repository(repo_root, name, files, config)
    shutil.copyfile(ctx.reference_file, repo_root / REFERENCE_FILE)
    if outputs is not None:  # an export-only artifact has none
        outputs.save(repo_root / OUTPUTS_FILE, with_inputs=False)
    size = sum(path.stat().st_size for path, _ in files)
    ts.artifact = Artifact(uri=repo_root.resolve().as_uri(), digest=digest, size_bytes=size)
    return repo_root
