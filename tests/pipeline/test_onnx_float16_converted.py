"""An ONNX model made float16 with ONNX Runtime's own converter (onnxruntime.transformers.float16,
as onnxconverter-common does it) keeping float32 inputs and outputs (keep_io_types=True, the way
most people serve such a model): the converter appends the input Casts at the end of the node
list. ONNX Runtime and OpenVINO load that graph; onnx's checker refuses it ("Nodes in a graph must
be topologically sorted"), and so did kompile: `not a valid ONNX model`. Now the working copy's
nodes are put in order (onnx_ir's sort), said in a note, and validation still compares every
artifact with the file as given."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import onnx
import torch

from tests.pipeline.conftest import small_cnn_doc


def _float16_onnx(folder: Path, external: bool) -> Path:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    ).eval()  # fmt: skip
    plain = folder / "f32.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation note
        torch.onnx.export(
            model, (torch.rand(1, 3, 32, 32),), str(plain), input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False,
        )  # fmt: skip
    half = convert_float_to_float16(onnx.load(str(plain)), keep_io_types=True)
    assert [n.op_type for n in half.graph.node][-2:] == ["Cast", "Cast"]  # the input's Cast last
    path = folder / "f16.onnx"
    if external:
        onnx.save(half, str(path), save_as_external_data=True, location="f16.weights", size_threshold=0)
    else:
        onnx.save(half, str(path))
    return path


def test_a_float16_converted_onnx_with_float32_io_compiles_from_a_sorted_copy(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    for external in (False, True):
        folder = tmp_path / ("external" if external else "inline")
        folder.mkdir()
        source = _float16_onnx(folder, external)
        candidates = [{"backend": "onnxruntime"}, {"backend": "openvino"}]
        doc = small_cnn_doc(
            source={"uri": str(source)},
            targets=[{"name": "cpu", "precision": "fp32", "candidates": candidates}],
        )
        doc["spec"]["inputs"][0]["name"] = "x"
        res = kompile_run(write_manifest(doc, f"{folder.name}.yaml"))
        assert res.code == 0, res.stderr
        text = " ".join(res.stderr.split())
        assert "f16.onnx: nodes put in topological order" in text, text
        (target,) = res.status["targets"]
        phases = {c["name"]: (c["phase"], c.get("message")) for c in target["candidates"]}
        assert phases == {"onnxruntime-fp32": ("Succeeded", None), "openvino-fp32": ("Succeeded", None)}
        assert target["validation"]["passed"], target
