"""An ONNX Runtime int8 build must quantize something. Its quantizers return the graph unchanged
where they find nothing they take (Silero VAD: every Conv and LSTM inside If branches), and
kompile labelled that fp32 graph int8: it validated, as fp32 does, and precision auto stopped at
it. Each case is a real quantizer run on a small graph built here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kompile.api.catalog.onnxruntime import OnnxRuntimeOptions
from kompile.compile_jobs.backends.base import BackendError
from kompile.compile_jobs.backends.onnxruntime import (
    quantize_dynamic,
    quantize_static,
    quantized_nodes,
    require_quantized,
)
from tests.support.pretrained_files import silero_file

RNG = np.random.default_rng(0)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _save(
    path: Path, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], **inputs: list[int]
) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(n, TensorProto.BOOL if n == "flag" else TensorProto.FLOAT, s)
            for n, s in inputs.items()
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _matmul(path: Path) -> Path:
    """One MatMul by a constant weight: what the dynamic quantizer takes."""
    return _save(path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight("w", 8, 4)], x=[2, 8])


def _dynamic(src: Path, tmp_path: Path) -> Path:
    return quantize_dynamic(src, tmp_path / "quantized.onnx", OnnxRuntimeOptions(), {}, external=False)


def test_a_matmul_graph_quantizes_and_passes(tmp_path: Path) -> None:
    src = _matmul(tmp_path / "mm.onnx")
    out = _dynamic(src, tmp_path)
    assert quantized_nodes(onnx.load(str(out)).graph) > 0
    require_quantized(src, out, "dynamic")  # does not raise


def test_gemms_under_the_dynamic_quantizer_become_integer_matmuls(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1),
    ]
    inits = [_weight("w1", 16, 8), _weight("b1", 16), _weight("w2", 4, 16), _weight("b2", 4)]
    src = _save(tmp_path / "mlp.onnx", nodes, inits, x=[2, 8])
    out = _dynamic(src, tmp_path)
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("MatMulInteger") == 2, ops
    require_quantized(src, out, "dynamic")


def test_weights_inside_if_branches_are_refused_naming_the_branches(tmp_path: Path) -> None:
    """Silero VAD's shape: the branch reads its weight from the outer graph."""

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], [f"{name}_y"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2, 4])],
        )

    cond = helper.make_node("If", ["flag"], ["y"], then_branch=branch("then"), else_branch=branch("else"))
    src = _save(tmp_path / "branches.onnx", [cond], [_weight("w", 8, 4)], x=[2, 8], flag=[])
    out = _dynamic(src, tmp_path)
    assert quantized_nodes(onnx.load(str(out)).graph) == 0  # what was labelled int8: the fp32 graph
    with pytest.raises(BackendError) as err:
        require_quantized(src, out, "dynamic")
    assert "its 2 MatMul nodes all lie inside If/Loop/Scan branches" in str(err.value)


def test_a_source_quantized_already_is_said_so(tmp_path: Path) -> None:
    once = _dynamic(_matmul(tmp_path / "mm.onnx"), tmp_path)
    twice = quantize_dynamic(once, tmp_path / "twice.onnx", OnnxRuntimeOptions(), {}, external=False)
    with pytest.raises(BackendError) as err:
        require_quantized(once, twice, "dynamic")
    assert "the source is quantized already" in str(err.value)


def test_a_graph_with_nothing_to_quantize_says_so(tmp_path: Path) -> None:
    src = _save(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])], [], x=[2, 8])
    out = _dynamic(src, tmp_path)
    with pytest.raises(BackendError) as err:
        require_quantized(src, out, "dynamic")
    assert "the graph has none of Conv" in str(err.value)


def test_silero_vads_static_int8_skips_pre_processing_then_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real file silero-vad ships: pre-processing fails on its If branches (a bare assert in
    symbolic shape inference) and is skipped with the reason; the quantizer then takes the graph
    and quantizes nothing, since every Conv and LSTM lies in a branch."""
    src = silero_file("silero_vad.onnx")
    feeds = {
        "input": RNG.standard_normal((1, 576)).astype(np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }
    # stands in for CompileRequest: its calibration only
    request = SimpleNamespace(calibration=[feeds], calibration_at_sizes=[feeds, feeds], sized_inputs=[feeds])
    record: dict[str, str] = {}
    out = quantize_static(src, list(feeds), tmp_path, request, OnnxRuntimeOptions(), record, external=False)  # type: ignore[arg-type]
    assert record["preProcess"].startswith("skipped: AssertionError in symbolic_shape_infer.py"), record
    assert "pre-processing" not in caplog.text  # the quantizer's advice: the record says it was skipped
    with pytest.raises(BackendError) as err:
        require_quantized(src, out, "static")
    assert "nodes all lie inside If/Loop/Scan branches" in str(err.value)


def test_the_dynamic_quantizers_untyped_tensor_dumps_are_held_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """silero-vad's op-15 export has its Convs in the main graph: quantized, with a warning and a
    protobuf dump for each tensor shape inference left untyped, which told a user nothing."""
    src = silero_file("silero_vad_16k_op15.onnx")
    out = _dynamic(src, tmp_path)
    require_quantized(src, out, "dynamic")  # its main-graph Convs are quantized
    assert "Inference failed" not in caplog.text and "elem_type" not in caplog.text, caplog.text


def _conv(path: Path) -> Path:
    """One Conv by a constant weight: what static int8 quantizes per channel."""
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    flat = helper.make_node("Flatten", ["c"], ["y"])
    _save(path, [conv, flat], [_weight("w", 4, 3, 3, 3)], x=[1, 3, 8, 8])
    model = onnx.load(str(path))
    model.ir_version = 9  # what ONNX Runtime's pre-processing session loads
    onnx.save(model, str(path))
    return path


def _told_cpu(monkeypatch: pytest.MonkeyPatch, flags: set[str]) -> None:
    """The CPU kompile reads, stood in for: an x86 machine with these flags."""
    from kompile.compile_jobs import hardware

    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("stand-in CPU", flags))
    monkeypatch.setattr(hardware, "local_arch", lambda: "amd64")


@pytest.mark.parametrize(
    ("flags", "bits"),
    [
        ({"avx2", "fma"}, 7),
        ({"avx2", "avx512f"}, 7),
        ({"avx2", "avx_vnni"}, 8),
        ({"avx512f", "avx512_vnni"}, 8),
    ],
)
def test_static_int8_keeps_weights_to_7_bits_where_the_cpu_has_no_vnni(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: set[str], bits: int
) -> None:
    """Without VNNI, x86 int8 kernels add u8 x s8 product pairs in int16 (vpmaddubsw), which 8-bit
    weights saturate; reduceRange auto keeps them to 7 bits there and to 8 elsewhere."""
    _told_cpu(monkeypatch, flags)
    src = _conv(tmp_path / "conv.onnx")
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    request = SimpleNamespace(calibration=feeds, calibration_at_sizes=feeds, sized_inputs=[])
    record: dict[str, str] = {}
    out = quantize_static(src, ["x"], tmp_path, request, OnnxRuntimeOptions(), record, external=False)  # type: ignore[arg-type]
    weights = [
        numpy_helper.to_array(t)
        for t in onnx.load(str(out)).graph.initializer
        if t.data_type == TensorProto.INT8
    ]
    widest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert record["reduceRange"] == ("true" if bits == 7 else "false")
    assert widest <= 64 if bits == 7 else widest == 127, widest


def test_reduce_range_named_overrides_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _told_cpu(monkeypatch, {"avx2"})
    src = _conv(tmp_path / "conv.onnx")
    feeds = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)}]
    request = SimpleNamespace(calibration=feeds, calibration_at_sizes=feeds, sized_inputs=[])
    record: dict[str, str] = {}
    opts = OnnxRuntimeOptions.model_validate({"reduceRange": "false"})
    quantize_static(src, ["x"], tmp_path, request, opts, record, external=False)  # type: ignore[arg-type]
    assert record["reduceRange"] == "false"
    # dynamic int8 stays 8-bit under auto (7-bit per-tensor weights cost real MiniLM more)
    dyn: dict[str, str] = {}
    quantize_dynamic(
        _matmul(tmp_path / "mm.onnx"), tmp_path / "q.onnx", OnnxRuntimeOptions(), dyn, external=False
    )
    assert dyn["reduceRange"] == "false"
