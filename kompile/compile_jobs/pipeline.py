"""The compile pipeline: source -> reference inputs -> ONNX (when a backend consumes it) -> saved
reference outputs -> per-target build (kompile.compile_jobs.build: compile, run, compare, package)
-> benchmark (interleaved with the eager source) -> result.json -> status.

The same function runs in `kompile run` (every target this machine can serve) and in a compile
Job's pod (the one target it was launched for). Failures of one target never stop the others.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kompile import __version__
from kompile.api.candidates import backends_of, target_device
from kompile.api.catalog import entry
from kompile.api.job_contract import RESULT_FILE, JobDeadline, JobResult
from kompile.api.resource import CompiledModel
from kompile.api.spec import Target
from kompile.api.status import Baseline, CompiledModelStatus, TargetStatus, summarize
from kompile.compile_jobs import benchmark as bench
from kompile.compile_jobs import detections, export, inputs, sources, timing
from kompile.compile_jobs.backends.base import Runner
from kompile.compile_jobs.batch_check import BatchCheck
from kompile.compile_jobs.build import BuildContext, plan_target, reference_results, thresholds_of
from kompile.compile_jobs.built import BuiltTarget, PlannedTarget
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.dims_check import DimsCheck
from kompile.compile_jobs.hardware import local_arch, local_cpu_class
from kompile.compile_jobs.residency import Residency, memory_limit, weights_bytes
from kompile.compile_jobs.run_results import OUTPUTS_FILE, REFERENCE_FILE, RunResults
from kompile.compile_jobs.validate import labels_problem, listed

EXPORT_DIR = "export"
"""The work dir's folder for the ONNX export, removed when the run ends."""


class Reporter(Protocol):
    """Where progress goes: a live display for the CLI, log lines in a Job's pod."""

    def stage(self, target: str | None, message: str) -> None: ...

    def finished(self, target: TargetStatus) -> None: ...


def progress_line(target: str | None, message: str) -> str:
    """One progress line as a Job's log (and its progress note) shows it."""
    return f"[{target or 'pipeline'}] {message}"


class LogReporter:
    """Plain progress lines (compile Jobs, --json runs)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit

    def stage(self, target: str | None, message: str) -> None:
        self.emit(progress_line(target, message))

    def finished(self, target: TargetStatus) -> None:
        self.emit(f"[{target.name}] {target.phase}{': ' + (target.message or '') if target.message else ''}")


@dataclass
class PipelineOptions:
    base_dir: Path
    """Folder the manifest's relative paths (and python:// factories) resolve from."""
    work_dir: Path
    """Scratch and cache folder (.kompile by default)."""
    artifact_root: Path
    only_targets: Sequence[str] | None = None
    hardware_class: str | None = None
    """Override of this machine's class (a compile Job is told its class by the operator)."""
    device: str | None = None
    """cpu or cuda for every target (a compile Job is told its class's device); None: each
    target's own (options.device, else cuda only for GPU-only backends)."""
    arch: str | None = None
    """The class's architecture (a compile Job is told it); None: this machine's. Decides which
    backends auto offers (catalog `auto_arches`)."""
    deadline: JobDeadline | None = None
    """When the compile Job's deadline ends (it is told): no candidate starts in its last share."""


__all__ = [
    "BuiltTarget",
    "LogReporter",
    "PipelineOptions",
    "PipelineResult",
    "Reporter",
    "progress_line",
    "run_pipeline",
]


@dataclass
class PipelineResult:
    status: CompiledModelStatus
    built: list[BuiltTarget] = field(default_factory=list)
    lineage: dict[str, str] = field(default_factory=dict)


def plan_targets(cm: CompiledModel) -> list[Target]:
    """Explicit targets, or one per precision on this machine's CPU class in fleet mode."""
    if cm.spec.targets:
        return list(cm.spec.targets)
    fleet = cm.spec.fleet
    assert fleet is not None and fleet.enabled  # the spec validator guarantees one of the two
    cls = local_cpu_class()
    return [
        Target(name=f"{cls}-{p}", backend=fleet.cpu_backend, precision=p, selection=fleet.selection)
        for p in fleet.precisions
    ]


def run_pipeline(cm: CompiledModel, opts: PipelineOptions, reporter: Reporter) -> PipelineResult:
    """Run every servable target of `cm`; the status says what happened to each."""
    spec = cm.spec
    status = CompiledModelStatus()
    targets = [t for t in plan_targets(cm) if not opts.only_targets or t.name in opts.only_targets]
    # The cores this process may run on (a Job's cpuset), not the node's: pools sized to the host
    # oversubscribe a pinned Job.
    threads = spec.benchmark.threads or available_cores()
    limit = memory_limit()  # a bad KOMPILE_MEMORY_LIMIT stops the run before any work
    bench.set_threads(threads)

    reporter.stage(None, f"loading source {spec.source.uri}")
    registry = spec.registry
    loaded = sources.load_source(
        spec.source,
        opts.base_dir,
        opts.work_dir / "cache",
        registry.s3_endpoint if registry else None,
        registry.tracking_uri if registry else None,
    )
    status.source_digest = loaded.digest
    feeds, labels = _reference_feeds(cm, opts.base_dir)
    if loaded.module is not None:  # inputs by name, outputs one tuple: what every consumer expects
        from kompile.compile_jobs.source_module import adapt

        loaded.module = adapt(loaded.module, spec.inputs, export.to_torch(feeds[0], spec.inputs))
    onnx_path, export_error = _export_if_consumed(cm, loaded, targets, feeds, opts, reporter)
    # An ONNX source's reference is the file as given, not the working copy the backends compile.
    reference_runner = (
        None
        if loaded.onnx_path is None
        else _onnx_reference(loaded.onnx_path, threads, opts.work_dir / EXPORT_DIR / "reference")
    )
    reference = _reference_results(cm, loaded, reference_runner, feeds, onnx_path, reporter)
    if labels is not None:  # checked once against the source, before any compile
        problem = labels_problem(reference.outputs, reference.output_names, labels)
        if problem:
            raise inputs.InputMismatch(f"spec.validation.dataset {cm.spec.validation.dataset}: {problem}")
    if cm.spec.validation.task == "detection":  # a detector's head found once, before any compile
        kind = cm.spec.validation.detection_head
        head, problem = detections.head_output(reference.outputs, reference.output_names, kind)
        if head is None:
            raise inputs.InputMismatch(f"spec.validation.task detection: {problem}")
    reference.labels = labels
    reference_file = reference.save(opts.work_dir / REFERENCE_FILE)

    ctx = BuildContext(
        cm=cm,
        onnx_path=onnx_path,
        reference=reference,
        reference_file=reference_file,
        threads=threads,
        loaded=loaded,
        work_dir=opts.work_dir,
        artifact_root=opts.artifact_root,
        hardware_class=opts.hardware_class or local_cpu_class(),
        reporter=reporter,
        arch=opts.arch or local_arch(),
        residency=Residency.for_run(weights_bytes(loaded.module, onnx_path), limit),
        deadline=opts.deadline,
        reference_runner=reference_runner,
        export_error=export_error,
    )

    def source_on(more: list[inputs.Feed]) -> RunResults:
        return reference_results(
            more, spec.inputs, loaded.module, onnx_path, label=loaded.label, runner=reference_runner
        )

    ctx.dims = DimsCheck(spec.inputs, reference, source_on, spec.validation.task)
    check = BatchCheck(spec.inputs, reference, source_on, spec.validation.task)
    largest = check.largest(_batch_sizes(cm, targets))
    other = [ctx.dims.planned(), f"batch {largest}" if largest else ""]
    if any(other):
        reporter.stage(None, f"computing reference outputs at {' and '.join(o for o in other if o)}")
    # Before any compile: a declared bound the source fails at refuses the spec.
    ctx.dims.prepare()
    if largest:
        check.prepare(largest)
        ctx.batches = check
    planned = [plan_target(ctx, t, _device(t, opts)) for t in targets]
    status.baselines = _benchmark(cm, loaded, reference_runner, planned, targets, reporter, check)
    result = PipelineResult(status=status, lineage=loaded.lineage)
    for p in planned:
        built = p.finish(_timed_batches(cm)) if p.multi else next(iter(p.built), None)
        status.targets.append(p.status)
        if built:
            result.built.append(built)
            write_result(built, cm, loaded.digest)
        reporter.finished(p.status)
    summarize(status, cm.metadata.generation)
    _tidy(ctx, opts.work_dir / EXPORT_DIR)
    return result


def _tidy(ctx: BuildContext, export_dir: Path) -> None:
    """Remove what the run's artifacts now hold (each packaged build folder) and the ONNX export:
    a run leaves one copy of each artifact, not three. A failed build keeps its folder and log."""
    for folder in ctx.packaged:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # a candidate's target/ folder, once its last one is gone
            folder.parent.rmdir()
    shutil.rmtree(export_dir, ignore_errors=True)


def _device(target: Target, opts: PipelineOptions) -> str:
    return target_device(target, None if opts.device is None else opts.device == "cuda")


def _export_if_consumed(
    cm: CompiledModel,
    loaded: sources.LoadedSource,
    targets: Sequence[Target],
    feeds: list[inputs.Feed],
    opts: PipelineOptions,
    reporter: Reporter,
) -> tuple[Path | None, str | None]:
    """The ONNX export, made only when the source is ONNX or a backend of the run compiles ONNX
    (the catalog says which): a run of torch-consuming backends neither pays for the export nor
    fails on what it cannot hold. Where the export of a PyTorch source fails and a backend of the
    run compiles the PyTorch model itself, the run goes on without it: the export's error is
    returned for each ONNX backend's candidate to tell (ExportFailed)."""
    arch = opts.arch or local_arch()
    used = {b for t in targets for b in backends_of(t, _device(t, opts), arch)}
    consumers = {b for b in used if entry(b).consumes == "onnx"}
    if loaded.module is not None and not consumers:
        return None, None
    if loaded.onnx_path is not None:
        reporter.stage(None, f"reading the ONNX graph of {loaded.label}")
    else:
        reporter.stage(None, f"exporting {loaded.label} to ONNX")
    out = opts.work_dir / EXPORT_DIR / "model.onnx"
    try:
        path, _ = export.export_onnx(loaded, cm.spec.inputs, feeds[0], out, lambda m: reporter.stage(None, m))
    except export.ExportError as err:
        direct = sorted(b for b in used if entry(b).consumes == "torch" and not entry(b).stand_in)
        if loaded.module is None or not direct:
            raise
        reporter.stage(None, f"{err}; building what compiles the PyTorch model itself: {', '.join(direct)}")
        return None, str(err)
    return path, None


def _reference_feeds(cm: CompiledModel, base_dir: Path) -> tuple[list[inputs.Feed], np.ndarray | None]:
    """The reference inputs, and their class labels when the dataset names them."""
    v = cm.spec.validation
    if v.dataset:
        path = sources.fetch(
            v.dataset,
            base_dir / ".kompile" / "cache",
            base_dir,
            cm.spec.registry.s3_endpoint if cm.spec.registry else None,
        )
        return inputs.load_dataset(path, cm.spec.inputs, v.labels_key)
    return inputs.generate_feeds(cm.spec.inputs, v.samples, v.seed), None


def _onnx_reference(onnx_path: Path, threads: int, folder: Path) -> Runner:
    """For ONNX sources the reference is the source graph on ONNX Runtime with no optimization;
    from a copy in `folder` when its IR version or opset is newer than ONNX Runtime reads."""
    from kompile.compile_jobs.onnx_upgrade import readable_copy
    from kompile.compile_jobs.reference import OnnxReferenceRunner
    from kompile.compile_jobs.source_files import read_onnx_graph

    path = readable_copy(onnx_path, read_onnx_graph(onnx_path), folder)
    return OnnxReferenceRunner(path, threads, shown=onnx_path)


def _reference_results(
    cm: CompiledModel,
    loaded: sources.LoadedSource,
    runner: Runner | None,
    feeds: list[inputs.Feed],
    onnx_path: Path | None,
    reporter: Reporter,
) -> RunResults:
    """The source model's outputs on the reference inputs, computed once for every check of the run."""
    reporter.stage(None, f"computing reference outputs on {len(feeds)} samples")
    reference = reference_results(
        feeds, cm.spec.inputs, loaded.module, onnx_path, label=loaded.label, runner=runner
    )
    bad = reference.nonfinite()
    if not bad:
        return reference
    # A NaN the dataset fed in is the dataset's to fix (a tabular model may take NaN as missing:
    # inputs alone are never refused); one the model made of clean inputs is the model's.
    fed = [i for i in bad if not all(_finite(a) for a in feeds[i].values())]
    dataset = cm.spec.validation.dataset
    if dataset and fed:
        raise sources.SourceError(
            f"spec.validation.dataset {dataset}: its inputs hold NaN or Inf at "
            f"sample{'s' if len(fed) > 1 else ''} {listed(fed)} (axis 0), "
            "where the source model's outputs are NaN or Inf too: nothing can be validated against "
            "them; drop or fix those samples"
        )
    raise sources.SourceError(
        f"the source model {loaded.label} itself yields NaN or Inf on {len(bad)} of {len(feeds)} "
        f"samples ({listed(bad)}): nothing can be "
        "validated against it; check the model's weights or the input ranges (spec.inputs low/high)"
    )


def _finite(a: np.ndarray[Any, Any]) -> bool:
    return not np.issubdtype(a.dtype, np.floating) or bool(np.isfinite(a).all())


def _benchmark(
    cm: CompiledModel,
    loaded: sources.LoadedSource,
    reference_runner: Runner | None,
    planned: Sequence[PlannedTarget],
    targets: Sequence[Target],
    reporter: Reporter,
    check: BatchCheck,
) -> list[Baseline]:
    """Time eager and every validated artifact in the same interleaved rounds, each validated at
    every batch size it is timed at."""
    timed_at = _timed_batches(cm)
    if timed_at != list(cm.spec.benchmark.batch_sizes):
        reporter.stage(
            None,
            f"the inputs are static at batch {timed_at[0]}: timing that batch only "
            f"(spec.benchmark.batchSizes {cm.spec.benchmark.batch_sizes} needs a dynamic dim on axis 0)",
        )
    timed = [
        timing.Timed(label, b.runner, b.status, thresholds_of(cm, b.target, loaded))
        for p in planned
        for label, b in p.labelled()
        if b.runner is not None and b.status.validation and b.status.validation.passed
    ]
    batches = _batch_sizes(cm, targets)
    return timing.run_benchmark(cm, loaded, reference_runner, timed, batches, reporter, check)


def _timed_batches(cm: CompiledModel) -> list[int]:
    """spec.benchmark.batchSizes; a static signature runs at its own batch only (a [2, 3, 224, 224]
    input is timed as batch 2, whatever the list says: throughput counts the samples it holds)."""
    static = inputs.static_batch(cm.spec.inputs)
    return [static] if static is not None else list(cm.spec.benchmark.batch_sizes)


def _batch_sizes(cm: CompiledModel, targets: Sequence[Target]) -> list[int]:
    """Benchmark batch sizes plus any a target's selection decides at."""
    sizes = _timed_batches(cm)
    if inputs.static_batch(cm.spec.inputs) is not None:
        return sizes  # the one batch it runs at: a selection batch elsewhere has nothing to time
    for t in targets:
        sel = t.selection
        if sel and sel.batch_size and sel.batch_size not in sizes:
            sizes.append(sel.batch_size)
    return sizes


def write_result(b: BuiltTarget, cm: CompiledModel, source_digest: str) -> None:
    """result.json beside the artifact (kompile.api.job_contract.JobResult), written last."""
    doc = JobResult(
        api_version=cm.api_version,
        compiled_model=cm.metadata.name,
        generation=cm.metadata.generation,
        source_uri=cm.spec.source.uri,
        source_digest=source_digest,
        target=b.status,
        backend_version=b.params.get("backend_version"),
        options=b.artifact.options,
        toolchain={"kompile": __version__, **b.artifact.toolchain},
        signature=list(cm.spec.inputs),
        saved_results={"reference": REFERENCE_FILE, "outputs": OUTPUTS_FILE},
        files={
            p.relative_to(b.repo_dir).as_posix(): p.stat().st_size
            for p in sorted(b.repo_dir.rglob("*"))
            if p.is_file() and p.name != RESULT_FILE
        },
    )
    (b.repo_dir / RESULT_FILE).write_text(doc.dumps())
