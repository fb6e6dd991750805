"""TensorRT backend for NVIDIA GPU classes.

Steps (each recorded in the artifact's options):
1. prepare the graph on CPU (kompile.compile_jobs.trt.prep): fp32 as exported, fp16/bf16 through
   ModelOpt AutoCast, int8 through ModelOpt Q/DQ quantization calibrated on the reference inputs;
2. check the prepared graph on CPU with ONNX Runtime against the source model, with the precision's
   tolerances: a precision that cannot hold accuracy is refused before a GPU is involved;
3. build a strongly typed engine (trt.engine): optimization profiles from the signature, workspace,
   optimization level, the class's timing cache, optional hardware/version compatibility;
4. record the TensorRT version read from the plan's header (trt.plan).

`prepare_and_check` runs steps 1-2 on its own (no TensorRT needed), so CI tests them for real.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kompile.api.status import ValidationResult
from kompile.compile_jobs import validate
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    CompiledArtifact,
    CompileRequest,
)
from kompile.compile_jobs.trt import cache, engine, plan, prep, profiles

# Target options: name -> (default, accepted values; () means a non-negative integer).
OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "workspaceMiB": ("4096", ()),
    "optLevel": ("3", ("0", "1", "2", "3", "4", "5")),  # builder_optimization_level
    "hardwareCompatibility": ("none", tuple(engine.HARDWARE_COMPATIBILITY)),
    "versionCompatible": ("false", ("true", "false")),
    "profileSplit": (str(profiles.DEFAULT_SPLIT_RATIO), ()),  # 0: one profile however wide
    "highPrecision": ("fp16", ("fp16", "fp32")),  # int8: precision of the unquantized layers
    "calibrationMethod": ("entropy", ("entropy", "max")),
    "excludeOps": ("", ()),  # comma-separated op types kept at fp32 by AutoCast / quantization
    "cpuValidation": ("true", ("true", "false")),
    "cudaGraphs": ("false", ("true", "false")),  # Triton's CUDA graphs for this model
    "timingCacheDir": ("", ()),  # default: $KOMPILE_TIMING_CACHE_DIR
}
_FREE_TEXT = {"excludeOps", "timingCacheDir"}


def parse_options(raw: Mapping[str, str] | None) -> dict[str, str]:
    """target.options merged over the defaults; a bad key or value says what is accepted."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(OPTIONS))
    if unknown:
        raise BackendError(f"unknown tensorrt option(s) {unknown}; accepted: {sorted(OPTIONS)}")
    out = {}
    for key, (default, allowed) in OPTIONS.items():
        value = str(raw.get(key, default)).strip()
        if key not in _FREE_TEXT:
            value = value.lower()
            if not allowed and not value.isdigit():
                raise BackendError(f"option {key}={raw[key]!r}: use a non-negative integer")
            if allowed and value not in allowed:
                raise BackendError(f"option {key}={raw[key]!r}: use one of {list(allowed)}")
        out[key] = value
    if int(out["workspaceMiB"]) < 1:
        raise BackendError("option workspaceMiB must be at least 1")
    return out


@dataclass
class CheckedGraph:
    """A prepared graph and its CPU check (None when option cpuValidation=false)."""

    prepared: prep.PreparedGraph
    check: ValidationResult | None


def _reference(request: CompileRequest, threads: int | None) -> list[list[Any]]:
    """The source model's outputs on the calibration samples: eager when the module is at hand,
    else the exported graph on ONNX Runtime with every optimization off."""
    feeds = list(request.calibration)
    if request.module is not None:
        from kompile.compile_jobs.export import eager_outputs

        return [list(o) for o in eager_outputs(request.module, feeds, request.signature)]
    from kompile.compile_jobs.reference import OnnxReferenceRunner

    runner = OnnxReferenceRunner(request.onnx(), threads or 1)
    return [runner.run(f) for f in feeds]


def prepare_and_check(request: CompileRequest, opts: Mapping[str, str] | None = None) -> CheckedGraph:
    """Steps 1-2 on CPU: the graph TensorRT builds from, checked against the source model.

    Raises BackendError naming the missed thresholds when the precision cannot hold accuracy.
    """
    options = dict(opts) if opts is not None else parse_options(request.target.options)
    precision = request.target.precision
    excluded = [op.strip() for op in options["excludeOps"].split(",") if op.strip()]
    prepared = prep.prepare_graph(
        request.onnx(),
        precision,
        request.out_dir / "prepared",
        request.calibration,
        high_precision=options["highPrecision"],
        calibration_method=options["calibrationMethod"],
        exclude_ops=excluded,
    )
    if options["cpuValidation"] == "false" or not request.calibration:
        prepared.record["cpuValidation"] = "skipped"
        return CheckedGraph(prepared, None)
    thresholds = validate.resolve_thresholds(precision, request.target.tolerances)
    reference = _reference(request, request.threads)
    result = prep.check_on_cpu(prepared, reference, request.calibration, thresholds, request.threads)
    worst = min((o.cosine for o in result.outputs), default=1.0)
    prepared.record["cpuValidation"] = "passed" if result.passed else "failed"
    prepared.record["cpuMinCosine"] = f"{worst:.6f}"
    prepared.record["cpuMaxAbsError"] = f"{max((o.max_abs_error for o in result.outputs), default=0.0):.3g}"
    if precision == "bf16":
        prepared.record["cpuValidation"] += " (bf16 emulated: rounded storage, fp32 arithmetic)"
    if not result.passed:
        raise BackendError(
            f"the {precision} graph missed the validation thresholds on CPU, before any GPU build: "
            f"{'; '.join(result.failures)}. Build at a higher precision, keep the sensitive op types "
            "at fp32 (option excludeOps), or loosen the target's tolerances"
        )
    return CheckedGraph(prepared, result)


def _gpu_class() -> str | None:
    from kompile.compile_jobs.hardware import local_cuda_class

    return local_cuda_class()


class TensorRTBackend(Backend):
    name = "tensorrt"
    precisions = frozenset({"fp32", "fp16", "bf16", "int8"})
    device = "cuda"

    def version(self) -> str:
        try:
            return engine.trt_version()
        except BackendUnavailable:
            return "unavailable"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("tensorrt") is None:
            return (
                "TensorRT's Python package (tensorrt) is not installed here: run this target in the "
                "compile-gpu image (Dockerfile target compile-gpu, built on nvcr.io/nvidia/tensorrt), "
                "or pip install tensorrt on a machine with an NVIDIA GPU"
            )
        if _gpu_class() is None:
            return "TensorRT builds on an NVIDIA GPU of the target class; this machine has no CUDA GPU"
        return None

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        target = request.target
        if target.precision not in self.precisions:
            raise BackendError(
                f"target {target.name!r}: tensorrt builds {sorted(self.precisions)}, not {target.precision}"
            )
        opts = parse_options(target.options)
        checked = prepare_and_check(request, opts)
        trt_version = engine.trt_version()
        gpu_class = _gpu_class() or "gpu-unknown"
        split = int(opts["profileSplit"])
        derived = profiles.derive_profiles(request.signature, split if split else 0)
        cache_root = cache.timing_cache_root(opts["timingCacheDir"] or None)
        cache_path = cache.timing_cache_path(cache_root, gpu_class, trt_version) if cache_root else None
        settings = engine.BuildSettings(
            workspace_bytes=int(opts["workspaceMiB"]) << 20,
            optimization_level=int(opts["optLevel"]),
            hardware_compatibility=opts["hardwareCompatibility"],
            version_compatible=opts["versionCompatible"] == "true",
        )
        plan_bytes = engine.build_plan(checked.prepared.path, derived, settings, cache_path)
        model_path = request.out_dir / "model.plan"
        model_path.write_bytes(plan_bytes)
        header = plan.parse_header(plan_bytes)
        batched = any(s.shape[0] == -1 for s in request.signature)
        record = {
            "precision": target.precision,
            **checked.prepared.record,
            "profiles": profiles.describe(derived),
            "maxBatchSize": str(profiles.triton_max_batch(derived, batched)),
            "workspaceMiB": opts["workspaceMiB"],
            "optLevel": opts["optLevel"],
            "hardwareCompatibility": opts["hardwareCompatibility"],
            "versionCompatible": opts["versionCompatible"],
            "cudaGraphs": opts["cudaGraphs"],
            "timingCache": cache.timing_cache_relpath(gpu_class, trt_version) if cache_path else "none",
            "planTensorrtVersion": header.version,
            "gpuClass": gpu_class,
        }
        return CompiledArtifact(
            model_path=model_path,
            serving_format="tensorrt",
            triton_platform="tensorrt_plan",
            model_filename="model.plan",
            options=record,
            toolchain={"tensorrt": trt_version, **_toolchain()},
        )

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cuda") -> Any:
        if device != "cuda":
            raise BackendError(f"a TensorRT plan runs on cuda, not {device}")
        compatible = artifact.options.get("versionCompatible") == "true"
        return engine.TrtRunner(artifact.model_path, version_compatible=compatible)


def _toolchain() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("nvidia-modelopt", "onnx", "onnxruntime", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


BACKEND = TensorRTBackend()
