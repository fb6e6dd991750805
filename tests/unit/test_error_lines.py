"""The one line kompile quotes of a library's error (kompile.compile_jobs.user_code.first_line),
on the messages those libraries write."""

from __future__ import annotations

import pytest

from kompile.compile_jobs.user_code import first_line

# OpenVINO 2026.4's CPU plugin, running a MaxPool whose kernel is larger than its input (seen on
# PaddleOCR's text-direction classifier from rapidocr-onnxruntime at 32x32): two lines of C++
# source locations first, the node and its check next, the reason last.
OPENVINO_INFER = (
    "Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
    "Exception from src/plugins/intel_cpu/src/node.cpp:794:\n"
    "[CPU] MaxPool node with name 'MaxPool@0' Check 'cmp::le(kernel, dim.get_length())' failed at "
    "src/core/shape_inference/include/pooling_shape_inference_util.hpp:149:\n"
    "While validating node 'opset1::MaxPool MaxPool@0 (opset4::HSwish HSwish_6368[0]:f32[?,200,1..,1..]) "
    "-> (f32[?,200,1..,1..])' with friendly_name 'MaxPool@0':\n"
    "Kernel after dilation has size (dim: 2) larger than the data shape after padding (dim: 1) "
    "at axis 0.\n\n\n"
)


def test_openvino_errors_name_the_node_and_the_reason_not_a_source_location() -> None:
    """Found by running PaddleOCR's classifier: the candidate's message was 'failed on the reference
    inputs cut to that size: Exception from src/inference/src/cpp/infer_request.cpp:224:', which
    names neither the construct nor what is wrong with it."""
    line = first_line(RuntimeError(OPENVINO_INFER))
    assert line == (
        "[CPU] MaxPool node with name 'MaxPool@0': Kernel after dilation has size (dim: 2) larger "
        "than the data shape after padding (dim: 1) at axis 0."
    ), line


def test_an_openvino_error_without_a_check_keeps_its_first_line_of_text() -> None:
    text = "Exception from src/inference/src/cpp/core.cpp:112:\nModel file model.xml cannot be opened!\n"
    assert first_line(RuntimeError(text)) == "Model file model.xml cannot be opened!"


def test_one_line_errors_and_informative_first_lines_are_kept() -> None:
    ort = (
        "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Conv node. "
        "Name:'/stft/Conv' Status Message: Invalid input shape: {192}"
    )
    assert first_line(RuntimeError(ort)) == ort
    torch_text = "mat1 and mat2 shapes cannot be multiplied (2x8 and 16x4)\n\nWhile executing %linear"
    assert first_line(RuntimeError(torch_text)) == "mat1 and mat2 shapes cannot be multiplied (2x8 and 16x4)"


def test_an_empty_error_is_named_by_its_type() -> None:
    assert first_line(KeyError()) == "KeyError"
    assert first_line(RuntimeError("\n\n")) == "RuntimeError"


def test_a_bare_assert_in_a_library_says_where_it_sits() -> None:
    """Found by running Silero VAD (silero-vad's ONNX file, If nodes): ONNX Runtime's quantizer
    pre-processing raised a bare AssertionError and the candidate said 'static int8 quantization of
    model.onnx failed: ; try quantization: dynamic'."""

    def is_sequence(kind: str) -> bool:
        if kind not in ("tensor_type", "sequence_type"):
            raise AssertionError  # what a bare assert raises outside pytest's rewriting
        return kind == "sequence_type"

    try:
        is_sequence("optional_type")
    except AssertionError as err:
        line = first_line(err)
    assert line.startswith("AssertionError in test_error_lines.py:") and line.endswith("(is_sequence)"), line


# OpenVINO 2026.4's ONNX frontend on Silero VAD (silero-vad 6.2.3's silero_vad.onnx), whose If
# branches hold a Conv of unknown rank.
OPENVINO_CONVERSION = """Exception from src/inference/src/cpp/core.cpp:84:
Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:
FrontEnd API failed with OpConversionFailure:
Model wasn't fully converted. Failed operations detailed log:
-- Conv-16 with a message:
While validating ONNX node '<Node(Conv): If_0_then_branch__Inline_0__/decoder/decoder/2/Conv_output_0>': \
Check 'data.get_partial_shape().rank().is_static()' failed at src/frontends/onnx/frontend/src/op/conv.cpp:38:
FrontEnd API failed with GeneralFailure:
The input data tensor's rank has to be known (static)

-- ReduceMean-16 with a message:
Check '(supported_types.find(ov_input.get_element_type()) != supported_types.end())' failed at \
src/frontends/onnx/frontend/src/op/reduce.cpp:134:
While validating ONNX node '<Node(ReduceMean): If_0_then_branch__Inline_0__/ReduceMean_output_0>':
Unsupported input type dynamic

Summary:
-- Conversion is failed for: Conv-16, ReduceMean-16

"""


def test_openvino_conversion_failures_name_each_op_its_node_and_the_reason() -> None:
    """Found by running Silero VAD: the candidate said 'OpenVINO cannot read the ONNX graph: Conv-16
    with a message:; ReduceMean-16 with a message:; Conversion is failed for: Conv-16,
    ReduceMean-16', every reason left out."""
    pytest.importorskip("openvino")
    from kompile.compile_jobs.backends.openvino import conversion_error

    assert conversion_error(RuntimeError(OPENVINO_CONVERSION)) == (
        "Conv-16 at node If_0_then_branch__Inline_0__/decoder/decoder/2/Conv_output_0: The input data "
        "tensor's rank has to be known (static); ReduceMean-16 at node "
        "If_0_then_branch__Inline_0__/ReduceMean_output_0: Unsupported input type dynamic"
    )
    summary_only = (
        "Model wasn't fully converted.\n-- No conversion rule found for operations: ai.onnx.ml.Imputer-1\n"
    )
    assert conversion_error(RuntimeError(summary_only)) == (
        "No conversion rule found for operations: ai.onnx.ml.Imputer-1"
    )


def test_onnx_runtime_checks_keep_their_reason_without_the_cpp_location() -> None:
    """PaddleOCR's DB detector at 112x112 (its strides need multiples of 32): ONNX Runtime's status
    message quotes the failed C++ check, file, line and signature, before its reason."""
    text = (
        "Non-zero status code returned while running Add node. Name:'p2o.Add.248' Status Message: "
        "/onnxruntime_src/onnxruntime/core/providers/cpu/math/element_wise_ops.h:563 void "
        "onnxruntime::BroadcastIterator::Init(ptrdiff_t, ptrdiff_t) axis == 1 || axis == largest was "
        "false. Attempting to broadcast an axis by a dimension other than 1. 7 by 8"
    )
    assert first_line(RuntimeError(text)) == (
        "Non-zero status code returned while running Add node. Name:'p2o.Add.248' Status Message: "
        "Attempting to broadcast an axis by a dimension other than 1. 7 by 8"
    )
