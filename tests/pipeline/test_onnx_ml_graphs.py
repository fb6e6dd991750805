"""Classical models converted to ONNX (skl2onnx, onnxmltools) use the ai.onnx.ml operators and, for a
classifier, end in a ZipMap: its probabilities as a sequence of maps, no tensor. Before, the ZipMap
crashed the reference run ("float() argument must be ... not 'dict'") and OpenVINO's unconverted
LinearClassifier crashed the whole run ("kompile failed unexpectedly: OpConversionFailure"). The
graphs are written here with onnx.helper, as skl2onnx writes a LogisticRegression."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper


def _classifier(path: Path, zipmap: bool, names: bool = False) -> Path:
    weights = np.random.default_rng(0).normal(size=12).tolist()
    labels = {"classlabels_strings": ["cat", "dog", "eel"]} if names else {"classlabels_ints": [0, 1, 2]}
    linear = helper.make_node(
        "LinearClassifier", ["X"], ["label", "probs"], domain="ai.onnx.ml", coefficients=weights,
        intercepts=[0.1, 0.2, 0.3], post_transform="SOFTMAX", multi_class=1, **labels,
    )  # fmt: skip
    nodes, out = [linear], helper.make_tensor_value_info("probs", TensorProto.FLOAT, [None, 3])
    if zipmap:
        nodes.append(
            helper.make_node(
                "ZipMap", ["probs"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]
            )
        )
        scalar = helper.make_tensor_type_proto(TensorProto.FLOAT, [])
        out = helper.make_value_info(
            "probabilities",
            helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64, scalar)),
        )
    graph = helper.make_graph(
        nodes,
        "logreg",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
        [
            helper.make_tensor_value_info(
                "label", TensorProto.STRING if names else TensorProto.INT64, [None]
            ),
            out,
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _manifest(write_manifest: Any, source: Path) -> Path:
    from tests.pipeline.conftest import small_cnn_doc

    targets = [{"name": "cpu", "precision": "fp32"}]
    doc = small_cnn_doc(source={"uri": source.name}, targets=targets)
    doc["spec"]["inputs"] = [{"name": "X", "shape": [2, 4]}]
    return write_manifest(doc)  # type: ignore[no-any-return]


def test_a_zipmap_output_is_refused_with_the_converter_option_that_removes_it(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    res = kompile_run(_manifest(write_manifest, _classifier(tmp_path / "logreg.onnx", zipmap=True)))
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "output 'probabilities' is a sequence of maps, not a tensor" in text, text
    assert "ZipMap" in text and "'zipmap': False" in text and "unexpectedly" not in text, text


def test_string_labels_are_refused_saying_to_train_on_integers(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    # Before: "kompile failed unexpectedly: ValueError: could not convert string to float: 'dog'".
    source = _classifier(tmp_path / "logreg.onnx", zipmap=False, names=True)
    res = kompile_run(_manifest(write_manifest, source))
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "output 'label' is a tensor of strings" in text and "integer labels" in text, text


def test_a_classifier_without_zipmap_compiles_where_its_operators_exist(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    res = kompile_run(_manifest(write_manifest, _classifier(tmp_path / "logreg.onnx", zipmap=False)))
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    by_name = {c["name"]: c for c in target["candidates"]}
    assert target["phase"] == "Succeeded" and by_name["onnxruntime-fp32"]["phase"] == "Succeeded", target
    openvino = by_name["openvino-fp32"]
    assert openvino["reason"] == "CompileFailed", openvino
    assert "ai.onnx.ml.LinearClassifier" in openvino["message"] and "Check 'false'" not in openvino["message"]
