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
