"""A model someone quantized already (ONNX Runtime's quantize_static, Optimum, NNCF: QuantizeLinear
and DequantizeLinear pairs in the graph) is compiled as it is. An int8 target would quantize it a
second time: ONNX Runtime's quantizer refused the graph ("two nodes with same node name") and
OpenVINO's re-rounded it, both reported as if int8 were this model's problem. Its int8 targets are
skipped, saying why and what to run instead; its fp32 target keeps its int8 operators."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.pipeline.conftest import small_cnn_doc, torchscript_onnx


def _quantized_cnn(path: Path) -> Path:
    from models.small import small_cnn  # type: ignore[import-not-found]
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    feed = {"input": np.zeros((1, 3, 32, 32), np.float32)}
    plain = torchscript_onnx(small_cnn().eval(), feed, path.with_name("float.onnx"), {}, "logits")
    rng = np.random.default_rng(0)

    class Calibration(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.feeds = iter([{"input": rng.random((1, 3, 32, 32), np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, Any] | None:
            return next(self.feeds, None)

    quantize_static(str(plain), str(path), Calibration(), quant_format=QuantFormat.QDQ)
    return path


def test_a_quantized_onnx_model_compiles_as_it_is_and_is_not_quantized_twice(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    source = _quantized_cnn(tmp_path / "quantized.onnx")
    targets = [
        {"name": "as-is", "backend": "onnxruntime", "precision": "fp32"},
        {"name": "int8", "precision": "int8"},
        {"name": "ladder", "backend": "onnxruntime", "precision": "auto"},
    ]
    doc = small_cnn_doc(source={"uri": source.name}, targets=targets)
    doc["spec"]["inputs"] = [{"name": "input", "shape": [1, 3, 32, 32]}]
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr
    by_name = {t["name"]: t for t in res.status["targets"]}
    assert by_name["as-is"]["phase"] == "Succeeded", by_name["as-is"]
    skipped = by_name["int8"]
    assert skipped["phase"] == "Skipped" and skipped["reason"] == "AlreadyQuantized", skipped
    assert "QuantizeLinear" in skipped["message"] and "fp32 target" in skipped["message"], skipped
    ladder = by_name["ladder"]
    assert ladder["phase"] == "Succeeded", ladder
    assert all(c["precision"] != "int8" for c in ladder["candidates"]), ladder["candidates"]
    assert any(n.startswith("int8: the source is quantized already") for n in ladder["notOffered"]), ladder
    assert "Traceback" not in res.stderr and "WARNING:root" not in res.stderr, res.stderr


def _dynamically_quantized(path: Path) -> Path:
    """A layer as ONNX Runtime's quantize_dynamic writes one: the activation quantized per call
    (DynamicQuantizeLinear), an integer MatMul, then back to float."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(1)
    weight = rng.integers(-100, 100, (64, 16), dtype=np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
        helper.make_node("Mul", ["accf", "s"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", T.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["n", 16])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def test_another_runtimes_rounding_of_a_quantized_source_is_held_to_int8_limits(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    """Each runtime quantizes a per-call activation its own way: OpenVINO computes a zero point of
    127 where ONNX Runtime computes 128 (a range of -2.55..2.55), one step on every value. Its
    fp32 artifact of ddddocr's dynamically quantized OCR model moved the logits by 0.296 of 20.8
    (cosine 0.99969) and was refused at fp32's limits. A quantized source's artifacts are held to
    int8's limits, whatever the target's precision: the int8 arithmetic is the source's."""
    source = _dynamically_quantized(tmp_path / "dynamic.onnx")
    rng = np.random.default_rng(0)
    x = np.clip(rng.standard_normal((8, 64)), -2.5, 2.5)
    x[:, 0], x[:, 1] = -2.55, 2.55  # the range whose zero point lies on a half
    np.savez(tmp_path / "samples.npz", x=x.astype(np.float32))
    candidates = [
        {"backend": "onnxruntime", "precision": "fp32"},
        {"backend": "openvino", "precision": "fp32"},
    ]
    doc = small_cnn_doc(
        source={"uri": source.name},
        inputs=[
            {
                "name": "x",
                "shape": [-1, 64],
                "dynamicDims": [{"axis": 0, "name": "n", "min": 1, "opt": 1, "max": 8}],
            }
        ],
        targets=[{"name": "cpu", "candidates": candidates}],
        validation={"dataset": "samples.npz"},
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    cands = {c["name"]: c for c in target["candidates"]}
    assert cands["openvino-fp32"]["reason"] == "Validated", cands["openvino-fp32"]
    assert cands["openvino-fp32"]["maxAbsError"] > 0.01  # one step of some activations: not fp32 rounding
    assert target["validation"]["thresholds"]["minCosine"] == 0.99, target["validation"]
