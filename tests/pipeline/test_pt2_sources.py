"""PyTorch files on the backends that compile from the module. A plain .pt2 source (a torch.export
archive whose module takes its inputs in order and returns a tensor: what `torch.export.save` and
MLflow 3's `log_model` write): its module refuses eval() ("Calling eval() is not supported yet"),
which the inductor, ExecuTorch, Core ML and XLA builds called, and the whole run ended "kompile
failed unexpectedly" (fleet mode picks inductor for a .pt2). A TorchScript file, which
torch.export cannot take."""

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


def test_a_torchscript_source_is_no_source_for_torch_export_backends(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    """torch.export cannot take a ScriptModule: inductor, ExecuTorch and XLA each failed to compile
    with "Graph breaks are not allowed ...: the whole forward() must trace as one graph", advice
    that does not fit. Skipped before the compile instead, with what to give them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten()).eval()
    torch.jit.trace(model, torch.zeros(1, 3, 32, 32)).save(str(tmp_path / "scripted.pt"))
    doc = small_cnn_doc(
        source={"uri": "scripted.pt"},
        inputs=[{"name": "x", "shape": [1, 3, 32, 32]}],
        targets=[
            {"name": "aoti", "backend": "inductor"},
            {"name": "pte", "backend": "executorch"},
            {"name": "ort", "backend": "onnxruntime"},
        ],
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    targets = {t["name"]: t for t in json.loads(res.stdout)["targets"]}
    assert targets["ort"]["phase"] == "Succeeded", targets["ort"]
    for name in ("aoti", "pte"):
        t = targets[name]
        assert (t["phase"], t["reason"]) == ("Skipped", "UnsupportedSource"), t
        assert "TorchScript" in t["message"] and "torch.export.save" in t["message"], t["message"]
        assert "onnxruntime" in t["message"] and "Graph breaks" not in t["message"], t["message"]


class _Scored(torch.nn.Module):
    """Token-style inputs passed by keyword, and a float option beside them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(100, 8)  # ids kompile generates: [0, 100)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, scale: float = 1.0) -> Any:
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1).float()
        return hidden.mean(dim=1) * scale


class _Listed(torch.nn.Module):
    """Its tensors in one list argument, as multi-view and multi-scale models take them."""

    def __init__(self) -> None:
        super().__init__()
        self.wide, self.narrow = torch.nn.Linear(8, 4), torch.nn.Linear(6, 4)

    def forward(self, views: list[torch.Tensor]) -> torch.Tensor:
        return self.wide(views[0]) + self.narrow(views[1])


@pytest.mark.parametrize("call", ["keywords", "constant", "list"])
def test_a_pt2_exported_with_keywords_or_a_constant_runs(call: str, tmp_path: Path) -> None:
    """A program exported with its inputs as keywords (torch.export.export(model, (), {"input_ids":
    ...}), as Hugging Face models are), or with a float beside its tensors, must be called that
    way: "Ran into a kwarg keyword mismatch: Got the following keywords [] but expected
    ['input_ids', 'attention_mask']", and the whole run failed. So must one exported with a list
    of tensors (forward(views) on [a, b]): "Trying to flatten user inputs with exported input
    tree spec", the same end."""
    from typer.testing import CliRunner

    from kompile.cli import app

    ids, mask = torch.randint(0, 100, (1, 6)), torch.ones(1, 6, dtype=torch.int64)
    if call == "keywords":
        program = torch.export.export(_Scored().eval(), (), {"input_ids": ids, "attention_mask": mask})
    elif call == "constant":
        program = torch.export.export(_Scored().eval(), (ids, mask, 2.0))
    else:
        program = torch.export.export(_Listed().eval(), ([torch.randn(1, 8), torch.randn(1, 6)],))
    torch.export.save(program, str(tmp_path / "scored.pt2"))
    res = CliRunner().invoke(
        app,
        ["run", str(tmp_path / "scored.pt2"), "--json", "--no-register", "--work-dir", str(tmp_path / "w")],
    )
    assert res.exit_code == 0, res.stderr
    (target,) = json.loads(res.stdout)["targets"]
    phases = {c["name"]: c["phase"] for c in target["candidates"]}
    assert phases.get("onnxruntime-fp32") == "Succeeded" and phases.get("inductor-fp32") == "Succeeded", (
        target["candidates"]
    )


class _Extras(torch.nn.Module):
    """Outputs beside its tensor that are no tensors: a size (a SymInt in the program) and a None."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return {"count": x.shape[0], "logits": self.head(x), "aux": None}


def test_a_pt2_with_outputs_that_are_no_tensors_serves_its_tensors(kompile_run: Any, tmp_path: Path) -> None:
    """A program returning a size and a None beside its logits (a dict of whatever the model had):
    the ONNX export wrote the size as a second output, the eager reference held one, and the run
    ended "kompile failed unexpectedly: ValueError: zip() argument 2 is shorter than argument 1".
    Its tensors are what is served, under the model's own names."""
    batch = torch.export.Dim("batch", max=16)
    program = torch.export.export(_Extras().eval(), (torch.randn(2, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "extras.pt2"))
    res = kompile_run(tmp_path / "extras.pt2", "--no-register", "--backend", "onnxruntime")
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    assert target["phase"] == "Succeeded", target
    assert [o["name"] for o in target["validation"]["outputs"]] == ["logits"], target["validation"]
    assert "is ignored in the exported graph" not in res.stderr, res.stderr  # the exporter's, handled


CUSTOM_OP_PT2 = """
import sys
import torch

@torch.library.custom_op("kompile_unregistered::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@doubled.register_fake
def _(x):
    return torch.empty_like(x)

class Net(torch.nn.Module):
    def forward(self, x):
        return doubled(x) + 1

torch.export.save(torch.export.export(Net(), (torch.rand(2, 3),)), sys.argv[1])
"""


def test_a_pt2_calling_a_custom_op_nothing_registers_names_it(
    kompile_run: Any, write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    """A .pt2 that calls a torch.library op is loaded without the code that registers the op. Before:
    "cannot be loaded ...: We ran into an error when deserializing the saved file. Please check the
    warnings above for possible errors." and no warnings above (kompile quiets torch's loading)."""
    import subprocess
    import sys

    path = tmp_path / "custom.pt2"
    subprocess.run([sys.executable, "-c", CUSTOM_OP_PT2, str(path)], check=True, capture_output=True)
    # As a file (its inputs read from it) and from a manifest (loaded as the source).
    declared = small_cnn_doc(source={"uri": path.name}, inputs=[{"name": "x", "shape": [2, 3]}])
    for given in (path, write_manifest(declared)):
        res = kompile_run(given, "--no-register")
        assert res.code == 2, res.stderr
        text = " ".join(res.stderr.split())
        assert "calls the operator kompile_unregistered::doubled, which nothing here registers" in text, text
        assert "python://" in text and "warnings above" not in text, text
