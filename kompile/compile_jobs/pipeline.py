"""The compile pipeline: source -> reference inputs -> ONNX -> per-target compile -> validate ->
benchmark (interleaved with the eager source) -> Triton layout + result.json -> status.

The same function runs in `kompile run` (every target this machine can serve) and in a compile
Job's pod (the one target it was launched for). Failures of one target never stop the others.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kompile import __version__
from kompile.api.candidates import backends_of, candidate_targets, is_multi, target_device
from kompile.api.resource import CompiledModel
from kompile.api.spec import Target
from kompile.api.status import Artifact, CompiledModelStatus, TargetStatus, summarize
from kompile.compile_jobs import benchmark as bench
from kompile.compile_jobs import export, inputs, sources, timing, triton, validate
from kompile.compile_jobs.backends.base import (
    BackendError,
    BackendUnavailable,
    CompileRequest,
    Runner,
    get_backend,
)
from kompile.compile_jobs.built import BuiltTarget, PlannedTarget
from kompile.compile_jobs.hardware import local_cpu_class, local_cuda_class


class Reporter(Protocol):
    """Where progress goes: a live display for the CLI, log lines in a Job's pod."""

    def stage(self, target: str | None, message: str) -> None: ...

    def finished(self, target: TargetStatus) -> None: ...


class LogReporter:
    """Plain progress lines (compile Jobs, --json runs)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit

    def stage(self, target: str | None, message: str) -> None:
        self.emit(f"[{target or 'pipeline'}] {message}")

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


__all__ = ["BuiltTarget", "LogReporter", "PipelineOptions", "PipelineResult", "Reporter", "run_pipeline"]


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


def _skip_reason(target: Target, device: str) -> tuple[str, str] | None:
    """Why this machine cannot build `target` for `device`, or None. Precision and device come
    first: `auto` drops a backend that cannot build them without reporting it."""
    try:
        backend = get_backend(target.backend)
    except BackendUnavailable as err:
        return "BackendUnavailable", str(err)
    if target.precision not in backend.precisions:
        return "UnsupportedPrecision", (
            f"backend {target.backend} supports {sorted(backend.precisions)}, not {target.precision}"
        )
    if not backend.supports_device(device):
        return "UnsupportedDevice", f"backend {target.backend} does not build for {device}"
    reason = backend.unavailable_reason()
    if reason:
        return "BackendUnavailable", reason
    if device == "cuda" and local_cuda_class() is None:
        return "NoMatchingHardware", "needs an NVIDIA GPU; this machine has none"
    return None


def run_pipeline(cm: CompiledModel, opts: PipelineOptions, reporter: Reporter) -> PipelineResult:
    """Run every servable target of `cm`; the status says what happened to each."""
    spec = cm.spec
    generation = cm.metadata.generation
    status = CompiledModelStatus()
    targets = [t for t in plan_targets(cm) if not opts.only_targets or t.name in opts.only_targets]
    threads = spec.benchmark.threads or os.cpu_count() or 1
    bench.set_threads(threads)

    reporter.stage(None, f"loading source {spec.source.uri}")
    s3_endpoint = spec.registry.s3_endpoint if spec.registry else None
    tracking = spec.registry.tracking_uri if spec.registry else None
    loaded = sources.load_source(spec.source, opts.base_dir, opts.work_dir / "cache", s3_endpoint, tracking)
    status.source_digest = loaded.digest
    feeds = _reference_feeds(cm, opts.base_dir)
    onnx_path: Path | None = None
    if loaded.module is None or _consumes_onnx(targets, opts):
        reporter.stage(None, f"exporting {loaded.label} to ONNX")
        onnx_path, output_names = export.export_onnx(
            loaded, spec.inputs, feeds[0], opts.work_dir / "export" / "model.onnx"
        )
    reference_runner = (
        None if loaded.module is not None or onnx_path is None else _onnx_reference(onnx_path, threads)
    )
    reporter.stage(None, f"computing reference outputs on {len(feeds)} samples")
    reference = _reference_outputs(loaded, reference_runner, feeds, cm)
    if onnx_path is None:
        output_names = export.names_for_outputs(len(reference[0]))
    if not all(np.isfinite(o).all() for outs in reference for o in outs):
        raise sources.SourceError(
            f"the source model {loaded.label} itself yields NaN or Inf on the reference inputs: nothing "
            "can be validated against it; check the model's weights or the input ranges "
            "(spec.inputs low/high)"
        )

    ctx = _BuildContext(cm, onnx_path, output_names, feeds, reference, threads, loaded, opts, reporter)
    planned = [_build_all(ctx, target) for target in targets]
    result = PipelineResult(status=status, lineage=loaded.lineage)
    timed = [
        timing.Timed(label, b.runner, b.status)
        for p in planned
        for label, b in p.labelled()
        if b.status.validation and b.status.validation.passed
    ]
    status.baselines = timing.run_benchmark(
        cm, loaded, reference_runner, timed, _batch_sizes(cm, targets), reporter
    )
    for p in planned:
        built = p.finish(cm.spec.benchmark.batch_sizes) if p.multi else next(iter(p.built), None)
        status.targets.append(p.status)
        if built:
            result.built.append(built)
            _write_result(built, cm, loaded.digest)
        reporter.finished(p.status)
    summarize(status, generation)
    return result


def _consumes_onnx(targets: Sequence[Target], opts: PipelineOptions) -> bool:
    """Whether any backend of the run compiles the ONNX export (inductor compiles the module, so a
    run of inductor targets alone neither pays for the export nor fails on what it cannot hold)."""
    return any(b != "inductor" for t in targets for b in backends_of(t, _device(t, opts)))


def _batch_sizes(cm: CompiledModel, targets: Sequence[Target]) -> list[int]:
    """Benchmark batch sizes plus any a target's selection decides at."""
    sizes = list(cm.spec.benchmark.batch_sizes)
    for t in targets:
        sel = t.selection
        if sel and sel.batch_size and sel.batch_size not in sizes:
            sizes.append(sel.batch_size)
    return sizes


@dataclass
class _BuildContext:
    cm: CompiledModel
    onnx_path: Path | None
    output_names: list[str]
    feeds: list[inputs.Feed]
    reference: list[list[Any]]
    threads: int
    loaded: sources.LoadedSource
    opts: PipelineOptions
    reporter: Reporter


def _device(target: Target, opts: PipelineOptions) -> str:
    return target_device(target, None if opts.device is None else opts.device == "cuda")


def _build_all(ctx: _BuildContext, target: Target) -> PlannedTarget:
    """Compile and validate the target, or each of its candidates."""
    hw_class = ctx.opts.hardware_class or local_cpu_class()
    device = _device(target, ctx.opts)
    ts = TargetStatus(
        name=target.name,
        backend=target.backend,
        precision=target.precision,
        phase="Pending",
        hardware_class=hw_class,
    )
    planned = PlannedTarget(target=target, status=ts, multi=is_multi(target))
    if not planned.multi:
        skip = _skip_reason(target, device)
        if skip:
            ts.phase, ts.reason, ts.message = "Skipped", skip[0], skip[1]
        elif built := _build_target(ctx, target, ts, target.name, device):
            planned.built.append(built)
        return planned
    auto = not target.candidates
    for cand in candidate_targets(target, device):
        cs = TargetStatus(
            name=cand.name,
            backend=cand.backend,
            precision=cand.precision,
            phase="Pending",
            hardware_class=hw_class,
        )
        skip = _skip_reason(cand, device)
        if skip and auto and skip[0] in ("UnsupportedPrecision", "UnsupportedDevice"):
            continue  # auto offers a backend only where it can build the precision
        if skip:
            cs.phase, cs.reason, cs.message = "Skipped", skip[0], skip[1]
        elif built := _build_target(ctx, cand, cs, target.name, device, label=f"{target.name}/{cand.name}"):
            planned.built.append(built)
        planned.candidates.append(cs)
    if not planned.candidates:
        ts.phase, ts.reason = "Skipped", "UnsupportedPrecision"
        ts.message = f"no backend for {device} can build precision {target.precision}"
    return planned


def _reference_feeds(cm: CompiledModel, base_dir: Path) -> list[inputs.Feed]:
    v = cm.spec.validation
    if v.dataset:
        path = sources.fetch(
            v.dataset,
            base_dir / ".kompile" / "cache",
            base_dir,
            cm.spec.registry.s3_endpoint if cm.spec.registry else None,
        )
        return inputs.load_dataset(path, cm.spec.inputs)
    return inputs.generate_feeds(cm.spec.inputs, v.samples, v.seed)


def _onnx_reference(onnx_path: Path, threads: int) -> Runner:
    """For ONNX sources the reference is the source graph on ONNX Runtime with no optimization."""
    from kompile.compile_jobs.reference import OnnxReferenceRunner

    return OnnxReferenceRunner(onnx_path, threads)


def _reference_outputs(
    loaded: sources.LoadedSource, runner: Runner | None, feeds: Sequence[inputs.Feed], cm: CompiledModel
) -> list[list[Any]]:
    if runner is not None:
        return [runner.run(f) for f in feeds]
    return export.eager_outputs(loaded.module, feeds, cm.spec.inputs)


def _tail(err: BaseException, limit: int = 600) -> str:
    text = str(err).strip() or type(err).__name__
    return text if len(text) <= limit else "..." + text[-limit:]


def _build_target(
    ctx: _BuildContext, target: Target, ts: TargetStatus, repo_name: str, device: str, label: str = ""
) -> BuiltTarget | None:
    """Compile one target (or candidate), load what was built and validate it. `repo_name` names
    the artifact's folder: a candidate's artifact is its target's if it wins."""
    cm, opts, reporter, threads = ctx.cm, ctx.opts, ctx.reporter, ctx.threads
    feeds, reference, onnx_path = ctx.feeds, ctx.reference, ctx.onnx_path
    label = label or target.name
    backend = get_backend(target.backend)
    out_dir = opts.work_dir / "build" / label
    out_dir.mkdir(parents=True, exist_ok=True)
    reporter.stage(label, f"compiling with {target.backend} {backend.version()} at {target.precision}")
    request = CompileRequest(
        onnx_path=onnx_path,
        out_dir=out_dir,
        target=target,
        signature=cm.spec.inputs,
        calibration=feeds,
        threads=threads,
        module=ctx.loaded.module,
        device=device,
    )
    started = time.perf_counter()
    try:
        artifact = backend.compile(request)
        runner = backend.load(artifact, threads, device)
    except BackendError as err:
        ts.phase, ts.reason, ts.message = "Failed", "CompileFailed", _tail(err)
        return None
    ts.compile_seconds = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    reporter.stage(label, "validating against the source model")
    thresholds = validate.resolve_thresholds(
        target.precision, cm.spec.validation.tolerances, target.tolerances
    )
    try:
        candidate = [runner.run(f) for f in feeds]
    except (RuntimeError, ValueError) as err:
        ts.phase, ts.reason, ts.message = "Failed", "RuntimeFailed", _tail(err)
        return None
    ts.validation = validate.compare(
        reference, candidate, ctx.output_names, thresholds, cm.spec.validation.task
    )
    ts.validation_seconds = round(time.perf_counter() - started, 3)
    digest = sources.sha256_file(artifact.model_path)
    repo_root = opts.artifact_root / cm.metadata.name / f"{repo_name}-{digest.split(':')[1][:12]}"
    if onnx_path is not None:
        in_specs, out_specs = triton.onnx_io(onnx_path)
    else:
        in_specs, out_specs = export.torch_io(ctx.loaded.module, cm.spec.inputs, ctx.output_names)
    if artifact.triton_platform == triton.AOTI_PLATFORM:
        in_specs, out_specs = triton.aoti_io(in_specs, out_specs, target.precision)
    max_batch = _max_batch(cm)
    config = triton.config_pbtxt(
        cm.metadata.name,
        artifact.triton_platform,
        in_specs,
        out_specs,
        max_batch,
        "KIND_GPU" if device == "cuda" else "KIND_CPU",
        cuda_graphs=artifact.options.get("cudaGraphs") == "true",
    )
    triton.write_model_repository(
        repo_root, cm.metadata.name, artifact.model_path, artifact.model_filename, config
    )
    ts.artifact = Artifact(
        uri=repo_root.resolve().as_uri(), digest=digest, size_bytes=artifact.model_path.stat().st_size
    )
    if ts.validation.passed:
        ts.phase, ts.reason, ts.message = "Succeeded", "Validated", None
    else:
        ts.phase, ts.reason = "Failed", "ValidationFailed"
        ts.message = "; ".join(ts.validation.failures)
    params = {
        "backend": target.backend,
        "backend_version": backend.version(),
        "precision": target.precision,
        "hardware_class": ts.hardware_class or "",
        **{f"option.{k}": v for k, v in artifact.options.items()},
    }
    return BuiltTarget(target, ts, artifact, runner, repo_root, params)


def _max_batch(cm: CompiledModel) -> int:
    first = cm.spec.inputs[0]
    for d in first.dynamic_dims or []:
        if d.axis == 0:
            return d.max
    return 0


def _write_result(b: BuiltTarget, cm: CompiledModel, source_digest: str) -> None:
    doc = {
        "apiVersion": cm.api_version,
        "compiledModel": cm.metadata.name,
        "generation": cm.metadata.generation,
        "sourceUri": cm.spec.source.uri,
        "sourceDigest": source_digest,
        "target": b.status.to_wire(),
        "options": b.artifact.options,
        "toolchain": {"kompile": __version__, **b.artifact.toolchain},
        "signature": [i.to_wire() for i in cm.spec.inputs],
    }
    (b.repo_dir / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
