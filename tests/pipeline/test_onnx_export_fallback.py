"""A .pt2 source that torch.onnx cannot export stopped the whole run ("error: cannot export ... to
ONNX"), though inductor compiles the PyTorch model itself and needs no ONNX.

- torch.onnx fails on some programs as torch.export.save wrote them, and takes the same module
  exported again with the declared dims: that export is used (ONNX Runtime and OpenVINO build).
- Where both fail (an operator with no ONNX function), each ONNX backend's candidate fails with the
  export's error (ExportFailed) and the backends that compile the PyTorch model go on; a run with
  no such backend is refused as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.pipeline.conftest import small_cnn_doc
from tests.unit.test_onnx_export_messages import upsampled_pt2


class Calibrated(torch.nn.Module):
    """A linear score mapped through a piecewise-linear calibration, looked up with searchsorted (as
    ranking and tabular models calibrate): torch.onnx has no function for aten.searchsorted."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.score = torch.nn.Linear(8, 1)
        self.register_buffer("knots", torch.linspace(-3.0, 3.0, 9))
        self.register_buffer("values", torch.sigmoid(torch.linspace(-3.0, 3.0, 9)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.score(x).squeeze(-1).clamp(-3.0, 3.0 - 1e-4)
        i = torch.searchsorted(self.knots, s.contiguous(), right=True).clamp(1, 8)
        lo, hi = self.knots[i - 1], self.knots[i]
        t = (s - lo) / (hi - lo)
        return self.values[i - 1] * (1 - t) + self.values[i] * t


def _calibrated_pt2(path: Path) -> Path:
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Calibrated().eval(), (torch.rand(4, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, path)
    return path


def _manifest(write_manifest: Any, source: Path, inputs: list[dict[str, Any]], backends: list[str]) -> Path:
    targets = [{"name": "cpu", "precision": "fp32", "candidates": [{"backend": b} for b in backends]}]
    doc = small_cnn_doc(source={"uri": source.name}, targets=targets)
    doc["spec"]["inputs"] = inputs
    return write_manifest(doc)  # type: ignore[no-any-return]


_TABLE = [
    {
        "name": "x",
        "shape": [-1, 8],
        "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 4, "max": 64}],
    }
]


def _run_calibrated(kompile_run: Any, write_manifest: Any, tmp_path: Path, backends: list[str]) -> Any:
    source = _calibrated_pt2(tmp_path / "calibrated.pt2")
    return kompile_run(_manifest(write_manifest, source, _TABLE, backends))


def test_a_pt2_torch_onnx_fails_on_as_saved_is_exported_again_with_its_dims(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    image = [
        {
            "name": "x",
            "shape": [2, 3, -1, 64],
            "dynamicDims": [{"axis": 2, "name": "height", "min": 64, "opt": 64, "max": 128}],
        }
    ]
    source = upsampled_pt2(tmp_path / "upsampled.pt2")
    res = kompile_run(_manifest(write_manifest, source, image, ["onnxruntime"]))
    assert res.code == 0, res.stderr
    text = " ".join(res.stderr.split())
    assert "torch.onnx failed on the program as saved" in text, text
    assert "AssertionError: expected sympy.Symbol); exported it again with its dims" in text, text
    (target,) = res.status["targets"]
    assert target["phase"] == "Succeeded" and target["backend"] == "onnxruntime", target
    assert target["validation"]["passed"], target


def test_an_unexportable_pt2_is_compiled_by_inductor_and_the_onnx_backends_say_why_not(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    res = _run_calibrated(kompile_run, write_manifest, tmp_path, ["onnxruntime", "inductor"])
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    by_name = {c["name"]: c for c in target["candidates"]}
    ort, inductor = by_name["onnxruntime-fp32"], by_name["inductor-fp32"]
    assert (ort["phase"], ort["reason"]) == ("Failed", "ExportFailed"), ort
    assert "operator aten.searchsorted has no ONNX conversion" in ort["message"], ort
    assert "\x1b" not in ort["message"] and "Next steps" not in ort["message"], ort
    assert inductor["phase"] == "Succeeded" and inductor["selected"], inductor
    assert target["phase"] == "Succeeded" and target["validation"]["passed"], target
    assert "building what compiles the PyTorch model itself: inductor" in " ".join(res.stderr.split())


def test_an_unexportable_pt2_with_only_onnx_backends_is_refused_with_the_cause(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    res = _run_calibrated(kompile_run, write_manifest, tmp_path, ["onnxruntime", "openvino"])
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "cannot export calibrated.pt2" in text and "aten.searchsorted has no ONNX conversion" in text, text
    assert "unexpectedly" not in text, text
