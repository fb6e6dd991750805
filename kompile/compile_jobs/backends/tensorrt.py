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
from dataclasses import dataclass
from typing import Any

from kompile.api.catalog.tensorrt import TensorRTOptions
from kompile.api.status import ValidationResult
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    CompiledArtifact,
    CompileRequest,
    options_of,
)
from kompile.compile_jobs.trt import cache, engine, plan, prep, profiles

# Options recorded with the artifact as given (the preparation records its own).
_RECORDED = ("workspaceMiB", "optLevel", "hardwareCompatibility", "versionCompatible", "cudaGraphs")


@dataclass
class CheckedGraph:
    """A prepared graph and its CPU check (None when option cpuValidation=false)."""

    prepared: prep.PreparedGraph
    check: ValidationResult | None


def prepare_and_check(request: CompileRequest) -> CheckedGraph:
    """Steps 1-2 on CPU: the graph TensorRT builds from, checked against the run's saved reference
    outputs with the target's thresholds and task (spec.validation's, then the target's).

    Raises BackendError naming the missed thresholds when the precision cannot hold accuracy.
    """
    options = options_of(request, TensorRTOptions)
    precision = request.target.precision
    excluded = [op.strip() for op in options.exclude_ops.split(",") if op.strip()]
    prepared = prep.prepare_graph(
        request.onnx(),
        precision,
        request.out_dir / "prepared",
        request.calibration,
        high_precision=options.high_precision,
        calibration_method=options.calibration_method,
        exclude_ops=excluded,
    )
    if not options.cpu_validation or not request.calibration:
        prepared.record["cpuValidation"] = "skipped"
        return CheckedGraph(prepared, None)
    result = prep.check_on_cpu(prepared, request.reference, request.thresholds, request.task, request.threads)
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

    def installed_versions(self) -> dict[str, str]:
        # TensorRT's wheels ship under several distribution names (tensorrt, tensorrt-cu12, ...):
        # ask the module itself.
        out = super().installed_versions()
        try:
            out["tensorrt"] = engine.trt_version()
        except BackendUnavailable:
            out.pop("tensorrt", None)
        return out

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
        self.check_request(request)
        target = request.target
        opts = options_of(request, TensorRTOptions)
        checked = prepare_and_check(request)
        trt_version = engine.trt_version()
        gpu_class = _gpu_class() or "gpu-unknown"
        split = opts.profile_split
        derived = profiles.derive_profiles(request.signature, split if split else 0)
        cache_root = cache.timing_cache_root(opts.timing_cache_dir or None)
        cache_path = cache.timing_cache_path(cache_root, gpu_class, trt_version) if cache_root else None
        settings = engine.BuildSettings(
            workspace_bytes=opts.workspace_mi_b << 20,
            optimization_level=int(opts.opt_level),
            hardware_compatibility=opts.hardware_compatibility,
            version_compatible=opts.version_compatible,
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
            **{k: v for k, v in opts.record().items() if k in _RECORDED},
            "timingCache": cache.timing_cache_relpath(gpu_class, trt_version) if cache_path else "none",
            "planTensorrtVersion": header.version,
            "gpuClass": gpu_class,
        }
        return CompiledArtifact(
            backend=self.name,
            model_path=model_path,
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
