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
from kompile.api.resource import CompiledModel
from kompile.api.spec import Target
from kompile.api.status import Artifact, Baseline, CompiledModelStatus, LatencyStats, TargetStatus, summarize
from kompile.compile_jobs import benchmark as bench
from kompile.compile_jobs import export, inputs, sources, triton, validate
from kompile.compile_jobs.backends.base import (
    BackendError,
    BackendUnavailable,
    CompiledArtifact,
    CompileRequest,
    Runner,
    get_backend,
)
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


@dataclass
class BuiltTarget:
    """A target that compiled: what the benchmark and the registry need."""

    target: Target
    status: TargetStatus
    artifact: CompiledArtifact
    runner: Runner
    repo_dir: Path
    params: dict[str, str]


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
    return [Target(name=f"{cls}-{p}", backend=fleet.cpu_backend, precision=p) for p in fleet.precisions]


def _skip_reason(target: Target) -> tuple[str, str] | None:
    try:
        backend = get_backend(target.backend)
    except BackendUnavailable as err:
        return "BackendUnavailable", str(err)
    reason = backend.unavailable_reason()
    if reason:
        return "BackendUnavailable", reason
    if target.precision not in backend.precisions:
        return "UnsupportedPrecision", (
            f"backend {target.backend} supports {sorted(backend.precisions)}, not {target.precision}"
        )
    if backend.device == "cuda" and local_cuda_class() is None:
        return "NoMatchingHardware", "needs an NVIDIA GPU; this machine has none"
    return None


def run_pipeline(cm: CompiledModel, opts: PipelineOptions, reporter: Reporter) -> PipelineResult:
    """Run every servable target of `cm`; the status says what happened to each."""
    spec = cm.spec
    generation = cm.metadata.generation
    status = CompiledModelStatus()
    targets = [t for t in plan_targets(cm) if not opts.only_targets or t.name in opts.only_targets]
    hw_class = opts.hardware_class or local_cpu_class()
    threads = spec.benchmark.threads or os.cpu_count() or 1
    bench.set_threads(threads)

    reporter.stage(None, f"loading source {spec.source.uri}")
    s3_endpoint = spec.registry.s3_endpoint if spec.registry else None
    tracking = spec.registry.tracking_uri if spec.registry else None
    loaded = sources.load_source(spec.source, opts.base_dir, opts.work_dir / "cache", s3_endpoint, tracking)
    status.source_digest = loaded.digest
    feeds = _reference_feeds(cm, opts.base_dir)
    reporter.stage(None, f"exporting {loaded.label} to ONNX")
    onnx_path, output_names = export.export_onnx(
        loaded, spec.inputs, feeds[0], opts.work_dir / "export" / "model.onnx"
    )
    reference_runner = None if loaded.module is not None else _onnx_reference(onnx_path, threads)
    reporter.stage(None, f"computing reference outputs on {len(feeds)} samples")
    reference = _reference_outputs(loaded, reference_runner, feeds, cm)
    if not all(np.isfinite(o).all() for outs in reference for o in outs):
        raise sources.SourceError(
            f"the source model {loaded.label} itself yields NaN or Inf on the reference inputs: nothing "
            "can be validated against it; check the model's weights or the input ranges "
            "(spec.inputs low/high)"
        )

    result = PipelineResult(status=status, lineage=loaded.lineage)
    for target in targets:
        ts = TargetStatus(
            name=target.name,
            backend=target.backend,
            precision=target.precision,
            phase="Pending",
            hardware_class=hw_class,
        )
        skip = _skip_reason(target)
        if skip:
            ts.phase, ts.reason, ts.message = "Skipped", skip[0], skip[1]
        else:
            built = _build_target(
                cm, target, ts, onnx_path, output_names, feeds, reference, threads, loaded, opts, reporter
            )
            if built:
                result.built.append(built)
        status.targets.append(ts)

    _benchmark(cm, loaded, reference_runner, result, feeds, threads, reporter)
    for b in result.built:
        _write_result(b, cm, loaded.digest)
    for ts in status.targets:
        reporter.finished(ts)
    summarize(status, generation)
    return result


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
    cm: CompiledModel,
    target: Target,
    ts: TargetStatus,
    onnx_path: Path,
    output_names: list[str],
    feeds: list[inputs.Feed],
    reference: list[list[Any]],
    threads: int,
    loaded: sources.LoadedSource,
    opts: PipelineOptions,
    reporter: Reporter,
) -> BuiltTarget | None:
    backend = get_backend(target.backend)
    out_dir = opts.work_dir / "build" / target.name
    out_dir.mkdir(parents=True, exist_ok=True)
    reporter.stage(target.name, f"compiling with {target.backend} {backend.version()} at {target.precision}")
    request = CompileRequest(
        onnx_path=onnx_path,
        out_dir=out_dir,
        target=target,
        signature=cm.spec.inputs,
        calibration=feeds,
        threads=threads,
        module=loaded.module,
    )
    started = time.perf_counter()
    try:
        artifact = backend.compile(request)
        runner = backend.load(artifact, threads)
    except BackendError as err:
        ts.phase, ts.reason, ts.message = "Failed", "CompileFailed", _tail(err)
        return None
    ts.compile_seconds = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    reporter.stage(target.name, "validating against the source model")
    thresholds = validate.resolve_thresholds(
        target.precision, cm.spec.validation.tolerances, target.tolerances
    )
    try:
        candidate = [runner.run(f) for f in feeds]
    except (RuntimeError, ValueError) as err:
        ts.phase, ts.reason, ts.message = "Failed", "RuntimeFailed", _tail(err)
        return None
    ts.validation = validate.compare(reference, candidate, output_names, thresholds, cm.spec.validation.task)
    ts.validation_seconds = round(time.perf_counter() - started, 3)
    digest = sources.sha256_file(artifact.model_path)
    repo_root = opts.artifact_root / cm.metadata.name / f"{target.name}-{digest.split(':')[1][:12]}"
    in_specs, out_specs = triton.onnx_io(onnx_path)
    max_batch = _max_batch(cm)
    config = triton.config_pbtxt(
        cm.metadata.name,
        artifact.triton_platform,
        in_specs,
        out_specs,
        max_batch,
        "KIND_GPU" if backend.device == "cuda" else "KIND_CPU",
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


def _batch_feeds(cm: CompiledModel, batch: int) -> inputs.Feed | None:
    name = inputs.batch_dim(cm.spec.inputs)
    if name is None:
        return (
            inputs.generate_feeds(cm.spec.inputs, 1, cm.spec.validation.seed + 1)[0] if batch == 1 else None
        )
    return inputs.generate_feeds(cm.spec.inputs, 1, cm.spec.validation.seed + 1, {name: batch})[0]


def _benchmark(
    cm: CompiledModel,
    loaded: sources.LoadedSource,
    reference_runner: Runner | None,
    result: PipelineResult,
    feeds: list[inputs.Feed],
    threads: int,
    reporter: Reporter,
) -> None:
    """Time eager and every validated artifact interleaved, per batch size (noise hits all alike)."""
    b = cm.spec.benchmark
    timed = [x for x in result.built if x.status.validation and x.status.validation.passed]
    if not timed:
        return
    compiled_module = _torch_compile(loaded, cm, reporter) if b.torch_compile else None
    eager: list[LatencyStats] = []
    compiled: list[LatencyStats] = []
    for batch in b.batch_sizes:
        feed = _batch_feeds(cm, batch)
        if feed is None:
            continue
        reporter.stage(None, f"benchmarking batch {batch}: eager and {len(timed)} artifact(s)")
        fns: dict[str, Callable[[], object]] = {"eager": _reference_call(loaded, reference_runner, feed, cm)}
        if compiled_module is not None:
            fns["torch.compile"] = export.eager_callable(compiled_module[0], feed, cm.spec.inputs)
        for x in timed:
            fns[x.target.name] = _runner_call(x.runner, feed)
        stats = bench.time_interleaved(fns, batch, b.warmup, b.iterations)
        eager.append(stats["eager"])
        if "torch.compile" in stats:
            compiled.append(stats["torch.compile"])
        for x in timed:
            x.status.latency.append(stats[x.target.name])
    for x in timed:
        x.status.eager_latency = list(eager)
        if eager and x.status.latency:
            x.status.speedup = round(eager[0].p50_ms / x.status.latency[0].p50_ms, 3)
    result.status.baselines.append(Baseline(name="eager", latency=eager))
    if compiled_module is not None:
        result.status.baselines.append(
            Baseline(name="torch.compile", latency=compiled, compile_seconds=compiled_module[1])
        )


def _runner_call(runner: Runner, feed: inputs.Feed) -> Callable[[], object]:
    return lambda: runner.run(feed)


def _reference_call(
    loaded: sources.LoadedSource, runner: Runner | None, feed: inputs.Feed, cm: CompiledModel
) -> Callable[[], object]:
    if runner is not None:
        return lambda: runner.run(feed)
    fn: Callable[[], object] = export.eager_callable(loaded.module, feed, cm.spec.inputs)
    return fn


def _torch_compile(
    loaded: sources.LoadedSource, cm: CompiledModel, reporter: Reporter
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
