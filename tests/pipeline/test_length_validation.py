"""Validation at another size of each dynamic dim besides the batch, found by reading: the reference
inputs sit at every dim's opt, so an artifact that declares a sequence range [min, max] was checked
at opt only. export.py lets tracer warnings from installed packages pass, so installed code that
branches on a sequence length is baked in at opt: right there, wrong at every other length a
server would send it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.pipeline.conftest import installed_module, small_cnn_doc

# A library step that flips long sequences' pooled features: traced at length 16, the graph flips
# at every length, which is right at 16 and wrong at 8.
LENGTHY = """
import torch


class Pooled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, ids):
        h = self.emb(ids).mean(1)
        if ids.shape[1] > 12:
            h = -h
        return self.fc(h)


def model():
    return Pooled().eval()
"""


def _manifest(tmp_path: Path, seq: dict[str, int], **spec: Any) -> Path:
    """The model as installed code: the trace's warnings from a site-packages file are let pass."""
    folder = installed_module(tmp_path, "lengthy", LENGTHY)
    doc = small_cnn_doc(
        source={"uri": "python://lengthy:model"},
        inputs=[
            {
                "name": "ids",
                "dtype": "int64",
                "shape": [-1, -1],
                "high": 50,
                "dynamicDims": [
                    {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4},
                    {"axis": 1, "name": "seq", **seq},
                ],
            }
        ],
        validation={"samples": 3},
        **spec,
    )
    path = folder / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_an_artifact_wrong_at_another_sequence_length_fails_validation(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = kompile_run(_manifest(tmp_path, {"min": 4, "opt": 16, "max": 32}), "--no-register")
    (t,) = res.status["targets"]
    assert t["phase"] == "Failed" and t["reason"] == "ValidationFailed", t
    assert "at seq 8" in t["message"], t["message"]
    assert not t["validation"]["passed"]
    assert not t.get("latency") and t.get("speedup") is None  # a failed artifact has no figures
    assert res.code != 0


def test_a_range_that_never_leaves_the_traced_branch_passes(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every length from 14 to 32 takes the branch the trace took: the artifact is right there, and
    its status says where it was held besides the reference inputs."""
    benchmark = {"batchSizes": [1, 2], "warmup": 1, "iterations": 3}
    manifest = _manifest(tmp_path, {"min": 14, "opt": 16, "max": 32}, benchmark=benchmark)
    res = kompile_run(manifest, "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    assert t["phase"] == "Succeeded", t.get("message")
    assert t["validation"]["checkedAt"] == ["seq 14", "batch 2"]  # half of 16 is below the min
