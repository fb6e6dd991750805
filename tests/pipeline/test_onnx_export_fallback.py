"""A PyTorch source that torch.onnx cannot export stopped the whole run ("error: cannot export ...
to ONNX"), though inductor compiles the PyTorch model itself and needs no ONNX. Now each ONNX
backend's candidate fails with the export's error (ExportFailed) and the backends that compile the
PyTorch model go on; a run with no such backend is refused as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.pipeline.conftest import small_cnn_doc
from tests.unit.test_onnx_export_messages import upsampled_pt2


def _manifest(write_manifest: Any, tmp_path: Path, candidates: list[str]) -> Path:
    source = upsampled_pt2(tmp_path / "upsampled.pt2")
    targets = [{"name": "cpu", "precision": "fp32", "candidates": [{"backend": b} for b in candidates]}]
    doc = small_cnn_doc(source={"uri": source.name}, targets=targets)
    doc["spec"]["inputs"] = [
        {
            "name": "x",
            "shape": [2, 3, -1, 64],
            "dynamicDims": [{"axis": 2, "name": "height", "min": 64, "opt": 64, "max": 128}],
        }
    ]
    return write_manifest(doc)  # type: ignore[no-any-return]


def test_an_unexportable_pt2_is_compiled_by_inductor_and_the_onnx_backends_say_why_not(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    res = kompile_run(_manifest(write_manifest, tmp_path, ["onnxruntime", "inductor"]))
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    by_name = {c["name"]: c for c in target["candidates"]}
    ort, inductor = by_name["onnxruntime-fp32"], by_name["inductor-fp32"]
    assert (ort["phase"], ort["reason"]) == ("Failed", "ExportFailed"), ort
    assert "AssertionError: expected sympy.Symbol" in ort["message"] and "\x1b" not in ort["message"]
    assert inductor["phase"] == "Succeeded" and inductor["selected"], inductor
    assert target["phase"] == "Succeeded" and target["validation"]["passed"], target
    assert "building what compiles the PyTorch model itself: inductor" in " ".join(res.stderr.split())


def test_an_unexportable_pt2_with_only_onnx_backends_is_refused_with_the_cause(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    res = kompile_run(_manifest(write_manifest, tmp_path, ["onnxruntime", "openvino"]))
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "cannot export upsampled.pt2" in text and "step 2/3" in text, text
    assert "expected sympy.Symbol" in text and "unexpectedly" not in text, text
