"""What kompile says when torch.onnx's dynamo exporter (the one a .pt2 source goes through) fails,
on torch.onnx's own errors. Its message opens with the step that failed, goes on with next steps
for torch's developers, and gives the cause last under "## Exception summary", coloured for a
terminal: kompile quoted the first line only ("Failed to convert ... \\x1b[96mThis is step
3/3\\x1b[0m of exporting the model to ONNX. Next steps:"), which names no cause."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kompile.compile_jobs.export import describe_failure


@torch.library.custom_op("kompile_tests::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@doubled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CustomOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return doubled(x) + 1


class Upsampled(torch.nn.Module):
    """A strided conv and a resize back to the input's size: a segmentation head in small."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.conv(x), size=x.shape[-2:], mode="bilinear", align_corners=False)


def upsampled_pt2(path: Path) -> Path:
    """Upsampled saved with its height a multiple of 32 (torch.export's own suggested fix for a
    stride-2 model, h = 32*_h): torch 2.15's ONNX exporter fails on the loaded program
    (AssertionError: expected sympy.Symbol) where inductor compiles it."""
    x = torch.rand(2, 3, 64, 64)
    height = 32 * torch.export.Dim("h", min=2, max=16)
    torch.export.save(torch.export.export(Upsampled(), (x,), dynamic_shapes={"x": {2: height}}), path)
    return path


def _failure(program: torch.nn.Module | torch.export.ExportedProgram, x: torch.Tensor) -> str:
    with pytest.raises(Exception) as err, contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(program, (x,), dynamo=True)
    return describe_failure(err.value)


def test_an_operator_without_onnx_conversion_is_named_with_the_ways_round() -> None:
    message = _failure(CustomOp().eval(), torch.rand(2, 3))
    assert message.startswith("operator kompile_tests.doubled has no ONNX conversion"), message
    assert "step 3/3" in message and "custom_translation_table" in message and "inductor" in message
    assert "\x1b" not in message and "Next steps" not in message, message


def test_a_failed_step_gives_its_root_cause_without_terminal_colours(tmp_path: Path) -> None:
    program = torch.export.load(upsampled_pt2(tmp_path / "up.pt2"))
    message = _failure(program, torch.rand(2, 3, 64, 64))
    assert message == (
        "torch.onnx step 2/3 (Failed to decompose the FX graph for ONNX compatibility): "
        "AssertionError: expected sympy.Symbol"
    ), message
