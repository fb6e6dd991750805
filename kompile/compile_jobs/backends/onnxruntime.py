"""ONNX Runtime backend for CPU nodes: fp32 graph optimizations and int8 quantization.

Steps, each recorded in the artifact's options (defaults chosen by measurement on a 2-core AVX2 node):
- transformers (detected from the graph, or option `modelType`) go through ONNX Runtime's transformer
  fusions first (Attention, EmbedLayerNormalization, BiasGelu). Add + LayerNormalization stays
  unfused, here and when ONNX Runtime loads the file: its CPU SkipLayerNormalization kernel ran 5x
  slower than the pair (5% of BERT-base's int8 latency). int8 builds use tanh GELU (FastGelu).
  Attention written by the dynamo exporter from SDPA, which ONNX Runtime's optimizer does not fuse,
  is fused through onnxscript's rules first (kompile.compile_jobs.sdpa_fusion; fp32 only);
- int8 `dynamic` quantizes the weights of the fused graph (QAttention, DynamicQuantizeMatMul);
  `static` calibrates activation ranges on the reference inputs and inserts QDQ pairs with
  per-channel weights, 7-bit on an x86 CPU without VNNI (`reduceRange` auto: there the int8
  kernels add product pairs in int16 and 8-bit weights saturate them); unset: dynamic for
  transformers, static for everything else (ConvInteger, what dynamic makes of a convolution, ran
  4x slower than fp32 on ResNet-50);
- an InferenceSession applies its graph optimizations and saves the result at `optLevel`, default
  extended: `all` adds NCHWc layouts sized for this CPU's vector width and was no faster once the
  runner, which loads at `all`, redoes them on the node that serves (loading at extended instead
  cost ResNet-50 40% in fp32 and 30% in int8).
"""

from __future__ import annotations

import contextlib
import logging
import platform
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from kompile.api.catalog.onnxruntime import OnnxRuntimeOptions
from kompile.compile_jobs import hardware
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
from kompile.compile_jobs.sensitive_layers import GraphView, output_tail, sensitive_layers
from kompile.compile_jobs.source_files import is_quantized_op, onnx_external_files
from kompile.compile_jobs.user_code import first_line

Array = np.ndarray[Any, Any]
Opts = dict[str, str]

# ONNX Runtime's Python exceptions share no base class below Exception: name them.
_ORT_ERROR_NAMES = (
    "Fail InvalidArgument NoSuchFile NoModel EngineError RuntimeException InvalidProtobuf InvalidGraph"
)
ORT_ERRORS: tuple[type[Exception], ...] = tuple(getattr(ort_state, n) for n in _ORT_ERROR_NAMES.split())
# What the fusion and quantization tools raise when a graph is outside what they handle.
_PY_ERRORS = (RuntimeError, ValueError, AssertionError, KeyError, IndexError, TypeError)
TOOL_ERRORS = (*_PY_ERRORS, onnx.checker.ValidationError, onnx.shape_inference.InferenceError, *ORT_ERRORS)
OPT_LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
DATA_FILE = "model.onnx.data"  # the artifact's weights, when the source kept its own outside the graph
_ATTENTION_OPS = {"Attention", "MultiHeadAttention"}
_TRANSFORMER_OPS = {"Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization"}
# Embedding tables stay fp32 under dynamic quantization: a lookup gains no speed from int8, only error.
_DYNAMIC_SKIP_OPS = {"EmbedLayerNormalization", "Gather"}

# ---------------------------------------------------------------------------------------------
# Graph inspection: is it a transformer, and how many heads


def load_checked(path: Path) -> onnx.ModelProto:
    """The model at `path` (weights not loaded), or a BackendError naming the file."""
    if not path.is_file():
        raise BackendError(f"ONNX model {path} does not exist; export the source model first")
    try:
        onnx.checker.check_model(str(path))
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, onnx.checker.ValidationError, OSError) as err:
        raise BackendError(
            f"{path} is not a valid ONNX model ({first_line(err)}); re-export the source model"
        ) from err


@dataclass
class _Constants:
    """Shapes of every constant tensor and the values of the small ones (scales)."""

    dims: dict[str, tuple[int, ...]]
    small: dict[str, Array]


def _constants(graph: onnx.GraphProto, small: int = 16) -> _Constants:
    out = _Constants({}, {})
    for init in graph.initializer:
        out.dims[init.name] = tuple(init.dims)
        if int(np.prod(init.dims)) <= small and not init.external_data:
            out.small[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            value = numpy_helper.to_array(node.attribute[0].t)
            out.dims[node.output[0]] = value.shape
            if value.size <= small:
                out.small[node.output[0]] = value
        elif node.op_type == "Identity" and node.input[0] in out.dims:  # the exporter aliases shared weights
            out.dims[node.output[0]] = out.dims[node.input[0]]
            if node.input[0] in out.small:
                out.small[node.output[0]] = out.small[node.input[0]]
    return out


def _upstream(
    node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], depth: int
) -> Iterator[onnx.NodeProto]:
    """Nodes feeding `node`, breadth first, up to `depth` hops."""
    queue, seen = deque([(node, 0)]), {id(node)}
    while queue:
        current, d = queue.popleft()
        for parent in (producers[i] for i in current.input if i in producers):
            if d < depth and id(parent) not in seen:
                seen.add(id(parent))
                yield parent
                queue.append((parent, d + 1))


def _attention_scales(graph: onnx.GraphProto, consts: _Constants) -> list[float] | None:
    """Scale factors of Softmax(MatMul(q, k) * scale) patterns; None when the graph has none."""
    producers = {o: n for n in graph.node for o in n.output}
    found: list[float] | None = None
    for soft in (n for n in graph.node if n.op_type == "Softmax"):
        ups = list(_upstream(soft, producers, 4))
        # q @ k^T multiplies two activations; a classifier head's MatMul has a weight operand.
        if not any(n.op_type == "MatMul" and not set(n.input) & consts.dims.keys() for n in ups):
            continue
        found = found or []
        for n in (n for n in ups if n.op_type in ("Mul", "Div")):
            scalar = [
                float(consts.small[i].item())
                for i in n.input
                if i in consts.small and consts.small[i].size == 1
            ]
            if scalar and scalar[0] > 0:
                found.append(scalar[0] if n.op_type == "Mul" else 1.0 / scalar[0])
                break
    return found


def detect_model_type(model: onnx.ModelProto) -> str:
    """bert when the graph holds self-attention (MatMul-Softmax-MatMul) and layer norms, else none."""
    ops = {n.op_type for n in model.graph.node}
    if ops & _TRANSFORMER_OPS:
        return "bert"
    norm = "LayerNormalization" in ops or {"ReduceMean", "Sqrt"} <= ops
    if norm and "Softmax" in ops and _attention_scales(model.graph, _constants(model.graph)) is not None:
        return "bert"
    return "none"


def detect_heads(model: onnx.ModelProto) -> tuple[int, int]:
    """(num_heads, hidden_size) from the attention scale (1/sqrt(head_dim)) and the layer-norm width.

    (0, 0) when they cannot be read: ONNX Runtime then tries its own detection.
    """
    consts = _constants(model.graph)
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization" and len(n.input) > 1]
    widths = [int(np.prod(consts.dims[n.input[1]])) for n in norms if n.input[1] in consts.dims]
    # The width most norms have: two a layer are the hidden size, where the first can be another's
    # (wav2vec2's convolutional feature encoder normalizes its 512 channels before the 768 layers).
    hidden = max(widths, key=widths.count) if widths else 0
    scales = _attention_scales(model.graph, consts) or []
    head_dim = round(scales[0] ** -2) if scales else 0
    if not hidden or head_dim < 1 or hidden % head_dim:
        return 0, 0
    return hidden // head_dim, hidden


# ---------------------------------------------------------------------------------------------
# The steps


def fuse_transformer(
    src: Path, model: onnx.ModelProto, dst: Path, opts: OnnxRuntimeOptions, record: Opts, external: bool
) -> Path:
    """ONNX Runtime's transformer fusions; the fused-op counts go into the record. `external`: the
    weights stay in external data (as the source had them)."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions

    heads, hidden = opts.num_heads, opts.hidden_size
    if not (heads and hidden):
        heads, hidden = detect_heads(model)
    fusion = FusionOptions(record["modelType"])
    # A raw 2-D mask is right for any padding; a mask index assumes right-padded batches.
    raw = opts.attention_mask == "raw"
    fusion.attention_mask_format = (
        AttentionMaskFormat.AttentionMask if raw else AttentionMaskFormat.MaskIndexEnd
    )
    # ONNX Runtime's CPU SkipLayerNormalization kernel measured 5x slower than Add + LayerNormalization.
    fusion.enable_skip_layer_norm = fusion.enable_bias_skip_layer_norm = opts.skip_layer_norm
    # tanh GELU (FastGelu) is a few percent faster than erf; its ~5e-4 error hides under int8 rounding.
    approximate = opts.gelu_approximation == "true" or (
        opts.gelu_approximation == "auto" and record["precision"] == "int8"
    )
    fusion.enable_gelu_approximation = approximate

    def optimized(path: Path) -> Any:
        try:
            return optimizer.optimize_model(
                str(path),
                model_type=record["modelType"],
                num_heads=heads,
                hidden_size=hidden,
                optimization_options=fusion,
            )
        except (*TOOL_ERRORS, DecodeError) as err:
            raise BackendError(
                f"transformer fusion ({record['modelType']}) of {src} failed: {err}; set option "
                "modelType=none to skip it, or numHeads and hiddenSize if they were misdetected"
            ) from err

    fused = optimized(src)
    unfused = not _ATTENTION_OPS & {k for k, v in fused.get_fused_operator_statistics().items() if v}
    # Not the pattern ONNX Runtime knows: the dynamo exporter's SDPA, perhaps (sdpa_fusion). Not for
    # int8: that Attention takes its mask as a bias, which QAttention has no input for, so its
    # projections would stay fp32 (MiniLM int8: 12.6 ms fused, 12.4 ms unfused).
    if unfused and record["precision"] != "int8":
        sdpa = _fused_sdpa(src, dst.with_name("sdpa-fused.onnx"), external, record)
        try:
            fused = optimized(sdpa) if sdpa is not None else fused
        except BackendError as err:  # the unfused graph optimized above still serves
            record["sdpaFusion"] = f"failed: {first_line(err)}"
    try:
        fused.save_model_to_file(str(dst), use_external_data_format=external)
    except TOOL_ERRORS as err:
        raise BackendError(f"transformer fusion ({record['modelType']}) of {src}: not saved: {err}") from err
    stats = sorted((k, int(v)) for k, v in fused.get_fused_operator_statistics().items() if v)
    record.update(
        numHeads=str(heads or "auto"),
        hiddenSize=str(hidden or "auto"),
        attentionMask=opts.attention_mask,
        skipLayerNorm=str(opts.skip_layer_norm).lower(),
        geluApproximation=str(approximate).lower(),
    )
    record["fusedOps"] = ",".join(f"{k}={v}" for k, v in stats) or "none"
    return dst


def _fused_sdpa(src: Path, dst: Path, external: bool, record: Opts) -> Path | None:
    """`src` with its SDPA attention fused by onnxscript (kompile.compile_jobs.sdpa_fusion), or None
    when nothing matched; a rule that fails leaves the graph unfused, said in the record."""
    from kompile.compile_jobs.sdpa_fusion import fuse_sdpa_attention

    try:
        made = fuse_sdpa_attention(src, dst, external)
    except ImportError as err:  # a compile image without onnxscript: unfused, and the record says why
        record["sdpaFusion"] = f"unavailable: {err}"
        return None
    except Exception as err:  # noqa: BLE001 - an optimization: whatever a rule raises, the graph stays unfused
        record["sdpaFusion"] = f"failed: {first_line(err)}"
        return None
    record["sdpaFusion"] = f"Attention={made}" if made else "none"
    return dst if made else None


class FeedReader:
    """Calibration inputs for quantize_static (ONNX Runtime's CalibrationDataReader protocol)."""

    def __init__(self, feeds: Sequence[Feeds], input_names: Sequence[str]) -> None:
        self._feeds = [{n: f[n] for n in input_names} for f in feeds]
        self._next = 0

    def get_next(self) -> Feeds | None:
        self._next += 1
        return self._feeds[self._next - 1] if self._next <= len(self._feeds) else None

    def rewind(self) -> None:
        self._next = 0


# Lines ONNX Runtime's quantizers log on the root logger that tell a kompile user nothing:
_QUANTIZER_NOISE = (
    # the dynamic quantizer, for every model: with MatMulConstBOnly it quantizes only constant
    # weights, which need no inferred shapes
    "consider to run pre-processing",
    # the static quantizer's per-channel pass, once per rank-1 weight (a LayerNorm's gamma), which
    # it then quantizes per tensor as it should
    "is out-of-range for weight",
    # the static quantizer, where kompile skipped the pre-processing (the candidate's options say
    # preProcess: skipped, with the reason)
    "consider pre-processing before quantization",
    # the dynamic quantizer, with a protobuf dump, once per tensor shape inference gave no type (an
    # int64 slice in Silero VAD's padding): it leaves that tensor float, and validation judges
    "Inference failed or unsupported type to quantize",
)


@contextlib.contextmanager
def _without_quantizer_noise() -> Iterator[None]:
    """ONNX Runtime's quantizers with their _QUANTIZER_NOISE held back (other warnings pass)."""

    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in _QUANTIZER_NOISE)

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def quantize_dynamic(src: Path, dst: Path, opts: OnnxRuntimeOptions, record: Opts, external: bool) -> Path:
    """int8 weights, activations quantized per call (uint8): no calibration data needed."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    per_channel = opts.per_channel == "true"  # auto: per-tensor, measured as fast and as close on BERT
    reduce_range = dynamic_reduce_range(opts)
    op_types = sorted(set(IntegerOpsRegistry) - _DYNAMIC_SKIP_OPS)
    extra = {"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT}
    with _without_quantizer_noise():
        try:
            ort_quantize_dynamic(
                str(src),
                str(dst),
                op_types_to_quantize=op_types,
                per_channel=per_channel,
                reduce_range=reduce_range,
                weight_type=QuantType.QInt8,
                extra_options=extra,
                use_external_data_format=external,
            )
        except TOOL_ERRORS as err:
            raise BackendError(
                f"dynamic int8 quantization of {src} failed: {first_line(err)}; try quantization: static"
            ) from err
    record.update(quantization="dynamic", quantFormat="qoperator", weightType="int8", activationType="uint8")
    record.update(perChannel=str(per_channel).lower(), reduceRange=str(reduce_range).lower())
    return dst


_WEIGHTED_OPS = ("MatMul", "Gemm", "Conv")
_NORM_OPS = ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization")


def _joined_tail(graph: onnx.GraphProto) -> int:
    """The size of the output's float tail where it joins parts with a Concat (one int8 scale over
    parts of different sizes: a detector's box pixels and class probabilities), else 0: a lone
    Softmax or Tanh after the last layer is no reason to build again."""
    tail = set(tail_nodes(graph))
    joined = any(n.op_type == "Concat" and n.name in tail for n in graph.node)
    return len(tail) if joined else 0


def sensitive_nodes(graph: onnx.GraphProto) -> list[str]:
    """Names of the nodes `keepFloat: sensitive` leaves out of static int8: the rules of
    kompile.compile_jobs.sensitive_layers over the ONNX graph (the sensitive layers, then the
    output's float tail)."""
    view = _view(graph)
    layers = sensitive_layers(view, _WEIGHTED_OPS, _NORM_OPS, ("Softmax",))
    return [n.name for n in layers + output_tail(view, _WEIGHTED_OPS, _NORM_OPS)]


def tail_nodes(graph: onnx.GraphProto) -> list[str]:
    """Names of the nodes `keepFloat: tail` leaves out of static int8: the output's float tail
    alone, the last and first layers quantized (NudeNet's YOLOv8n: 10 of the source's 10 objects, as
    keep-sensitive; p50 5.30 ms against its 5.84 on an AMX Xeon, benchmarks/detector_int8.py)."""
    return [n.name for n in output_tail(_view(graph), _WEIGHTED_OPS, _NORM_OPS)]


def _view(graph: onnx.GraphProto) -> GraphView[onnx.NodeProto]:
    """The ONNX graph as kompile.compile_jobs.sensitive_layers walks it."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producers = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return GraphView(
        nodes=list(graph.node),
        kind=lambda n: str(n.op_type),
        consumers=lambda n: [c for o in n.output for c in consumers.get(o, [])],
        parents=lambda n: [producers[i] for i in n.input if i in producers],
    )


def dynamic_reduce_range(opts: OnnxRuntimeOptions) -> bool:
    """Whether dynamic int8 keeps its weights to 7 bits: only on request. Per-tensor 7-bit weights
    cost real MiniLM far more than saturation does (AVX2 EPYC: worst cosine 0.71 against 0.95,
    benchmarks/int8_saturation.py)."""
    return opts.reduce_range == "true"


def static_reduce_range(opts: OnnxRuntimeOptions) -> bool:
    """Whether static int8 keeps its weights to 7 bits. auto: where the CPU's int8 kernels add
    product pairs in int16 (x86 without VNNI). There 8-bit weights saturate them: real MobileNetV2's
    worst cosine to fp32 fell to 0.76 where its quantized math keeps 0.94; with 7 bits the kernels
    match that math (0.92 both), at the same speed (MobileNetV2 12.54 against 12.55 ms, ResNet-50
    118.2 against 117.5; benchmarks/int8_saturation.py, AMD EPYC avx2)."""
    if opts.reduce_range == "auto":
        return hardware.int8_pairs_saturate()
    return opts.reduce_range == "true"


def quantize_static(
    src: Path,
    inputs: list[str],
    work: Path,
    req: CompileRequest,
    opts: OnnxRuntimeOptions,
    record: Opts,
    external: bool,
) -> Path:
    """QDQ int8 with activation ranges calibrated on the reference inputs; per-channel weights."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quant_pre_process
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    if not req.calibration:
        raise BackendError(
            "static int8 quantization calibrates on reference inputs and none were given: provide "
            "validation samples or a dataset, or set quantization: dynamic"
        )
    pre, dst = work / "preprocessed.onnx", work / "quantized.onnx"
    per_channel = opts.per_channel != "false"
    method = next(m for m in CalibrationMethod if m.name.lower() == opts.calibration_method)
    symmetric = opts.activation_type == "int8"
    reduce_range = static_reduce_range(opts)
    with _without_quantizer_noise():
        try:
            quant_pre_process(str(src), str(pre), auto_merge=True, save_as_external_data=external)
        except TOOL_ERRORS as err:
            # Pre-processing (symbolic shape inference, then ORT's graph optimizations) only helps the
            # quantizer; it fails on some graphs the quantizer takes as they are (Silero VAD's If
            # nodes: a bare assert in symbolic_shape_infer).
            record["preProcess"] = f"skipped: {first_line(err)}"
            pre = src
        try:
            graph = onnx.load(str(pre), load_external_data=False).graph
            excluded = []
            if opts.keep_float == "sensitive":
                excluded = sensitive_nodes(graph)
            elif opts.keep_float == "tail":
                excluded = tail_nodes(graph)
            elif joined_tail := _joined_tail(graph):
                # The keep-tail remedy is offered where the tail joins parts (below).
                record["outputTailNodes"] = str(joined_tail)
            ort_quantize_static(
                str(pre),
                str(dst),
                FeedReader(req.calibration_at_sizes, inputs),
                quant_format=QuantFormat.QDQ if opts.quant_format == "qdq" else QuantFormat.QOperator,
                per_channel=per_channel,
                reduce_range=reduce_range,
                activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=method,
                extra_options={"ActivationSymmetric": symmetric},
                use_external_data_format=external,
                nodes_to_exclude=excluded,
            )
        except KeyError as err:
            raise BackendError(
                f"calibration inputs lack model input {err}; they must name each of {inputs}"
            ) from err
        except TOOL_ERRORS as err:
            raise BackendError(
                f"static int8 quantization of {src} failed: {first_line(err)}; try quantization: dynamic"
            ) from err
    wire = opts.record()
    record.update({k: wire[k] for k in ("quantFormat", "activationType", "calibrationMethod")})
    record["reduceRange"] = str(reduce_range).lower()
    record.update(quantization="static", weightType="int8", perChannel=str(per_channel).lower())
    record["calibrationSamples"] = str(len(req.calibration))
    if req.sized_inputs:
        record["calibrationAtOtherSizes"] = str(len(req.sized_inputs))
    if excluded:
        record.update(keepFloat=opts.keep_float, floatNodes=str(len(excluded)))
    return dst


# The float ops a quantizer makes integer (with Attention, ONNX Runtime's fused one).
_QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "Attention")
_BRANCHING_OPS = ("If", "Loop", "Scan")


def _nodes(graph: onnx.GraphProto, depth: int = 0) -> Iterator[tuple[onnx.NodeProto, int]]:
    """Every node with how many If/Loop/Scan bodies it lies inside (0: the main graph)."""
    for node in graph.node:
        yield node, depth
        for attr in node.attribute:
            for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _nodes(body, depth + 1)


def _graph(path: Path) -> onnx.GraphProto:
    return onnx.load(str(path), load_external_data=False).graph


def quantized_nodes(graph: onnx.GraphProto) -> int:
    """How many quantized operators a graph holds, in its branches too."""
    return sum(1 for n, _ in _nodes(graph) if is_quantized_op(n.op_type))


def require_quantized(src: Path, dst: Path, mode: str) -> None:
    """Raise where quantizing `src` into `dst` quantized nothing: such an artifact is the fp32 graph
    labelled int8, and precision auto would stop at it (Silero VAD: every Conv and LSTM inside If
    branches, which ONNX Runtime's quantizers leave as they are)."""
    graph = _graph(src)  # each file parsed once: a model under 2 GB holds its weights in the graph
    held = quantized_nodes(graph)
    if quantized_nodes(_graph(dst)) > held:
        return
    weighted = [(n, d) for n, d in _nodes(graph) if n.op_type in _QUANTIZABLE_OPS]
    kinds = "/".join(sorted({n.op_type for n, _ in weighted}))
    if held:
        why = f"the source is quantized already ({held} quantized operators) and it added none"
    elif not weighted:
        why = f"the graph has none of {', '.join(_QUANTIZABLE_OPS)} for it to quantize"
    elif all(d > 0 for _, d in weighted):
        why = (
            f"its {len(weighted)} {kinds} nodes all lie inside {'/'.join(_BRANCHING_OPS)} branches, "
            "which ONNX Runtime's quantizer leaves as they are"
        )
    else:
        why = f"none of its {len(weighted)} {kinds} nodes could be (weights not constant, or kept float)"
    raise BackendError(
        f"{mode} int8 quantization quantized no operator: {why}; the artifact would be "
        "the fp32 graph labelled int8. Build this target at fp32, or pick another backend for int8"
    )


_NOT_LOADED = "ONNX Runtime could not load"


def optimize_and_save(
    src: Path, dst: Path, level: str, threads: int, disabled: list[str], data_file: str | None = None
) -> None:
    """Let an InferenceSession apply its graph optimizations at `level` and save the result; with
    `data_file`, the weights go to that file beside `dst` (ONNX external data), as a model over 2 GB
    must have them."""
    so = ort.SessionOptions()
    so.graph_optimization_level = OPT_LEVELS[level]
    so.optimized_model_filepath = str(dst)
    if data_file:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_file)
        # ONNX Runtime's own threshold: scales and shapes stay in the graph, weights go out.
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    so.intra_op_num_threads = threads
    # Its log would print the error again, in colour, amid the progress: the BackendError says it.
    so.log_severity_level = 4
    try:
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    except ORT_ERRORS as err:
        raise BackendError(f"{_NOT_LOADED} {src}: {err}") from err


# ---------------------------------------------------------------------------------------------
# The backend and its runner


def cpu_features() -> str:
    """The instruction sets int8 and NCHWc kernels depend on (part of what an artifact is built for)."""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(
                (ln.split(":", 1)[1].split() for ln in f if ln.startswith(("flags", "Features"))), []
            )
    except OSError:
        pass  # not Linux: the machine name below still says x86_64 or arm64
    wanted = ("avx512_vnni", "avx512f", "avx_vnni", "avx2", "asimddp", "asimd")
    return ",".join(w for w in wanted if w in flags) or platform.machine()


class OrtRunner:
    """An InferenceSession on the artifact file with pinned threads."""

    def __init__(
        self,
        path: Path,
        intra_threads: int,
        inter_threads: int = 1,
        disabled: Sequence[str] = (),
        profile_prefix: Path | None = None,
    ) -> None:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = intra_threads
        so.inter_op_num_threads = inter_threads
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if profile_prefix is not None:
            # ONNX Runtime's profiler times each node; `session.end_profiling()` writes its JSON.
            so.enable_profiling, so.profile_file_prefix = True, str(profile_prefix)
        try:
            self.session = ort.InferenceSession(
                str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
            )
        except ORT_ERRORS as err:
            raise BackendError(f"ONNX Runtime could not load the artifact {path}: {err}") from err
        self.path = path
        self.input_names: list[str] = [i.name for i in self.session.get_inputs()]
        self.output_names: list[str] = [o.name for o in self.session.get_outputs()]
        self._dtypes = {i.name: _np_dtype(i.type) for i in self.session.get_inputs()}

    def run(self, feeds: Feeds) -> list[Array]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BackendError(f"inputs {missing} missing for {self.path.name}; it takes {self.input_names}")
        typed = {n: _as_dtype(feeds[n], self._dtypes[n]) for n in self.input_names}
        try:
            outputs = self.session.run(self.output_names, typed)
        except ORT_ERRORS as err:
            raise BackendError(
                f"running {self.path.name} failed: {err}; do the inputs match the signature?"
            ) from err
        return [np.asarray(o) for o in outputs]


def _np_dtype(ort_type: str) -> np.dtype[Any] | None:
    """numpy dtype of an ONNX Runtime type string such as tensor(int64); None when unknown."""
    code = getattr(onnx.TensorProto, ort_type.removeprefix("tensor(").removesuffix(")").upper(), None)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code)) if isinstance(code, int) else None


def _as_dtype(value: Array, dtype: np.dtype[Any] | None) -> Array:
    """Feeds in the model's dtype (int32 token ids for an int64 input, say) rather than a failed run."""
    return value if dtype is None or value.dtype == dtype else value.astype(dtype)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def compile(self, request: CompileRequest) -> CompiledArtifact:
        self.check_request(request)
        target = request.target
        opts = options_of(request, OnnxRuntimeOptions)
        model = load_checked(request.onnx())
        work = request.out_dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        threads = opts.intra_op_threads or request.threads or available_cores()
        model_type = detect_model_type(model) if opts.model_type == "auto" else opts.model_type
        record = {
            "precision": target.precision,
            "modelType": model_type,
            "optLevel": opts.opt_level,
            "loadOptLevel": "all",
            "intraOpThreads": str(threads),
            "interOpThreads": str(opts.inter_op_threads),
        }
        # A source with its weights outside the graph (every model over 2 GB) keeps them outside
        # through each step, and the artifact ships them as model.onnx.data beside model.onnx.
        external = bool(onnx_external_files(model))
        data_file = DATA_FILE if external else None
        if external:
            record["externalData"] = "true"
        mode = target.quantization or ("dynamic" if model_type != "none" else "static")
        final = request.out_dir / "model.onnx"
        disabled = [] if opts.skip_layer_norm else ["SkipLayerNormFusion"]
        record["disabledOptimizers"] = ",".join(disabled)
        # Static QDQ quantizes plain MatMuls; the fused Attention op would keep its projections fp32.
        fuse = model_type != "none" and not (target.precision == "int8" and mode == "static")

        def build(fused: bool) -> None:
            graph = request.onnx()
            if fused:
                graph = fuse_transformer(graph, model, work / "fused.onnx", opts, record, external)
            if target.precision == "int8" and mode == "dynamic":
                before, graph = (
                    graph,
                    quantize_dynamic(graph, work / "quantized.onnx", opts, record, external),
                )
                require_quantized(before, graph, mode)
            elif target.precision == "int8":
                weights = {t.name for t in model.graph.initializer}
                inputs = [i.name for i in model.graph.input if i.name not in weights]
                before, graph = graph, quantize_static(graph, inputs, work, request, opts, record, external)
                require_quantized(before, graph, mode)
            optimize_and_save(graph, final, opts.opt_level, threads, disabled, data_file)

        unfused_record = dict(record)  # what the record says before the fusion writes into it
        try:
            build(fuse)
        except BackendError as err:
            if not fuse or not str(err).startswith(_NOT_LOADED):
                raise
            # The fusion is an optimization: a graph ONNX Runtime's own optimizers then fail on
            # (1.31's MatMulAddFusion on wav2vec2's, "Attempt to replace the existing tensor") is
            # built unfused, as it builds with modelType=none, and the record says why.
            record.clear()
            record.update(unfused_record)
            record["transformerFusion"] = f"not loadable, built unfused: {first_line(err)}"
            build(False)
        # ONNX Runtime keeps weights under its 1 KB threshold in the graph: a small (or int8) model
        # whose source had a data file may get none.
        if data_file and not (final.parent / data_file).is_file():
            data_file = None
            record.pop("externalData", None)
        return CompiledArtifact(
            backend=self.name,
            model_path=final,
            data_files=[data_file] if data_file else [],
            options=record,
            toolchain={
                "onnxruntime": str(ort.__version__),
                "onnx": str(onnx.__version__),
                "numpy": str(np.__version__),
                "cpu": cpu_features(),
            },
        )

    def remedies(self, failed: CompiledArtifact) -> list[Remedy]:
        """Per-channel weights, then calibrated static QDQ, then static with the output's float tail
        in float where that tail joins parts, then with the sensitive layers too: each only where
        the failed build was not that already."""
        o = failed.options
        out = []
        if o.get("quantization") == "dynamic":
            if o.get("perChannel") == "false":
                out.append(
                    Remedy("per-channel", "dynamic int8 with per-channel weights", {"perChannel": "true"})
                )
            out.append(Remedy("static", "static int8 calibrated on the reference inputs", {}, "static"))
        if o.get("outputTailNodes") and o.get("keepFloat") is None:
            out.append(
                Remedy(
                    "keep-tail",
                    f"static int8 with the output's float tail ({o['outputTailNodes']} ops) kept in float",
                    {"keepFloat": "tail"},
                    "static",
                )
            )
        if o.get("keepFloat") != "sensitive":
            out.append(
                Remedy(
                    "keep-sensitive",
                    "static int8 with the sensitive layers and the output's float tail kept in float",
                    {"keepFloat": "sensitive"},
                    "static",
                )
            )
        return out

    def load(self, artifact: CompiledArtifact, threads: int | None = None, device: str = "cpu") -> OrtRunner:
        recorded = artifact.options.get("intraOpThreads", "")
        intra = threads or (int(recorded) if recorded.isdigit() else available_cores())
        inter = artifact.options.get("interOpThreads", "1")
        disabled = [d for d in artifact.options.get("disabledOptimizers", "").split(",") if d]
        return OrtRunner(artifact.model_path, intra, int(inter) if inter.isdigit() else 1, disabled)


BACKEND = OnnxRuntimeBackend()
