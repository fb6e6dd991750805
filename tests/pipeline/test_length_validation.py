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

# Pooled: a library step that flips long sequences' pooled features: traced at length 16, the graph
# flips at every length, which is right at 16 and wrong at 8. Capped: the same past 24, right at 8
# and 16; Short: the same below 6. Positioned: a learned position table of 24 rows (BERT's holds
# 512). Convolved: a convolution of 5 taps along the sequence, no shorter input. MaskedMean: pooling
# over the mask, as sentence-embedding models end: a row with no token left is 0/0.
LENGTHY = """
import torch


class Embedded(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8)
        self.fc = torch.nn.Linear(8, 4)


class Pooled(Embedded):
    def forward(self, ids):
        h = self.emb(ids).mean(1)
        if ids.shape[1] > 12:
            h = -h
        return self.fc(h)


class Capped(Embedded):
    def forward(self, ids):
        h = self.emb(ids).mean(1)
        if ids.shape[1] > 24:
            h = -h
        return self.fc(h)


class Convolved(Embedded):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 5)

    def forward(self, ids):
        return self.fc(self.conv(self.emb(ids).transpose(1, 2)).mean(2))


class Short(Embedded):
    def forward(self, ids):
        h = self.emb(ids).mean(1)
        if ids.shape[1] < 6:
            h = -h
        return self.fc(h)


class Positioned(Embedded):
    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.nn.Embedding(24, 8)

    def forward(self, ids):
        return self.fc((self.emb(ids) + self.pos(torch.arange(ids.shape[1]))).mean(1))


class MaskedMean(Embedded):
    def forward(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float()
        return self.fc((self.emb(input_ids) * m).sum(1) / m.sum(1))


def model():
    return Pooled().eval()


def masked_mean():
    return MaskedMean().eval()


def capped():
    return Capped().eval()


def positioned():
    return Positioned().eval()


def convolved():
    return Convolved().eval()


def short():
    return Short().eval()
"""


def _manifest(tmp_path: Path, seq: dict[str, int], factory: str = "model", **spec: Any) -> Path:
    """The model as installed code: the trace's warnings from a site-packages file are let pass."""
    folder = installed_module(tmp_path, "lengthy", LENGTHY)
    doc = small_cnn_doc(
        source={"uri": f"python://lengthy:{factory}"},
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


def test_an_artifact_wrong_at_the_declared_max_fails_validation(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Found by reading: the sizes held were opt and below, so installed code that branches past
    opt was right wherever it was checked and wrong at the longest inputs a server is sent."""
    res = kompile_run(_manifest(tmp_path, {"min": 4, "opt": 16, "max": 32}, "capped"), "--no-register")
    (t,) = res.status["targets"]
    assert t["phase"] == "Failed" and t["reason"] == "ValidationFailed", t
    assert "at seq 32" in t["message"] and "at seq 8" not in t["message"], t["message"]
    assert res.code != 0


def test_a_max_beyond_what_the_model_holds_is_refused_before_any_compile(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Found by reading: a position table of 24 rows declared up to 32 passed the gate (checked at
    16 and 8) and was rolled out to fail on every request longer than 24. The source fails there:
    the spec is refused with what to change, before a compile is spent on it."""
    res = kompile_run(_manifest(tmp_path, {"min": 4, "opt": 16, "max": 32}, "positioned"), "--no-register")
    assert res.code == 2, res.stderr
    assert "spec.inputs declares seq up to 32, but the source model fails there: " in res.stderr
    assert "index out of range" in res.stderr and "lower that max" in res.stderr, res.stderr
    assert "compiling" not in res.stderr
    fits = kompile_run(_manifest(tmp_path, {"min": 4, "opt": 16, "max": 24}, "positioned"), "--no-register")
    assert fits.code == 0, fits.stderr
    (t,) = fits.status["targets"]
    assert t["validation"]["checkedAt"] == ["seq 4", "seq 8", "seq 24", "batch 4"]


def test_an_artifact_wrong_at_the_declared_min_fails_and_a_min_the_model_cannot_run_is_refused(  # type: ignore[no-untyped-def]
    kompile_run, tmp_path: Path
) -> None:
    """Found by reading: the shortest size held was half the opt, so code that branches below it and
    a convolution wider than the declared min passed the gate, to fail on the shortest requests."""
    res = kompile_run(_manifest(tmp_path, {"min": 4, "opt": 16, "max": 32}, "short"), "--no-register")
    (t,) = res.status["targets"]
    assert t["phase"] == "Failed" and t["reason"] == "ValidationFailed", t
    assert t["message"].startswith("at seq 4: "), t["message"]
    res = kompile_run(_manifest(tmp_path, {"min": 2, "opt": 16, "max": 32}, "convolved"), "--no-register")
    assert res.code == 2, res.stderr
    assert "spec.inputs declares seq down to 2, but the source model fails there: " in res.stderr
    assert "raise that min" in res.stderr and "compiling" not in res.stderr, res.stderr


def test_a_range_that_never_leaves_the_traced_branch_passes(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every length from 14 to 32 takes the branch the trace took: the artifact is right there, and
    its status says where it was held besides the reference inputs."""
    benchmark = {"batchSizes": [1, 2], "warmup": 1, "iterations": 3}
    manifest = _manifest(tmp_path, {"min": 14, "opt": 16, "max": 32}, benchmark=benchmark)
    res = kompile_run(manifest, "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    assert t["phase"] == "Succeeded", t.get("message")
    assert t["validation"]["checkedAt"] == [
        "seq 14",
        "seq 32",
        "batch 4",
        "batch 2",
    ]  # half of 16 is below the min


def _masked_mean(tmp_path: Path, mask: Any) -> Path:
    """MaskedMean on a dataset of 4 rows of 16 with `mask`, declared [4, 32] along seq."""
    import numpy as np

    folder = installed_module(tmp_path, "lengthy", LENGTHY)
    ids = np.random.default_rng(0).integers(1, 50, size=(4, 16)) * mask
    np.savez(folder / "data.npz", input_ids=ids, attention_mask=mask)
    seq = {"axis": 1, "name": "seq", "min": 4, "opt": 16, "max": 32}
    batch = {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4}
    doc = small_cnn_doc(
        source={"uri": "python://lengthy:masked_mean"},
        inputs=[
            {"name": name, "dtype": "int64", "shape": [-1, -1], "dynamicDims": [batch, seq]}
            for name in ("input_ids", "attention_mask")
        ],
        validation={"dataset": "data.npz"},
    )
    path = folder / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_left_padded_dataset_is_cut_to_its_last_tokens(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Found by reading: the shorter size kept each row's first tokens, so a dataset a tokenizer
    padded on the left (padding_side="left", as decoder models pad) lost every token of its short
    rows; the source's pooled output was 0/0 there and every artifact failed 'NaN or Inf'."""
    import numpy as np

    mask = np.array([[0] * (16 - n) + [1] * n for n in (3, 5, 8, 16)], dtype=np.int64)
    res = kompile_run(_masked_mean(tmp_path, mask), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    assert t["phase"] == "Succeeded", t.get("message")
    assert t["validation"]["checkedAt"][:2] == ["seq 4", "seq 8"], t["validation"]
    assert not t["validation"].get("notCheckedAt")


def test_a_size_the_source_gives_nan_at_is_listed_as_not_checked(kompile_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each row's 3 tokens sit between padding, past its first 8 positions: the source's masked mean
    is 0/0 at seq 8 and at the min (4), so no artifact can be held there; it passes on what could be
    checked (the max, 32, repeats the tokens), and the status names the sizes left out and why."""
    import numpy as np

    mask = np.zeros((4, 16), np.int64)
    mask[:, 10:13] = 1
    res = kompile_run(_masked_mean(tmp_path, mask), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    assert t["phase"] == "Succeeded", t.get("message")
    assert t["validation"]["checkedAt"] == ["seq 32", "batch 4"]
    assert [why[:7] for why in t["validation"]["notCheckedAt"]] == ["seq 4: ", "seq 8: "]
    assert all("NaN or Inf" in why for why in t["validation"]["notCheckedAt"])
    assert "not checked at seq 8" in res.stderr
