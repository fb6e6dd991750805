"""OpenVINO backend for CPUs: the ONNX export read into an OpenVINO model, int8 by NNCF post-training
quantization calibrated on the reference inputs, saved as IR (`model.xml` + `model.bin`).

Steps, each recorded in the artifact's options:
- `ov.convert_model` reads the exported ONNX graph (dynamic axes stay dynamic);
- int8: `nncf.quantize` with the run's reference inputs as calibration data, with NNCF's defaults
  (`performance` preset), the fastest int8; transformer mode (`mixed` preset, asymmetric
  activations) on request or as the first remedy for a graph with attention (Softmax next to
  MatMuls) whose int8 failed validation; fast bias correction unless told otherwise;
- `ov.save_model(..., compress_to_fp16=False)`: weights stay fp32 on disk (the default would halve
  them to fp16, a precision nobody asked for);
- precision at run time is a property of the compiled model, not of the IR: fp32 sets
  INFERENCE_PRECISION_HINT=f32 explicitly (on a CPU with AVX-512 BF16 or AMX, OpenVINO runs bf16 by
  default), bf16 sets bf16 and is refused on a CPU without bf16 instructions (OpenVINO would quietly
  run fp32). The same properties go into the Triton config, so the server runs what was validated.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
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
    Remedy,
    options_of,
)
from kompile.compile_jobs.cores import available_cores
from kompile.compile_jobs.hardware import cpu_description, has_fast_bf16
from kompile.compile_jobs.sensitive_layers import GraphView, after_attention, sensitive_layers
from kompile.compile_jobs.user_code import first_line
from kompile.compile_jobs.validate import compare, headroom

Array = np.ndarray[Any, Any]
# Runtime properties recorded with the artifact and passed to Triton's OpenVINO backend.
RUNTIME_KEYS = (
    "PERFORMANCE_HINT",
    "INFERENCE_PRECISION_HINT",
    "INFERENCE_NUM_THREADS",
    "NUM_STREAMS",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE",
)
_PRECISION_HINT = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}
# The weights-only remedy's activation group: on the real MiniLM (batch 1, seq 32) 12-14% faster than
# OpenVINO's default of 32, cosine 0.9985 against 0.9993 (docs/backends.md, openvino).
COARSE_GROUP = "128"
# What OpenVINO raises for a graph or property it cannot take: RuntimeError from its C++ core, its
# frontends' own failures (OpConversionFailure for an operator it has no rule for) from Exception.
OV_ERRORS = (
    RuntimeError,
    ValueError,
    TypeError,
    ov.frontend.OpConversionFailure,
    ov.frontend.OpValidationFailure,
    ov.frontend.GeneralFailure,
    ov.frontend.NotImplementedFailure,
)


_ONNX_NODE = re.compile(r"ONNX node '<Node\(\w+\): ([^>]+)>'")


def conversion_error(err: BaseException) -> str:
    """What the frontend's log says of each operation it failed on: the op, the node and the
    reason ("Conv-16 at node /decoder/Conv_output_0: The input data tensor's rank has to be known
    (static)"), or its summary lines ("No conversion rule found for operations: ai.onnx.ml.X"); not
    the C++ checks that relayed them. Each entry opens with "-- "; a failed op's reason is the last
    line of its entry."""
    parts: list[str] = []
    for entry in re.split(r"^-- ", str(err), flags=re.MULTILINE)[1:]:
        lines = [ln.strip() for ln in entry.splitlines() if ln.strip() and ln.strip() != "Summary:"]
        if not lines or lines[0].startswith("Conversion is failed for:"):
            continue  # the summary repeats the ops the entries above named
        op = lines[0].removesuffix(" with a message:")
        if op == lines[0]:
            parts.append(op)
            continue
        node = _ONNX_NODE.search(entry)
        where = f" at node {node.group(1)}" if node else ""
        parts.append(f"{op}{where}: {lines[-1] if len(lines) > 1 else 'no reason given'}")
    return "; ".join(parts) if parts else first_line(err)


# Attention as OpenVINO's conversion leaves it: fused into ScaledDotProductAttention, or a softmax.
_ATTENTION_OPS = {"ScaledDotProductAttention", "Softmax", "SoftMax"}


def is_transformer(model: ov.Model) -> bool:
    """Attention in the graph: OpenVINO's fused ScaledDotProductAttention, or a softmax whose
    probabilities a MatMul multiplies with the values. A classifier head's softmax feeds the output,
    not a MatMul: MTCNN's ONet (convolutions, four Linear layers, a softmax) read as a transformer
    while any softmax beside two MatMuls counted, and its failed int8 took the transformer remedies."""
    view = _graph_view(model)
    if any(view.kind(op) == "ScaledDotProductAttention" for op in view.nodes):
        return True
    matmuls = [op for op in view.nodes if view.kind(op) == "MatMul"]
    # Through Converts: a float16 graph's casts around a softmax computed in float32.
    return len(matmuls) >= 2 and any(
        after_attention(view, op, _ATTENTION_OPS, ("Convert",)) for op in matmuls
    )


def runtime_properties(
    precision: str, opts: OpenVinoOptions, threads: int, weights_only: bool = False
) -> dict[str, str]:
    # An int8 model's float layers run at floatPrecision: bf16 there is mixed int8/bf16, what
    # OpenVINO itself does on a CPU with bf16 (plain NNCF int8 on BERT-base ran 6% faster so).
    floats = opts.floats(has_fast_bf16())
    hint = _PRECISION_HINT[precision] if precision != "int8" else _PRECISION_HINT[floats]
    properties = {
        "PERFORMANCE_HINT": opts.performance_hint.upper(),
        "INFERENCE_PRECISION_HINT": hint,
        "INFERENCE_NUM_THREADS": str(threads),
        # One stream serves one request at a time at full width: the latency hint's choice, made
        # explicit so the server does the same.
        "NUM_STREAMS": "1" if opts.performance_hint == "latency" else "AUTO",
    }
    # int8 weights: the CPU quantizes activations on the fly, per group of this many values; the
    # group is a run-time property, so it travels with the artifact like the precision hint.
    if weights_only and opts.activation_group_size != "auto":
        group = opts.activation_group_size
        properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = "0" if group == "off" else group
    return properties


def quantize(
    model: ov.Model, request: CompileRequest, opts: OpenVinoOptions, record: dict[str, str]
) -> ov.Model:
    """NNCF post-training int8 quantization calibrated on the reference inputs."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    if not request.calibration:
        raise BackendError("openvino int8 calibrates on reference inputs and the run has none")
    names = [port.get_any_name() for port in model.inputs]
    missing = [n for n in names if n not in request.calibration[0]]
    if missing:
        raise BackendError(f"openvino int8: the reference inputs lack the model's inputs {missing}")
    # auto: NNCF's defaults, the fastest int8 (on BERT-base 3-7% faster than transformer mode, and
    # validated); transformer mode is the first remedy when that fails (kompile's ladder).
    graph_is_transformer = is_transformer(model)
    transformer = opts.model_type == "transformer"
    preset = opts.preset if opts.preset != "auto" else ("mixed" if transformer else "performance")
    ignored = [t.strip() for t in opts.ignored_types.split(",") if t.strip()]
    sensitive = sensitive_matmuls(model)
    weight_share = matmul_weight_share(model)
    if opts.keep_float == "sensitive" and not sensitive:
        raise BackendError(
            "openvino keepFloat sensitive: the graph has no MatMul to keep in float (the rule keeps "
            "MatMuls: the first and last, attention's, those feeding a LayerNorm), so this build "
            "would be the plain int8 again; try quantization dynamic (int8 weights, float compute) or "
            'option accuracyControl: "true" instead'
        )
    kept = sensitive if opts.keep_float == "sensitive" else []
    feeds = request.calibration_at_sizes
    dataset = nncf.Dataset(feeds, lambda feed: {n: feed[n] for n in names})
    common: dict[str, Any] = {
        "preset": nncf.QuantizationPreset.MIXED if preset == "mixed" else nncf.QuantizationPreset.PERFORMANCE,
        "model_type": nncf.ModelType.TRANSFORMER if transformer else None,
        "subset_size": len(feeds),
        "fast_bias_correction": opts.fast_bias_correction,
        "ignored_scope": nncf.IgnoredScope(types=ignored, names=kept, validate=False)
        if ignored or kept
        else None,
    }
    try:
        with nncf_on_stderr():
            if opts.accuracy_control:
                quantized = quantize_with_accuracy_control(model, request, names, common, record)
            else:
                advanced = AdvancedQuantizationParameters(**_advanced(request, record))
                quantized = nncf.quantize(model, dataset, advanced_parameters=advanced, **common)
    except (*OV_ERRORS, nncf.errors.ValidationError) as err:
        raise BackendError(
            f"NNCF int8 quantization failed: {first_line(err)}; keep op types in float "
            "with option ignoredTypes, or build at bf16 or fp32"
        ) from err
    fq = sum(1 for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize")
    if not fq:
        # NNCF returns the model as it was where it finds nothing to quantize ("The model has no
        # operations to apply quantization", at INFO) or accuracy control returns every layer to
        # float: an fp32 model that would validate and be labelled int8.
        raise BackendError(
            "NNCF int8 quantization quantized no operator (no FakeQuantize in the model"
            + (", accuracy control returned every layer to float" if opts.accuracy_control else "")
            + "): the artifact would be the fp32 model labelled int8. Build this target at fp32 or bf16"
        )
    record.update(
        quantization="nncf-ptq",
        modelType="transformer" if transformer else "none",
        graph="transformer" if graph_is_transformer else "other",
        preset=preset,
        fastBiasCorrection=str(opts.fast_bias_correction).lower(),
        calibrationSamples=str(len(request.calibration)),
        **({"calibrationAtOtherSizes": str(len(request.sized_inputs))} if request.sized_inputs else {}),
        fakeQuantizeNodes=str(fq),
    )
    if ignored:
        record["ignoredTypes"] = ",".join(ignored)
    if kept:
        record.update(keepFloat="sensitive", floatMatMuls=str(len(kept)))
    else:  # what keep-sensitive would keep: none (a CNN detector's graph) and it is not offered
        record["sensitiveMatMuls"] = str(len(sensitive))
    record["matmulWeightShare"] = f"{weight_share:.2f}"  # the ladder's order (remedies)
    return quantized


def compress_weights(model: ov.Model, record: dict[str, str]) -> ov.Model:
    """int8 weights (asymmetric, per channel), activations and arithmetic in float: no calibration,
    and on a real sentence encoder the one int8 that kept cosine 0.999 where full int8 fell to 0.81."""
    import nncf

    try:
        with nncf_on_stderr():
            compressed = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    except (*OV_ERRORS, nncf.errors.ValidationError) as err:
        raise BackendError(f"NNCF int8 weight compression failed: {first_line(err)}") from err
    record.update(quantization="nncf-weights-int8", weightType="int8-asym", activationType="float")
    return compressed


# OpenVINO's LayerNorm after conversion: MVN (then a scale and a shift).
_NORM_TYPES = {"MVN", "LayerNorm", "NormalizeL2"}


def sensitive_matmuls(model: ov.Model) -> list[str]:
    """Names of the MatMuls `keepFloat: sensitive` leaves out of int8: the rule of
    kompile.compile_jobs.sensitive_layers over OpenVINO's graph. On all-MiniLM-L6-v2 these took
    min cosine from 0.81 to 0.998 (measured on real sentences)."""
    view = _graph_view(model)
    return [m.get_friendly_name() for m in sensitive_layers(view, ("MatMul",), _NORM_TYPES, _ATTENTION_OPS)]


def _graph_view(model: ov.Model) -> GraphView[Any]:
    """OpenVINO's graph as kompile.compile_jobs.sensitive_layers walks it."""
    return GraphView(
        nodes=list(model.get_ordered_ops()),
        kind=lambda op: str(op.get_type_name()),
        consumers=lambda op: [t.get_node() for out in op.outputs() for t in out.get_target_inputs()],
        parents=lambda op: [i.get_source_output().get_node() for i in op.inputs()],
    )


# Ops that carry a weight from its Constant to the layer that uses it.
_WEIGHT_PATH = {
    "Convert",
    "Transpose",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "FakeQuantize",
    "Multiply",
    "Subtract",
}
_WEIGHTED = {
    "MatMul": "matmul",
    "Convolution": "conv",
    "GroupConvolution": "conv",
    "ConvolutionBackpropData": "conv",
}


def matmul_weight_share(model: ov.Model) -> float:
    """The share of the graph's layer weights (elements of the Constants feeding MatMuls and
    convolutions) that sit in MatMuls: where int8 weights-only has int8 arithmetic to offer on a
    CPU without fast bf16 (a CNN: 0; ResNet-50's classifier: 0.08; a transformer: near 1)."""
    sizes = {"matmul": 0, "conv": 0}
    for op in model.get_ordered_ops():
        kind = _WEIGHTED.get(op.get_type_name())
        if kind is None:
            continue
        for port in op.inputs()[1:2]:
            node = port.get_source_output().get_node()
            while node.get_type_name() in _WEIGHT_PATH:
                node = node.input_value(0).get_node()
            if node.get_type_name() == "Constant":
                sizes[kind] += int(np.prod(node.get_output_shape(0)))
    total = sizes["matmul"] + sizes["conv"]
    return sizes["matmul"] / total if total else 0.0


# The share of the gate's room (validate.headroom) accuracy control leaves unspent: NNCF measures
# under the CPU's default inference precision and on the calibration samples, and the artifact is
# then held to the gate on every sample by kompile's own validation. 0.2 of int8's cosine room
# (0.99 to 1) is the 0.002 under the limit this used when it tuned on cosine alone.
_ACCURACY_CONTROL_ROOM = 0.2
_ACCURACY_CONTROL_STEPS = 8
# Below this share of the weights in MatMuls, int8 weights-only is no faster than fp32 where its
# float compute is fp32: OpenVINO quantizes activations on the fly for MatMuls (FullyConnected) alone.
_WEIGHTS_ONLY_MATMUL_SHARE = 0.5
# NNCF's report of what it returned to float, at INFO (nncf 3.4): "7 out of 132 were reverted ...".
_REVERTED = re.compile(r"(\d+) out of (\d+) were reverted")


def _advanced(request: CompileRequest, record: dict[str, str]) -> dict[str, Any]:
    """NNCF's advanced parameters both int8 paths share: the overflow fix named (NNCF's default,
    pinned so a new NNCF default cannot change it unseen) and the activation ranges.

    Overflow fix on the first layer: on x86 without VNNI, oneDNN's int8 kernels add u8 x s8
    product pairs in int16, which 8-bit weights saturate where activations are large, as the
    unnormalised image a first convolution reads is; NNCF keeps that layer's weights to 7 bits.
    Real MobileNetV2 on real photos on an AVX2 EPYC (benchmarks/int8_saturation.py): worst cosine
    to fp32 0.985 so, 0.981 with every layer at 7 bits, 0.792 with no fix."""
    from nncf.quantization.advanced_parameters import OverflowFix

    record["overflowFix"] = "firstLayer"
    return {"overflow_fix": OverflowFix.FIRST_LAYER, **_activation_ranges(request, record)}


def _activation_ranges(request: CompileRequest, record: dict[str, str]) -> dict[str, Any]:
    """NNCF's activation range estimator where the calibration holds other sizes of a dynamic dim:
    the global min and max. Its default averages each sample's extremes, so the largest size's
    were averaged away; on NudeNet's YOLOv8 (224 around 32..512) calibrating at the sizes took the
    cosine at 512 from 0.954 to 0.932 with the default and to 0.99993 with min and max, 0.99976 at
    224 (0.99985 calibrated there alone)."""
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    if not request.sized_inputs:
        return {}
    record["activationRanges"] = "minmax"
    return {"activations_range_estimator_params": RangeEstimatorParametersSet.MINMAX}


def quantize_with_accuracy_control(
    model: ov.Model, request: CompileRequest, names: list[str], common: dict[str, Any], record: dict[str, str]
) -> ov.Model:
    """NNCF's accuracy-aware quantization with the gate's own measure: how far inside the gate's
    limits each sample's outputs stay (validate.headroom: cosine, top-k, under task detection the
    detections). NNCF ranks the quantized layers by their effect on it and returns the worst to
    float, a few at a time, until the artifact keeps a share of the gate's room."""
    import nncf

    # Tuned on the calibration samples alone: the gate then judges the held-out ones as unseen.
    reference = request.calibration_outputs
    feeds = list(request.calibration)
    outputs = list(request.reference.output_names)

    def judged(candidate: list[list[Array]], refs: list[list[Array]]) -> float:
        return headroom(compare(refs, candidate, outputs, request.thresholds, request.task))

    def validate(compiled: ov.CompiledModel, indices: Any) -> tuple[float, list[float]]:
        picked = list(indices)
        got = [
            [np.asarray(r[p]) for p in compiled.outputs]
            for r in (compiled({n: feeds[i][n] for n in names}) for i in picked)
        ]
        refs = [reference[i] for i in picked]
        per_sample = [judged([g], [r]) for g, r in zip(got, refs, strict=True)]
        return judged(got, refs), per_sample

    from nncf.quantization.advanced_parameters import (
        AdvancedAccuracyRestorerParameters,
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    max_drop = 1.0 - _ACCURACY_CONTROL_ROOM
    with nncf_report(_REVERTED) as reverted:
        quantized = nncf.quantize_with_accuracy_control(
            model,
            nncf.Dataset(request.calibration_at_sizes, lambda feed: {n: feed[n] for n in names}),
            nncf.Dataset(list(range(len(feeds)))),
            validate,
            max_drop=max_drop,
            drop_type=nncf.DropType.ABSOLUTE,
            # SmoothQuant off: with it (the transformer default) reverting a layer restored its weights
            # but kept the activation scaling, and every step made a real MiniLM worse (423 s, cosine 0).
            advanced_quantization_parameters=AdvancedQuantizationParameters(
                smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1),
                **_advanced(request, record),
            ),
            # Bounded: each reverted layer costs a validation pass (MiniLM: 3 layers, 135 s in all).
            advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                max_num_iterations=_ACCURACY_CONTROL_STEPS,
                ranking_subset_size=min(len(feeds), 8),
                num_ranking_workers=1,
            ),
            **common,
        )
    record.update(
        accuracyControl="true",
        accuracyControlMetric="gate-headroom",
        accuracyControlMaxDrop=f"{max_drop:.4g}",
    )
    if reverted:
        record["accuracyControlReverted"] = reverted[-1].group(1)
        record["accuracyControlQuantizedOps"] = reverted[-1].group(2)
    return quantized


@contextlib.contextmanager
def nncf_report(pattern: re.Pattern[str]) -> Iterator[list[re.Match[str]]]:
    """The matches of `pattern` in NNCF's log lines while the block runs (its reports are log
    lines, not return values)."""
    import logging

    found: list[re.Match[str]] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if match := pattern.search(record.getMessage()):
                found.append(match)

    catch = Catch(logging.INFO)
    logger = logging.getLogger("nncf")
    logger.addHandler(catch)
    try:
        yield found
    finally:
        logger.removeHandler(catch)


@contextlib.contextmanager
def nncf_on_stderr() -> Iterator[None]:
    """NNCF's progress bars and log lines go to stderr: stdout belongs to `kompile run --json`. Its
    logger writes to the stdout it saw at import, which redirect_stdout cannot reach: its handlers
    are pointed at stderr too."""
    import logging

    for handler in logging.getLogger("nncf").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
            handler.setStream(sys.stderr)
    with contextlib.redirect_stdout(sys.stderr):
        yield


class OvRunner:
    """The saved IR compiled for the CPU with the artifact's runtime properties."""

    def __init__(self, xml: Path, properties: dict[str, str]) -> None:
        core = ov.Core()
        try:
            self.compiled = core.compile_model(str(xml), "CPU", properties)
        except OV_ERRORS as err:
            raise BackendError(f"OpenVINO cannot compile {xml.name} for this CPU: {first_line(err)}") from err
        self.request = self.compiled.create_infer_request()
        self.input_names = [p.get_any_name() for p in self.compiled.inputs]
        self.output_names = [p.get_any_name() for p in self.compiled.outputs]
        # A port can carry several names once the CPU plugin folds a node into it (a float16
        # model's input Cast: {"x", "graph_input_cast_0"}), and any_name may be either: each input
        # is fed by whichever of its names the feeds use.
        self._names = [p.get_names() for p in self.compiled.inputs]
        self._dtypes = [p.get_element_type().to_dtype() for p in self.compiled.inputs]
        self._fed: list[str] = []  # the names the last feeds used, port by port

    def _names_in(self, feeds: Feeds) -> list[str]:
        """Each input's name in `feeds`: the last call's when they still hold it (the timed loop
        feeds the same names every call), else looked up once more."""
        if self._fed and all(n in feeds for n in self._fed):
            return self._fed
        names = [next((n for n in sorted(ns) if n in feeds), None) for ns in self._names]
        missing = [sorted(ns) for ns, n in zip(self._names, names, strict=True) if n is None]
        if missing:
            raise BackendError(f"inputs named {missing} missing; the feeds have {sorted(feeds)}")
        self._fed = [n for n in names if n is not None]
        return self._fed

    def run(self, feeds: Feeds) -> list[Array]:
        inputs = {
            i: np.asarray(feeds[n], dtype=dt, order="C")
            for i, (n, dt) in enumerate(zip(self._names_in(feeds), self._dtypes, strict=True))
        }
        result = self.request.infer(inputs)
        # The request owns its output buffers and reuses them: copy before the next call.
        return [np.array(result[port]) for port in self.compiled.outputs]


class OpenVinoBackend(Backend):
    name = "openvino"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        opts = options_of(request, OpenVinoOptions)
        precision = request.target.precision
        if (
            precision == "bf16" or (precision == "int8" and opts.float_precision == "bf16")
        ) and not has_fast_bf16():
            raise BackendError(
                f"this CPU ({cpu_description()}) has no bf16 instructions (AVX-512 BF16 or AMX): "
                "OpenVINO would run fp32 and call it bf16; build fp32 or int8 for this class"
            )
        try:
            model = ov.convert_model(str(request.onnx()))
        except OV_ERRORS as err:
            raise BackendError(f"OpenVINO cannot read the ONNX graph: {conversion_error(err)}") from err
        threads = opts.intra_op_threads or request.threads or available_cores()
        record: dict[str, str] = {"precision": precision, "weights": "fp32"}
        weights_only = precision == "int8" and request.target.quantization == "dynamic"
        if weights_only:
            model = compress_weights(model, record)
        elif precision == "int8":
            model = quantize(model, request, opts, record)
        request.out_dir.mkdir(parents=True, exist_ok=True)
        xml = request.out_dir / "model.xml"
        ov.save_model(model, str(xml), compress_to_fp16=False)
        properties = runtime_properties(precision, opts, threads, weights_only)
        record |= {f"runtime.{k}": v for k, v in properties.items()}
        return CompiledArtifact(
            backend=self.name,
            model_path=xml,
            options=record,
            toolchain={**self.installed_versions(), "numpy": str(np.__version__), "cpu": cpu_description()},
            serving_parameters=properties,
        )

    def remedies(self, failed: CompiledArtifact) -> list[Remedy]:
        """What to try after a full int8 failed validation, in order. For a transformer: NNCF's
        transformer mode, then int8 weights with float compute, activations quantized at run time in
        coarse groups and then in OpenVINO's finer default ones (on the real MiniLM: cosine 0.9985
        and 0.9993, both faster than the other passing remedy at batch 1 and 8), then the sensitive
        MatMuls kept in float, then NNCF's accuracy control (measured, slow: 104 s on MiniLM).
        Elsewhere the sensitive layers first, then weights-only and accuracy control; accuracy
        control before weights-only where the failed build computed its float layers in fp32 and
        most weights sit in convolutions, which weights-only leaves at fp32's speed. The layers left
        in float run at bf16 where the CPU has it fast (floatPrecision auto), except under accuracy
        control, which measures at f32."""
        o = failed.options
        if o.get("quantization") != "nncf-ptq":
            return []
        transformer = o.get("graph") == "transformer"
        mode = {"modelType": "transformer"} if transformer else {}
        # What the failed build's float layers ran at (recorded with it; this CPU's default if not).
        hint = o.get("runtime.INFERENCE_PRECISION_HINT") or ("bf16" if has_fast_bf16() else "f32")
        compute = "fp32" if hint == "f32" else hint
        tried_mode = o.get("modelType") == "transformer"
        # Recorded by the plain build; an artifact built before it was recorded counts as MatMuls.
        matmul_share = float(o.get("matmulWeightShare", "1"))
        steps = {
            "transformer": Remedy("transformer", "NNCF's transformer mode", mode, "static"),
            # Coarse activation groups first (faster), OpenVINO's finer default if they lose too much.
            "weights-only": Remedy(
                "weights-only",
                f"int8 weights with {compute} compute, activations quantized in groups of {COARSE_GROUP}",
                {"activationGroupSize": COARSE_GROUP},
                "dynamic",
            ),
            "weights-only-fine": Remedy(
                "weights-only-fine",
                f"int8 weights with {compute} compute, OpenVINO's default activation groups",
                {"activationGroupSize": "auto"},
                "dynamic",
            ),
            "keep-sensitive": Remedy(
                "keep-sensitive",
                f"int8 with the sensitive layers kept in {compute}",
                {**mode, "keepFloat": "sensitive"},
                "static",
            ),
            "accuracy-control": Remedy(
                "accuracy-control",
                "NNCF accuracy control",
                {**mode, "accuracyControl": "true", "floatPrecision": "fp32"},
                "static",
            ),
        }
        weights_only = ["weights-only", "weights-only-fine"]
        if transformer:
            order = ["transformer", *weights_only, "keep-sensitive", "accuracy-control"]
        elif compute == "fp32" and matmul_share < _WEIGHTS_ONLY_MATMUL_SHARE:
            # Weights-only would compute the convolutions in fp32, at fp32's speed, and end the
            # climb there: accuracy control's mostly-int8 build first (NudeNet: 4.93 ms vs 8.94).
            order = ["keep-sensitive", "accuracy-control", *weights_only]
        else:
            order = ["keep-sensitive", *weights_only, "accuracy-control"]
        skip = {
            "transformer": not transformer or tried_mode,
            # Nothing to keep: the build would be the failed plain int8 again (NudeNet's YOLOv8n).
            "keep-sensitive": o.get("keepFloat") == "sensitive" or o.get("sensitiveMatMuls") == "0",
            "accuracy-control": o.get("accuracyControl") == "true",
            # Activation groups are how a MatMul's activations go int8 on the fly: with no MatMul
            # weights the finer groups build the coarse artifact again (Silero VAD's conv+LSTM).
            "weights-only-fine": matmul_share == 0.0,
        }
        return [steps[name] for name in order if not skip.get(name, False)]

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> OvRunner:
        properties = {
            k: artifact.options[f"runtime.{k}"] for k in RUNTIME_KEYS if f"runtime.{k}" in artifact.options
        }
        if threads:
            properties["INFERENCE_NUM_THREADS"] = str(threads)
        return OvRunner(artifact.model_path, properties)


BACKEND = OpenVinoBackend()
