"""The TensorRT backend's CPU half, for real: ModelOpt prepares the graph for each precision and ONNX
Runtime checks it against the eager source model on CPU. No GPU and no TensorRT needed."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("modelopt.onnx.autocast")
pytest.importorskip("transformers")

from kompile.api.spec import InputSpec, Precision, Target, Tolerances  # noqa: E402
from kompile.compile_jobs.backends.base import BackendError, CompileRequest, Feeds  # noqa: E402
from kompile.compile_jobs.backends.tensorrt import CheckedGraph, prepare_and_check  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from tests.pipeline.conftest import bert_tiny_case, torchscript_onnx  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
SEQ = 16

IMAGE = InputSpec.model_validate(
    {
        "name": "input",
        "shape": [-1, 3, 32, 32],
        "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 4, "max": 32}],
    }
)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, list[Feeds]]:
    from models.small import small_cnn

    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((4, 3, 32, 32)).astype(np.float32)} for _ in range(8)]
    model = small_cnn()
    path = tmp_path_factory.mktemp("cnn") / "small_cnn.onnx"
    dyn = {"input": {0: "batch"}, "logits": {0: "batch"}}
    return model, torchscript_onnx(model, feeds[0], path, dyn, "logits"), feeds


def _request(
    case: tuple[Any, Path, list[Feeds]], out: Path, target: Target, sig: list[InputSpec]
) -> CompileRequest:
    model, path, feeds = case
    return compile_request(
        target, onnx_path=path, out_dir=out, signature=sig, feeds=feeds, threads=1, module=model
    )


def _io_types(path: Path) -> set[int]:
    graph = onnx.load(str(path)).graph
    return {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}


@pytest.mark.parametrize(
    ("precision", "marker"),
    [
        ("fp32", None),
        ("fp16", onnx.TensorProto.FLOAT16),
        ("bf16", onnx.TensorProto.BFLOAT16),
        ("int8", onnx.TensorProto.INT8),
    ],
)
def test_cnn_prepared_per_precision_and_checked_on_cpu(
    cnn: tuple[Any, Path, list[Feeds]], tmp_path: Path, precision: Precision, marker: int | None
) -> None:
    target = Target(name=f"gpu-{precision}", backend="tensorrt", precision=precision)
    started = time.perf_counter()
    checked = prepare_and_check(_request(cnn, tmp_path, target, [IMAGE]))
    seconds = time.perf_counter() - started
    assert isinstance(checked, CheckedGraph) and checked.check is not None
    assert checked.check.passed, checked.check.failures
    record = checked.prepared.record
    assert record["cpuValidation"].startswith("passed")
    print(f"{precision}: prep+check {seconds:.2f}s, min cosine {record['cpuMinCosine']}, {record}")
    graph = onnx.load(str(checked.prepared.path)).graph
    # The serving signature stays fp32 whatever runs inside: Triton's config is written from it.
    assert _io_types(checked.prepared.path) == {onnx.TensorProto.FLOAT}
    if marker is None:
        assert record["preparation"] == "as-exported"
    elif precision == "int8":
        assert record["preparation"] == "modelopt-int8-qdq" and int(record["quantizeNodes"]) > 0
        q_types = {n.op_type for n in graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= q_types
        assert (tmp_path / "prepared" / "calibration.npz").is_file()
        assert set(np.load(tmp_path / "prepared" / "calibration.npz").files) == {"input"}
    else:
        assert record["preparation"] == f"modelopt-autocast-{precision}"
        assert any(t.data_type == marker for t in graph.initializer)
    if precision == "bf16":
        assert "emulated" in record["cpuValidation"]


def test_precision_that_cannot_hold_accuracy_is_refused_on_cpu(
    cnn: tuple[Any, Path, list[Feeds]], tmp_path: Path
) -> None:
    # Real int8 error measured against tolerances it cannot meet: refused before any GPU build.
    strict = Tolerances(max_abs_error=1e-6, min_cosine=0.9999999)
    target = Target(name="gpu-int8", backend="tensorrt", precision="int8", tolerances=strict)
    with pytest.raises(BackendError) as err:
        prepare_and_check(_request(cnn, tmp_path, target, [IMAGE]))
    text = str(err.value)
    assert "int8 graph missed the validation thresholds on CPU, before any GPU build" in text
    assert "max abs error" in text and "> limit 1e-06" in text
    assert "higher precision" in text


def test_int8_without_samples_says_what_to_provide(
    cnn: tuple[Any, Path, list[Feeds]], tmp_path: Path
) -> None:
    model, path, _ = cnn
    target = Target(name="gpu-int8", backend="tensorrt", precision="int8")
    request = compile_request(
        target, onnx_path=path, out_dir=tmp_path, signature=[IMAGE], feeds=[], module=model
    )
    with pytest.raises(BackendError, match="calibrates activation ranges on reference inputs"):
        prepare_and_check(request)


def test_cpu_validation_can_be_skipped(cnn: tuple[Any, Path, list[Feeds]], tmp_path: Path) -> None:
    target = Target(name="gpu-fp16", backend="tensorrt", precision="fp16", options={"cpuValidation": "false"})
    checked = prepare_and_check(_request(cnn, tmp_path, target, [IMAGE]))
    assert checked.check is None and checked.prepared.record["cpuValidation"] == "skipped"


def test_bert_tiny_fp16_prepared_and_checked(tmp_path: Path) -> None:
    model, path, feeds, sig = bert_tiny_case(tmp_path, SEQ)
    target = Target(name="gpu-fp16", backend="tensorrt", precision="fp16")
    checked = prepare_and_check(_request((model, path, feeds), tmp_path / "out", target, sig))
    assert checked.check is not None and checked.check.passed, checked.check.failures
    print(f"bert_tiny fp16: min cosine {checked.prepared.record['cpuMinCosine']}")


def test_modelopt_int8_leaves_onnxruntime_quantization_as_it_was(
    cnn: tuple[Any, Path, list[Feeds]], tmp_path: Path
) -> None:
    """ModelOpt's int8 quantization patches ONNX Runtime's quantization modules in place; in one
    kompile run a TensorRT int8 candidate came before an ONNX Runtime static int8 one, which then
    failed ("Quantization parameters are not specified"). The preparation must undo the patches.
    It also deletes Concat, Sigmoid, Softmax and more from the registries of ops ONNX Runtime
    quantizes: found by CI, where an earlier test's TensorRT int8 left the same worker's ONNX Runtime
    int8 of NudeNet's detector with its decoding in float (and passing, where alone it fails)."""
    from onnxruntime.quantization import registry

    from kompile.compile_jobs.backends.base import get_backend

    registries = ("QDQRegistry", "QLinearOpsRegistry", "IntegerOpsRegistry")
    before = {name: dict(getattr(registry, name)) for name in registries}
    target = Target(name="gpu-int8", backend="tensorrt", precision="int8")
    prepare_and_check(_request(cnn, tmp_path / "trt", target, [IMAGE]))
    for name in registries:
        assert dict(getattr(registry, name)) == before[name], name
    ort_target = Target(name="cpu-int8", backend="onnxruntime", precision="int8", quantization="static")
    _, path, feeds = cnn
    request = compile_request(
        ort_target, onnx_path=path, out_dir=tmp_path / "ort", signature=[IMAGE], feeds=feeds, threads=1
    )
    artifact = get_backend("onnxruntime").compile(request)
    assert artifact.options["quantization"] == "static"
