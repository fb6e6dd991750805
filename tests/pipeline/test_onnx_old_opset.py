"""An ONNX model from an older exporter (opset 9, IR 3, every weight also listed as a graph input: the
shape of many model-zoo files) compiles like a current one: the working copy is upgraded to the opset
the backends are built for, its weights are constants, and validation still holds every artifact to
the file as the user gave it."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from kompile.compile_jobs import onnx_upgrade
from kompile.compile_jobs.run_results import RunResults

FEED = {"data": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def old_style_onnx(path: Path) -> Path:
    """The small CNN as an opset-9 exporter wrote it: IR version 3, initializers in graph.input."""
    import torch
    from models.small import small_cnn  # type: ignore[import-not-found]

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation note
        torch.onnx.export(
            small_cnn().eval(),
            (torch.from_numpy(FEED["data"]),),
            str(path),
            input_names=["data"],
            output_names=["prob"],
            dynamic_axes={"data": {0: "N"}, "prob": {0: "N"}},
            opset_version=9,
            keep_initializers_as_inputs=True,
            dynamo=False,
        )
    model = onnx.load(str(path))
    model.ir_version = 3
    onnx.save(model, str(path))
    return path


def _manifest(source: Path) -> dict[str, Any]:
    int8 = {"backend": "onnxruntime", "precision": "int8"}
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "old"},
        "spec": {
            "source": {"uri": source.name},
            "inputs": [
                {
                    "name": "data",
                    "shape": [-1, 3, 32, 32],
                    "dynamicDims": [{"axis": 0, "name": "N", "min": 1, "opt": 1, "max": 4}],
                }
            ],
            "targets": [
                # The quantizer writes per-channel DequantizeLinear (an opset-13 attribute): at opset 9
                # its graph did not load.
                {"name": "int8-static", "quantization": "static", **int8},
                {"name": "int8-dynamic", "quantization": "dynamic", **int8},
                {"name": "fp32", "backend": "openvino", "precision": "fp32"},
            ],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
            "validation": {"samples": 2},
        },
    }


def test_an_opset_9_model_with_weights_as_inputs_compiles_and_validates(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    source = old_style_onnx(tmp_path / "old.onnx")
    before = source.read_bytes()
    res = kompile_run(write_manifest(_manifest(source)))
    assert res.code == 0, res.stderr
    status = json.loads(res.stdout)
    phases = {t["name"]: (t["phase"], t.get("message")) for t in status["targets"]}
    assert all(p == "Succeeded" for p, _ in phases.values()), phases
    assert "upgraded from opset 9 to 17" in res.stderr
    assert "appears in graph inputs" not in res.stderr  # ONNX Runtime's warning, once per weight
    assert "pre-processing" not in res.stderr  # its dynamic quantizer's advice, on every model
    assert source.read_bytes() == before  # the user's file is never rewritten
    # The working copy the backends compiled, as an artifact built from it holds it.
    dynamic = next(t for t in status["targets"] if t["name"] == "int8-dynamic")
    work = onnx.load(
        str(Path(dynamic["artifact"]["uri"].removeprefix("file://")) / "old" / "1" / "model.onnx")
    )
    assert [i.name for i in work.graph.input] == ["data"]
    assert {o.version for o in work.opset_import if o.domain in ("", "ai.onnx")} == {17}
    # The reference is the file as given: the outputs saved for the run are its outputs.
    saved = RunResults.load(tmp_path / ".kompile" / "reference.npz")
    given = ort.InferenceSession(str(source)).run(None, saved.inputs[0])[0]
    ref = saved.outputs[0][0]
    np.testing.assert_allclose(ref, given, rtol=1e-5, atol=1e-6)


def test_an_upgrade_the_converter_cannot_make_keeps_the_graph_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = onnx.load(str(old_style_onnx(tmp_path / "old.onnx")))

    def refuse(model: Any, version: int) -> Any:  # stands in for a converter without an adapter
        raise RuntimeError("No Adapter For Upsample")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refuse)
    upgraded, notes = onnx_upgrade.upgrade(model)
    assert {o.version for o in upgraded.opset_import if o.domain in ("", "ai.onnx")} == {9}
    assert [i.name for i in upgraded.graph.input] == ["data"]  # the weights still become constants
    assert any("opset 9" in n and "No Adapter For Upsample" in n for n in notes), notes


def test_a_current_model_is_left_as_it_is(tmp_path: Path) -> None:
    from models.small import small_cnn  # type: ignore[import-not-found]

    from tests.pipeline.conftest import torchscript_onnx

    path = torchscript_onnx(small_cnn().eval(), FEED, tmp_path / "m.onnx", {"data": {0: "N"}}, "prob")
    model = onnx.load(str(path))
    upgraded, notes = onnx_upgrade.upgrade(model)
    assert notes == [] and upgraded is model
