"""ONNX files ONNX Runtime cannot load as they are. The `onnx` package kompile pins writes IR
version 14 (`onnx.helper.make_model`, `onnx.compose`, graph surgery tools), one past what its
ONNX Runtime reads: such a model failed as "a bug in kompile" in the reference session, though its
graph uses nothing IR 14 added. And a graph ONNX Runtime has no kernel for (a custom operator
domain) is the user's input to fix, not kompile's bug."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from kompile.compile_jobs import onnx_upgrade
from tests.pipeline.conftest import small_cnn_doc, torchscript_onnx

FEED = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def _manifest(source: Path, targets: list[dict[str, str]]) -> dict[str, Any]:
    doc = small_cnn_doc(source={"uri": source.name}, targets=targets)
    doc["spec"]["inputs"] = [{"name": "input", "shape": [1, 3, 32, 32]}]
    return doc


def _validated_on_ort_and_openvino(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], path: Path
) -> str:
    """Run the ONNX file with an ONNX Runtime and an OpenVINO target; both must validate. Its stderr."""
    targets = [
        {"name": "ort", "backend": "onnxruntime", "precision": "fp32"},
        {"name": "ov", "backend": "openvino", "precision": "fp32"},
    ]
    res = kompile_run(write_manifest(_manifest(path, targets)))
    assert res.code == 0, res.stderr
    phases = {t["name"]: t["phase"] for t in json.loads(res.stdout)["targets"]}
    assert phases == {"ort": "Succeeded", "ov": "Succeeded"}, res.stderr
    return str(res.stderr)


def test_a_model_saved_with_a_newer_ir_version_compiles_and_validates(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    from models.small import small_cnn  # type: ignore[import-not-found]

    newest = onnx_upgrade.ort_max_ir_version()
    assert 7 <= newest <= onnx.IR_VERSION
    path = torchscript_onnx(small_cnn().eval(), FEED, tmp_path / "newer.onnx", {}, "prob")
    model = onnx.load(str(path))
    model.ir_version = newest + 1
    # Its weights in a file beside it: the copies ONNX Runtime reads must find them too.
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="newer.onnx.data", size_threshold=0
    )
    before = path.read_bytes()
    stderr = _validated_on_ort_and_openvino(kompile_run, write_manifest, path)
    assert f"IR version {newest + 1}" in stderr and "bug in kompile" not in stderr
    assert path.read_bytes() == before  # the user's file is never rewritten


def test_a_model_at_the_onnx_packages_default_opset_compiles_and_validates(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    """`helper.make_model` without opset_imports stamps the onnx package's newest opset (28 with
    the pinned onnx), one ONNX Runtime calls "under development" and refuses (it takes 26)."""
    import numpy as np
    from onnx import defs, numpy_helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])
    y = helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])
    weights = np.random.default_rng(0).standard_normal((3 * 32 * 32, 10)).astype(np.float32)
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        helper.make_node("Relu", ["logits"], ["prob"]),
    ]
    graph = helper.make_graph(nodes, "dense", [x], [y], [numpy_helper.from_array(weights, "w")])
    path = tmp_path / "dense.onnx"
    onnx.save(helper.make_model(graph), str(path))
    newest = defs.onnx_opset_version()
    assert newest > onnx_upgrade.ort_max_opset()  # what makes this test mean anything
    stderr = _validated_on_ort_and_openvino(kompile_run, write_manifest, path)
    assert f"opset {newest}" in stderr, stderr


def test_a_graph_onnx_runtime_cannot_load_is_the_users_to_fix(
    kompile_run: Callable[..., Any], write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])
    y = helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 3, 32, 32])
    node = helper.make_node("FancyGelu", ["input"], ["prob"], domain="com.example")
    graph = helper.make_graph([node], "custom", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    path = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))
    res = kompile_run(write_manifest(_manifest(path, [{"name": "ort", "backend": "onnxruntime"}])))
    assert res.code == 2, res.stderr
    said = " ".join(res.stderr.split())
    assert "custom.onnx" in said and "com.example:FancyGelu" in said, said
    assert "ONNX Runtime" in said and "bug in kompile" not in said, said
