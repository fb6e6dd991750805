"""A plain .pt2 source (a torch.export archive whose module takes its inputs in order and returns
a tensor: what `torch.export.save` and MLflow 3's `log_model` write) on each backend that compiles
from the PyTorch module. Its module refuses eval() ("Calling eval() is not supported yet"): the
inductor, ExecuTorch, Core ML and XLA builds called it, and the whole run ended "kompile failed
unexpectedly" (fleet mode picks inductor for a .pt2)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.pipeline.conftest import small_cnn_doc


def _plain_pt2(path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()
    ).eval()
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 32, 32),)), str(path))
    return path


@pytest.mark.parametrize("backend", ["inductor", "executorch", "coreml", "xla"])
def test_a_plain_pt2_compiles_on_each_module_backend(
    backend: str, kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    model = _plain_pt2(tmp_path / "plain.pt2")
    doc = small_cnn_doc(
        source={"uri": model.name},
        inputs=[{"name": "x", "shape": [1, 3, 32, 32]}],
        targets=[{"name": "it", "backend": backend, "precision": "fp32"}],
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (target,) = json.loads(res.stdout)["targets"]
    # Core ML is exported here (no runtime off Apple hardware), the others validated.
    assert target["phase"] in ("Succeeded", "Exported"), target
    assert "eval()" not in (target.get("message") or ""), target
