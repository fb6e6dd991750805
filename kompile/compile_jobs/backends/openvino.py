"""OpenVINO backend for CPUs: the ONNX export read into an OpenVINO model, int8 by NNCF post-training
quantization calibrated on the reference inputs, saved as IR (`model.xml` + `model.bin`).

Steps, each recorded in the artifact's options:
- `ov.convert_model` reads the exported ONNX graph (dynamic axes stay dynamic);
- int8: `nncf.quantize` with the run's reference inputs as calibration data, in transformer mode
  for graphs with attention (Softmax next to MatMuls), `mixed` preset there (asymmetric
  activations), `performance` otherwise, fast bias correction unless told otherwise;
- `ov.save_model(..., compress_to_fp16=False)`: weights stay fp32 on disk (the default would halve
  them to fp16, a precision nobody asked for);
- precision at run time is a property of the compiled model, not of the IR: fp32 sets
  INFERENCE_PRECISION_HINT=f32 explicitly (on a CPU with AVX-512 BF16 or AMX, OpenVINO runs bf16 by
  default), bf16 sets bf16 and is refused on a CPU without bf16 instructions (OpenVINO would quietly
  run fp32). The same properties go into the Triton config, so the server runs what was validated.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from kompile.api.catalog.openvino import OpenVinoOptions
from kompile.compile_jobs.backends.base import (
    Backend,
    BackendError,
    CompiledArtifact,
    CompileRequest,
    Feeds,
    options_of,
)
from kompile.compile_jobs.benchmark import available_cores
from kompile.compile_jobs.hardware import cpu_description, has_fast_bf16

Array = np.ndarray[Any, Any]
# Runtime properties recorded with the artifact and passed to Triton's OpenVINO backend.
RUNTIME_KEYS = ("PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "NUM_STREAMS")
_PRECISION_HINT = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}
# What OpenVINO raises for a graph or property it cannot take (RuntimeError from its C++ core).
OV_ERRORS = (RuntimeError, ValueError, TypeError)


# Attention as OpenVINO's conversion leaves it: fused into ScaledDotProductAttention, or a softmax.
_ATTENTION_OPS = {"ScaledDotProductAttention", "Softmax", "SoftMax"}


def is_transformer(model: ov.Model) -> bool:
    """Attention in the graph, beside two or more MatMuls."""
    types = [op.get_type_name() for op in model.get_ops()]
    return bool(_ATTENTION_OPS & set(types)) and types.count("MatMul") >= 2


def runtime_properties(precision: str, opts: OpenVinoOptions, threads: int) -> dict[str, str]:
    return {
        "PERFORMANCE_HINT": opts.performance_hint.upper(),
        "INFERENCE_PRECISION_HINT": _PRECISION_HINT[precision],
        "INFERENCE_NUM_THREADS": str(threads),
        # One stream serves one request at a time at full width: the latency hint's choice, made
        # explicit so the server does the same.
        "NUM_STREAMS": "1" if opts.performance_hint == "latency" else "AUTO",
    }


def quantize(
    model: ov.Model, request: CompileRequest, opts: OpenVinoOptions, record: dict[str, str]
) -> ov.Model:
    """NNCF post-training int8 quantization calibrated on the reference inputs."""
    import nncf

    if not request.calibration:
        raise BackendError("openvino int8 calibrates on reference inputs and the run has none")
    names = [port.get_any_name() for port in model.inputs]
    missing = [n for n in names if n not in request.calibration[0]]
    if missing:
        raise BackendError(f"openvino int8: the reference inputs lack the model's inputs {missing}")
    transformer = is_transformer(model) if opts.model_type == "auto" else opts.model_type == "transformer"
    preset = opts.preset if opts.preset != "auto" else ("mixed" if transformer else "performance")
    ignored = [t.strip() for t in opts.ignored_types.split(",") if t.strip()]
    dataset = nncf.Dataset(list(request.calibration), lambda feed: {n: feed[n] for n in names})
    try:
        # NNCF draws progress bars on stdout, which belongs to `kompile run --json`.
        with contextlib.redirect_stdout(sys.stderr):
            quantized = nncf.quantize(
                model,
                dataset,
                preset=nncf.QuantizationPreset.MIXED
                if preset == "mixed"
                else nncf.QuantizationPreset.PERFORMANCE,
                model_type=nncf.ModelType.TRANSFORMER if transformer else None,
                subset_size=len(request.calibration),
                fast_bias_correction=opts.fast_bias_correction,
                ignored_scope=nncf.IgnoredScope(types=ignored) if ignored else None,
            )
    except (*OV_ERRORS, nncf.errors.ValidationError) as err:
        raise BackendError(
            f"NNCF int8 quantization failed: {str(err).strip().splitlines()[0]}; keep op types in float "
            "with option ignoredTypes, or build at bf16 or fp32"
        ) from err
    fq = sum(1 for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize")
    record.update(
        quantization="nncf-ptq",
        modelType="transformer" if transformer else "none",
        preset=preset,
        fastBiasCorrection=str(opts.fast_bias_correction).lower(),
        calibrationSamples=str(len(request.calibration)),
        fakeQuantizeNodes=str(fq),
    )
    if ignored:
        record["ignoredTypes"] = ",".join(ignored)
    return quantized


class OvRunner:
    """The saved IR compiled for the CPU with the artifact's runtime properties."""

    def __init__(self, xml: Path, properties: dict[str, str]) -> None:
        core = ov.Core()
        try:
            self.compiled = core.compile_model(str(xml), "CPU", properties)
        except OV_ERRORS as err:
            raise BackendError(f"OpenVINO cannot compile {xml.name} for this CPU: {err}") from err
        self.request = self.compiled.create_infer_request()
        self.input_names = [p.get_any_name() for p in self.compiled.inputs]
        self.output_names = [p.get_any_name() for p in self.compiled.outputs]
        self._dtypes = {p.get_any_name(): p.get_element_type().to_dtype() for p in self.compiled.inputs}

    def run(self, feeds: Feeds) -> list[Array]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BackendError(f"inputs {missing} missing; the model takes {self.input_names}")
        inputs = {n: np.ascontiguousarray(feeds[n], dtype=self._dtypes[n]) for n in self.input_names}
        result = self.request.infer(inputs)
        # The request owns its output buffers and reuses them: copy before the next call.
        return [np.array(result[port]) for port in self.compiled.outputs]


class OpenVinoBackend(Backend):
    name = "openvino"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        opts = options_of(request, OpenVinoOptions)
        precision = request.target.precision
        if precision == "bf16" and not has_fast_bf16():
            raise BackendError(
                f"this CPU ({cpu_description()}) has no bf16 instructions (AVX-512 BF16 or AMX): "
                "OpenVINO would run fp32 and call it bf16; build fp32 or int8 for this class"
            )
        try:
            model = ov.convert_model(str(request.onnx()))
        except OV_ERRORS as err:
            raise BackendError(f"OpenVINO cannot read the ONNX graph: {str(err).strip()[:400]}") from err
        threads = opts.intra_op_threads or request.threads or available_cores()
        record: dict[str, str] = {"precision": precision, "weights": "fp32"}
        if precision == "int8":
            model = quantize(model, request, opts, record)
        request.out_dir.mkdir(parents=True, exist_ok=True)
        xml = request.out_dir / "model.xml"
        ov.save_model(model, str(xml), compress_to_fp16=False)
        properties = runtime_properties(precision, opts, threads)
        record |= {f"runtime.{k}": v for k, v in properties.items()}
        return CompiledArtifact(
            backend=self.name,
            model_path=xml,
            options=record,
            toolchain={**self.installed_versions(), "numpy": str(np.__version__), "cpu": cpu_description()},
            serving_parameters=properties,
        )

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> OvRunner:
        properties = {
            k: artifact.options[f"runtime.{k}"] for k in RUNTIME_KEYS if f"runtime.{k}" in artifact.options
        }
        if threads:
            properties["INFERENCE_NUM_THREADS"] = str(threads)
        return OvRunner(artifact.model_path, properties)


BACKEND = OpenVinoBackend()
