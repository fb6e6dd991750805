"""Validation at every benchmark batch size, found by reading: the reference inputs sit at the
batch dim's opt, so an artifact was checked there only, then timed (and could be selected, at a
selection batch) at batch sizes it was never checked at. The trace is where this bites: export.py
lets tracer warnings from installed packages pass (transformers' mask helpers warn on shape
arithmetic the dynamic axes cover), so installed code that branches on a size is baked in at opt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.pipeline.conftest import installed_module, small_cnn_doc

# A library step that centres a batch and skips it for a single sample: traced at batch 1, the
# graph never centres, which is right at batch 1 and wrong at any other. Single: one row only.
BATCHY = """
import torch


class Centred(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        if x.shape[0] == 1:
            return y
        return y - y.mean(0, keepdim=True)


class Single(Centred):
    def forward(self, x):
        return self.fc(x).reshape(1, 4)


def model():
    return Centred().eval()


def single():
    return Single().eval()


def plain():
    return torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
"""


def _manifest(
    tmp_path: Path, batch_sizes: list[int], factory: str = "model", top: int = 8, **spec: Any
) -> Path:
    """The model as installed code: the trace's warnings from a site-packages file are let pass."""
    folder = installed_module(tmp_path, "batchy", BATCHY)
    doc = small_cnn_doc(
        source={"uri": f"python://batchy:{factory}"},
        inputs=[
            {
                "name": "x",
                "shape": [-1, 8],
                "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": top}],
            }
        ],
        benchmark={"batchSizes": batch_sizes, "warmup": 1, "iterations": 3},
        validation={"samples": 3},
        **spec,
    )
    path = folder / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_an_artifact_wrong_at_another_benchmark_batch_fails_validation(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = kompile_run(_manifest(tmp_path, [1, 4], top=4), "--no-register")  # timed at its max
    (t,) = res.status["targets"]
    assert t["phase"] == "Failed" and t["reason"] == "ValidationFailed", t
    assert "at batch 4" in t["message"], t["message"]
    assert not t["validation"]["passed"]
    assert not t.get("latency") and t.get("speedup") is None  # a failed artifact has no figures
    assert res.code != 0


def test_an_artifact_timed_at_the_opt_batch_alone_is_held_at_the_batch_max(
    kompile_run, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Found by reading: timed at batch 1 only, the artifact was held there only, and served to
    batches up to the signature's max (Triton's max_batch_size 8), where the trace is wrong."""
    res = kompile_run(_manifest(tmp_path, [1]), "--no-register")
    (t,) = res.status["targets"]
    assert t["phase"] == "Failed" and t["reason"] == "ValidationFailed", t
    assert t["message"].startswith("at batch 8: "), t["message"]
    assert res.code != 0


def test_a_batch_max_the_source_cannot_run_is_refused_before_any_compile(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = kompile_run(_manifest(tmp_path, [1], factory="single"), "--no-register")
    assert res.code == 2, res.stderr
    assert "spec.inputs declares batch up to 8, but the source model fails there: " in res.stderr
    assert "compiling" not in res.stderr, res.stderr


def test_an_artifact_right_at_every_batch_records_the_max_it_was_held_at(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = kompile_run(_manifest(tmp_path, [1], factory="plain"), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    assert t["validation"]["checkedAt"] == ["batch 8"], t["validation"]


def test_a_selection_made_at_another_batch_never_picks_a_wrong_candidate(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Candidates timed at batch 4 for a selection there: each is checked there first."""
    target = {
        "name": "cpu",
        "backend": "auto",
        "precision": "fp32",
        "candidates": [{"backend": "onnxruntime"}, {"backend": "openvino"}],
        "selection": {"policy": "minLatency", "batchSize": 4},
    }
    res = kompile_run(_manifest(tmp_path, [1], top=4, targets=[target]), "--no-register")
    (t,) = res.status["targets"]
    assert t["phase"] == "Failed", t
    assert t["candidates"], t
    for c in t["candidates"]:
        assert not c["selected"], c
        if c["phase"] == "Failed":
            assert "at batch 4" in (c["message"] or ""), c
