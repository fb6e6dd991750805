"""Static int8 calibrated at every size it is validated at. The activation ranges were fixed on the
reference inputs alone, at each dynamic dim's opt, and an output that grows with the size (a
detector's box coordinates) was clipped at the sizes above it: NudeNet's YOLOv8 (the file nudenet
ships), calibrated at 224, failed at 512 with cosine 0.958 through ONNX Runtime and 0.954 through
OpenVINO. The inputs the dims check holds the artifact at (min, half opt, max) calibrate too, and
OpenVINO takes the global min and max of them, where NNCF's default averaged the largest away."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.pipeline.conftest import small_cnn_doc

LOCATOR = """
import torch


class Locator(torch.nn.Module):
    \"\"\"Per column: features and the column's x coordinate mixed by a 1x1 convolution, as a
    detector's head turns positions into boxes: its input grows with the width.\"\"\"

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(5, 5, 1)

    def forward(self, x):
        features = torch.relu(self.conv(x)).mean(dim=2, keepdim=True)  # [n, 4, 1, width]
        where = torch.cumsum(torch.sigmoid(x[:, :1, :1, :]) * 2, dim=-1)  # about 1, 2, ... width
        return self.head(torch.cat([features, where], dim=1)).flatten(1)


def locator():
    torch.manual_seed(0)
    return Locator().eval()
"""


def test_int8_holds_an_output_that_grows_with_the_size_at_the_max(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    (tmp_path / "locator.py").write_text(LOCATOR)
    width = {"axis": 3, "name": "width", "min": 16, "opt": 32, "max": 128}
    candidates = [
        {"name": "ort", "backend": "onnxruntime", "precision": "int8", "quantization": "static"},
        {"name": "ov", "backend": "openvino", "precision": "int8"},
    ]
    doc = small_cnn_doc(
        source={"uri": "python://locator:locator"},
        inputs=[{"name": "input", "shape": [1, 3, 8, -1], "dynamicDims": [width]}],
        targets=[{"name": "cpu", "candidates": candidates}],
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    cands = {c["name"]: c for c in target["candidates"]}
    for name in ("ort", "ov"):
        assert cands[name]["reason"] == "Validated", cands[name]
        # Width 16 from the calibrating sample 0 (sample 1 of 2 is held out) and width 128 from it.
        assert cands[name]["options"]["calibrationAtOtherSizes"] == "2", cands[name]["options"]
    assert cands["ov"]["options"]["activationRanges"] == "minmax"
    assert "width 128" in target["validation"]["checkedAt"], target["validation"]
