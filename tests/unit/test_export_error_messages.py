"""What kompile says when torch.export refuses a declared dynamic range
(kompile.compile_jobs.backends.inductor.describe_export_error), on torch.export's own errors."""

from __future__ import annotations

import pytest
import torch

from kompile.compile_jobs.backends.inductor import describe_export_error


class Branches(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[1] <= 24 else x


class Fixed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(2, 16 * 8)


def _refusal(module: torch.nn.Module, x: torch.Tensor, top: int) -> str:
    seq = torch.export.Dim("seq", min=2, max=top)
    with pytest.raises(Exception) as err:
        torch.export.export(module, (x,), dynamic_shapes=({1: seq},))
    return describe_export_error(err.value, type(module).__name__)


def test_a_range_the_code_holds_narrower_names_the_bound_torch_export_found() -> None:
    """Found by reading: code that holds a dim to 24 was told the dim 'is treated as a constant' and
    to make it static, where narrowing its max (or a shape-generic branch) is the fix."""
    message = _refusal(Branches(), torch.ones(2, 16, 8), 32)
    assert "Dim('seq', max=24)" in message, message
    assert "holds seq only in a narrower range than spec.inputs declares" in message, message
    assert "treated as a constant" not in message, message


def test_a_size_the_code_fixes_says_the_dim_is_a_constant() -> None:
    message = _refusal(Fixed(), torch.ones(2, 16, 8), 32)
    assert "treated as a constant" in message and "seq = 16" in message, message
