"""Graph preparation for TensorRT, on CPU: the ONNX graph the engine is built from, per precision.

TensorRT 11 builds strongly typed networks only (no FP16/INT8 builder flags, no INT8 calibrator), so
precision lives in the graph itself, and the graph can be checked before any GPU is involved:
- fp32: the graph as exported;
- fp16 / bf16: NVIDIA ModelOpt's AutoCast casts what is safe to the low precision (nodes whose
  values overflow it stay fp32); graph inputs and outputs keep fp32, so the serving signature holds;
- int8: ModelOpt's ONNX quantization inserts Q/DQ pairs, calibrated on the reference inputs with
  ONNX Runtime's CPU provider; layers left unquantized run at `high_precision` (fp16 by default).

`check_on_cpu` runs the prepared graph with ONNX Runtime on CPU against the source's outputs with the
precision's tolerances, so a precision that cannot hold accuracy is refused in seconds on any node.
ONNX Runtime's CPU provider has no bf16 kernels, so a bf16 graph runs as an emulation there: every
bf16 tensor is rounded to bf16 and computed in fp32 (what TensorRT stores, not how it accumulates).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kompile.api.status import Thresholds, ValidationResult
from kompile.api.vocabulary import TaskKind
from kompile.compile_jobs.backends.base import BackendError, Feeds

if TYPE_CHECKING:
    from kompile.compile_jobs.run_results import RunResults

Array = np.ndarray[Any, Any]

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
_LOW = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
# What ModelOpt raises on a graph outside what it handles (it has no error class of its own).
_TOOL_ERRORS = (
    RuntimeError,
    ValueError,
    AssertionError,
    KeyError,
    IndexError,
    TypeError,
    onnx.checker.ValidationError,
    onnx.shape_inference.InferenceError,
)


@dataclass
class PreparedGraph:
    """The graph to build from, and how it was made."""

    path: Path
    precision: str
    record: dict[str, str] = field(default_factory=dict)


def _modelopt_missing(err: ImportError) -> BackendError:
    return BackendError(
        f"graph preparation needs NVIDIA ModelOpt ({err.name or 'modelopt'} is missing): install "
        "requirements/modelopt.txt with --no-deps (scripts/setup-venv.sh does), or pip install "
        "'kompile[tensorrt]'; or build at precision fp32, which needs no preparation"
    )


def _quiet_modelopt() -> None:
    # ModelOpt sets INFO on each of its loggers at import; a compile log wants its warnings only.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("modelopt"):
            logging.getLogger(name).setLevel(logging.WARNING)


def input_names(model: onnx.ModelProto) -> list[str]:
    weights = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in weights]


def calibration_arrays(feeds: Sequence[Feeds], names: Sequence[str]) -> dict[str, Array]:
    """Samples stacked along the batch axis, keyed by input name (what ModelOpt calibrates on)."""
    missing = [n for n in names if any(n not in f for f in feeds)]
    if missing:
        raise BackendError(f"calibration samples lack inputs {missing}; the graph takes {list(names)}")
    return {n: np.concatenate([np.asarray(f[n]) for f in feeds], axis=0) for n in names}


def _autocast(src: Path, dst: Path, precision: str, exclude_ops: Sequence[str]) -> dict[str, str]:
    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision
    except ImportError as err:
        raise _modelopt_missing(err) from err
    _quiet_modelopt()
    try:
        model = convert_to_mixed_precision(
            onnx_path=str(src),
            low_precision_type=precision,
            op_types_to_exclude=list(exclude_ops) or None,
            keep_io_types=True,
            providers=["cpu"],
        )
    except _TOOL_ERRORS as err:
        raise BackendError(
            f"ModelOpt AutoCast to {precision} failed on {src.name}: {err}; exclude the failing op "
            "types with option excludeOps (comma-separated), or build at fp32"
        ) from err
    onnx.save(model, str(dst))
    low = _LOW[precision]
    casts = sum(1 for n in model.graph.node if n.op_type == "Cast")
    low_inits = sum(1 for t in model.graph.initializer if t.data_type == low)
    return {
        "preparation": f"modelopt-autocast-{precision}",
        "casts": str(casts),
        "lowPrecisionWeights": str(low_inits),
    }


# Where ONNX Runtime's static quantization lives. ModelOpt's int8 quantization replaces functions
# and methods here for the whole process (modelopt.onnx.quantization.ort_patching), after which ONNX
# Runtime's own static int8 quantization fails ("Quantization parameters are not specified"): a run
# with a TensorRT int8 candidate before an ONNX Runtime one must get ONNX Runtime back as it ships.
_ORT_QUANTIZATION_MODULES = (
    "onnxruntime.quantization.calibrate",
    "onnxruntime.quantization.base_quantizer",
    "onnxruntime.quantization.qdq_quantizer",
    "onnxruntime.quantization.onnx_quantizer",
)
# And the registries of the ops it quantizes, which ModelOpt edits in place (configure_ort deletes
# Concat, Sigmoid, Softmax, Split and more): left so, ONNX Runtime's static int8 of a detector kept
# its decoding in float after a TensorRT int8 candidate in the same process, and not alone.
_ORT_QUANTIZATION_REGISTRIES = ("QDQRegistry", "QLinearOpsRegistry", "IntegerOpsRegistry")


@contextlib.contextmanager
def onnxruntime_quantization_kept() -> Iterator[None]:
    """Run a block, then restore every function and class attribute of ONNX Runtime's quantization
    modules that the block replaced, and the contents of its op registries."""
    modules = [importlib.import_module(name) for name in _ORT_QUANTIZATION_MODULES]
    owners: list[Any] = [*modules]
    for module in modules:
        owners += [
            c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__
        ]
    saved = [(owner, dict(vars(owner))) for owner in owners]
    registry = importlib.import_module("onnxruntime.quantization.registry")
    tables: list[dict[str, Any]] = [getattr(registry, name) for name in _ORT_QUANTIZATION_REGISTRIES]
    contents = [dict(table) for table in tables]
    try:
        yield
    finally:
        for owner, before in saved:
            for key, value in before.items():
                if vars(owner).get(key) is not value:
                    setattr(owner, key, value)
        for table, content in zip(tables, contents, strict=True):
            table.clear()
            table.update(content)


def _quantize(
    src: Path,
    dst: Path,
    calibration: dict[str, Array],
    high_precision: str,
    method: str,
    exclude_ops: Sequence[str],
) -> dict[str, str]:
    try:
        from modelopt.onnx.quantization import quantize
    except ImportError as err:
        raise _modelopt_missing(err) from err
    _quiet_modelopt()
    try:
        with onnxruntime_quantization_kept():
            quantize(
                onnx_path=str(src),
                quantize_mode="int8",
                calibration_data=calibration,
                calibration_method=method,
                calibration_eps=["cpu"],
                op_types_to_exclude=list(exclude_ops) or None,
                high_precision_dtype=high_precision,
                output_path=str(dst),
                log_level="WARNING",
            )
    except _TOOL_ERRORS as err:
        raise BackendError(
            f"ModelOpt int8 quantization of {src.name} failed: {err}; exclude the failing op types "
            "with option excludeOps, or build at fp16"
        ) from err
    model = onnx.load(str(dst), load_external_data=False)
    qdq = sum(1 for n in model.graph.node if n.op_type == "QuantizeLinear")
    return {
        "preparation": "modelopt-int8-qdq",
        "quantizeNodes": str(qdq),
        "highPrecision": high_precision,
        "calibrationMethod": method,
        "calibrationProvider": "cpu",
    }


def prepare_graph(
    src: Path,
    precision: str,
    out_dir: Path,
    calibration: Sequence[Feeds] = (),
    *,
    high_precision: str = "fp16",
    calibration_method: str = "entropy",
    exclude_ops: Sequence[str] = (),
) -> PreparedGraph:
    """Write the graph TensorRT builds `precision` from into out_dir; runs on CPU only."""
    if precision not in PRECISIONS:
        raise BackendError(f"tensorrt builds {list(PRECISIONS)}, not {precision}")
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / f"prepared-{precision}.onnx"
    if precision == "fp32":
        shutil.copyfile(src, dst)
        return PreparedGraph(dst, precision, {"preparation": "as-exported"})
    if precision in _LOW:
        return PreparedGraph(dst, precision, _autocast(src, dst, precision, exclude_ops))
    if not calibration:
        raise BackendError(
            "int8 calibrates activation ranges on reference inputs and none were given: provide "
            "validation samples or a dataset (spec.validation), or build at fp16"
        )
    names = input_names(onnx.load(str(src), load_external_data=False))
    arrays = calibration_arrays(calibration, names)
    # Kept with the build: the .npz (keyed by input name) the activation ranges came from.
    np.savez(str(out_dir / "calibration.npz"), **arrays)  # type: ignore[arg-type]
    record = _quantize(src, dst, arrays, high_precision, calibration_method, exclude_ops)
    record["calibrationSamples"] = str(len(calibration))
    return PreparedGraph(dst, precision, record)


# ---------------------------------------------------------------------------------------------
# Running the prepared graph on CPU


def emulate_on_cpu(model: onnx.ModelProto, low: int) -> onnx.ModelProto:
    """The graph with every `low`-typed tensor computed in fp32 and rounded through `low` after
    each node (Cast to low, Cast back): runs where ONNX Runtime lacks `low` kernels (bf16 on CPU)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    low_values = {v.name for v in [*graph.value_info, *graph.output] if v.type.tensor_type.elem_type == low}
    for init in graph.initializer:
        if init.data_type == low:
            values = numpy_helper.to_array(init).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(values, init.name))
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for attr in node.attribute:
            if attr.name == "to" and attr.i == low:
                attr.i = TensorProto.FLOAT  # computed in fp32, rounded just below
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == low:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float32)))
        rounded = []
        for i, out in enumerate(node.output):
            if out in low_values:
                node.output[i] = f"{out}__fp32"
                rounded.append(out)
        nodes.append(node)
        for out in rounded:
            nodes.append(helper.make_node("Cast", [f"{out}__fp32"], [f"{out}__low"], to=low))
            nodes.append(helper.make_node("Cast", [f"{out}__low"], [out], to=TensorProto.FLOAT))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # stale element types; ONNX Runtime infers its own
    for v in [*graph.input, *graph.output]:
        if v.type.tensor_type.elem_type == low:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    return inferred


class CpuGraphRunner:
    """The prepared graph on ONNX Runtime's CPU provider (bf16 emulated, see emulate_on_cpu)."""

    def __init__(self, prepared: PreparedGraph, threads: int | None = None) -> None:
        import onnxruntime as ort

        from kompile.compile_jobs.backends.onnxruntime import ORT_ERRORS

        path = prepared.path
        self.emulated = prepared.precision == "bf16"
        if self.emulated:
            path = prepared.path.with_name(prepared.path.stem + "-cpu-emulation.onnx")
            model = onnx.load(str(prepared.path))
            onnx.save(emulate_on_cpu(model, TensorProto.BFLOAT16), str(path))
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads or 0
        so.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except ORT_ERRORS as err:
            raise BackendError(
                f"ONNX Runtime cannot run the prepared {prepared.precision} graph on CPU ({err}); "
                "set option cpuValidation=false to build without the CPU check"
            ) from err
        self.input_names: list[str] = [i.name for i in self.session.get_inputs()]
        self.output_names: list[str] = [o.name for o in self.session.get_outputs()]
        self._types = {i.name: i.type for i in self.session.get_inputs()}

    def run(self, feeds: Feeds) -> list[Array]:
        typed = {}
        for name in self.input_names:
            value = np.asarray(feeds[name])
            if self._types[name] == "tensor(float16)":
                value = value.astype(np.float16)
            elif self._types[name] == "tensor(float)":
                value = value.astype(np.float32)
            typed[name] = value
        return [np.asarray(o, dtype=np.float32) for o in self.session.run(self.output_names, typed)]


def check_on_cpu(
    prepared: PreparedGraph,
    reference: RunResults,
    thresholds: Thresholds,
    task: TaskKind = "auto",
    threads: int | None = None,
) -> ValidationResult:
    """The prepared graph's CPU outputs on the reference inputs, held to the saved reference outputs
    with the target's thresholds and task."""
    from kompile.compile_jobs import run_results

    runner = CpuGraphRunner(prepared, threads)
    outputs = [runner.run(f) for f in reference.inputs]
    label = f"tensorrt-{prepared.precision}-cpu-check"
    return run_results.compare(reference, reference.with_outputs(label, outputs), thresholds, task)
