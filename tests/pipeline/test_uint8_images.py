"""A model that takes images as bytes (uint8, normalized inside forward()), as vision models
exported with their preprocessing come: kompile refused them ("input 'image' is uint8, which
kompile cannot feed"), so the model had to be changed before it could be compiled at all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import yaml
from typer.testing import CliRunner

from kompile.api.spec import InputSpec
from kompile.cli import app
from kompile.compile_jobs.inputs import generate_feeds


class _BytesIn(torch.nn.Module):
    """A small CNN whose input is a uint8 image: scaled and normalized inside, as exported with
    its preprocessing."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 10),
        )
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.float() / 255.0
        return self.body((x - self.mean) / self.std)


def _pt2(path: Path) -> Path:
    example = (torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8),)
    torch.export.save(torch.export.export(_BytesIn().eval(), example), str(path))
    return path


def test_generated_bytes_span_the_whole_range() -> None:
    """Without low/high, integers are drawn from [0, 2): a uint8 image would be black."""
    (feed,) = generate_feeds([InputSpec(name="image", dtype="uint8", shape=[1, 3, 32, 32])], 1, 0)
    image = feed["image"]
    assert image.dtype == np.uint8 and image.min() < 16 and image.max() > 240, (image.min(), image.max())


def test_a_uint8_image_model_is_read_compiled_and_validated(tmp_path: Path) -> None:
    model = _pt2(tmp_path / "bytes.pt2")
    runner = CliRunner()
    res = runner.invoke(app, ["init", str(model)], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    (written,) = yaml.safe_load((tmp_path / "bytes.yaml").read_text())["spec"]["inputs"]
    assert written["dtype"] == "uint8" and (written["low"], written["high"]) == (0, 256), written

    res = runner.invoke(
        app,
        ["run", str(model), "--json", "--no-register", "--work-dir", str(tmp_path / ".kompile")],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.stderr
    (target,) = json.loads(res.stdout)["targets"]
    phases = {c["name"]: c["phase"] for c in target["candidates"]}
    assert {"onnxruntime-fp32", "openvino-fp32", "inductor-fp32"} <= set(phases), phases
    assert all(p == "Succeeded" for n, p in phases.items() if "fp32" in n), target["candidates"]

    # The artifact takes the bytes as they come, and says so to its server.
    repo = Path(target["artifact"]["uri"].removeprefix("file://"))
    config = next(repo.glob("*/config.pbtxt")).read_text()
    assert "TYPE_UINT8" in config, config
    onnx_files = list(repo.glob("*/1/model.onnx"))
    if onnx_files:
        session = ort.InferenceSession(str(onnx_files[0]))
        assert session.get_inputs()[0].type == "tensor(uint8)"
