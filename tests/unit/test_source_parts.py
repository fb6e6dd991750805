"""The operator's reading of an ONNX graph's external data file names from its protobuf bytes
(no onnx package in its image), held to what the onnx package itself finds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from kompile.compile_jobs.source_files import onnx_external_files
from kompile.operator.source_parts import external_data_names


def _model() -> onnx.ModelProto:
    """Two weights, a Constant node and an If whose branch holds a constant of its own."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "w2")
    const = helper.make_node(
        "Constant", [], ["c"], value=numpy_helper.from_array(np.ones((64,), np.float32), "c_value")
    )
    branch_const = helper.make_node(
        "Constant", [], ["b"], value=numpy_helper.from_array(np.full((8,), 2.0, np.float32), "b_value")
    )
    branch = helper.make_graph(
        [branch_const], "branch", [], [helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [8])]
    )
    nodes = [
        const,
        helper.make_node("Add", ["x", "c"], ["xc"]),
        helper.make_node("MatMul", ["xc", "w1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["y0"]),
        helper.make_node("If", ["flag"], ["bias"], then_branch=branch, else_branch=branch),
        helper.make_node("Add", ["y0", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64]),
            helper.make_tensor_value_info("flag", onnx.TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_names_match_the_onnx_package_for_one_file_and_per_tensor_files(tmp_path: Path) -> None:
    for one_file, expected in ((True, ["weights/model.data"]), (False, None)):
        folder = tmp_path / str(one_file)
        folder.mkdir()
        path = folder / "model.onnx"
        (folder / "weights").mkdir()
        model = _model()
        convert_model_to_external_data(  # node attributes (constants) too, subgraphs included
            model,
            all_tensors_to_one_file=one_file,
            location="weights/model.data" if one_file else None,
            size_threshold=0,
            convert_attribute=True,
        )
        onnx.save_model(model, str(path))
        graph = onnx.load(str(path), load_external_data=False)
        found = external_data_names(path.read_bytes())
        assert found == onnx_external_files(graph)
        if expected:
            assert found == expected
        else:  # one file per tensor, the Constant nodes' values among them
            assert {"w1", "w2", "c_value", "b_value"} <= set(found), found


def test_inline_weights_and_unsafe_names_give_nothing(tmp_path: Path) -> None:
    assert external_data_names(_model().SerializeToString()) == []
    model = _model()
    tensor = model.graph.initializer[0]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "../outside.bin"), ("offset", "0")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.ClearField("raw_data")
    assert external_data_names(model.SerializeToString()) == []
    # A long name (a two-byte length) is read whole.
    tensor.external_data[0].value = "w" * 200 + ".bin"
    assert external_data_names(model.SerializeToString()) == ["w" * 200 + ".bin"]
