"""A model saved in half precision (`model.half()`, common for checkpoints trained with mixed
precision): its inputs must be declared float16, and a float32 build of it must not convert the
caller's model in place, which broke the eager benchmark that runs afterwards with the model's
own dtype (found by trying it: `kompile failed unexpectedly: mat1 and mat2 must have the same
dtype`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import small_cnn_doc

FACTORY = """
import torch


def half_linear():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).half().eval()
"""


def _doc(tmp_path: Path, dtype: str, targets: list[dict[str, Any]]) -> dict[str, Any]:
    (tmp_path / "halfnets.py").write_text(FACTORY)
    return small_cnn_doc(
        source={"uri": "python://halfnets:half_linear"},
        inputs=[{"name": "x", "shape": [2, 16], "dtype": dtype}],
        targets=targets,
    )


def test_float32_inputs_to_a_half_model_say_which_dtype_to_declare(
    tmp_path: Path, kompile_run, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    doc = _doc(tmp_path, "float32", [{"name": "cpu", "backend": "onnxruntime", "precision": "fp32"}])
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 2  # the input is wrong
    assert "weights are float16" in res.stderr and "dtype: float16" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_float32_inductor_build_leaves_the_half_model_as_it_was(
    tmp_path: Path, kompile_run, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch._inductor")
    targets = [
        {"name": "ort", "backend": "onnxruntime", "precision": "fp32"},
        {"name": "aoti", "backend": "inductor", "precision": "fp32"},
    ]
    res = kompile_run(write_manifest(_doc(tmp_path, "float16", targets)), "--no-register")
    assert res.code == 0, res.stderr
    phases = {t["name"]: t["phase"] for t in res.status["targets"]}
    assert phases == {"ort": "Succeeded", "aoti": "Succeeded"}, res.status["targets"]
    # The eager model is timed after the builds, in its own dtype.
    assert all(t["eagerLatency"][0]["p50Ms"] > 0 for t in res.status["targets"])
