"""The OpenVINO backend for real on small models: ONNX export -> IR (fp32 weights), NNCF int8
calibrated on the reference inputs, bf16 where the CPU has it; the IR loaded back and compared
with eager; the Triton OpenVINO layout and its config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")
torch = pytest.importorskip("torch")

from kompile.api.spec import Precision, Target  # noqa: E402
from kompile.compile_jobs import run_results  # noqa: E402
from kompile.compile_jobs.backends.base import BackendError, Feeds, get_backend  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.hardware import has_fast_bf16  # noqa: E402
from kompile.compile_jobs.validate import resolve_thresholds  # noqa: E402
from tests.pipeline.conftest import IMAGE, bert_tiny_case, small_cnn_doc, torchscript_onnx  # noqa: E402

# tests.pipeline.conftest puts examples/ on sys.path: `models.*` imports as in manifests.


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Feeds]]:
    from models.small import small_cnn

    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)} for _ in range(8)]
    path = tmp_path_factory.mktemp("cnn") / "small_cnn.onnx"
    return torchscript_onnx(
        small_cnn(), feeds[0], path, {"input": {0: "batch"}, "logits": {0: "batch"}}, "logits"
    ), feeds


def _build(
    cnn: tuple[Path, list[Feeds]], out: Path, precision: Precision, quantization: Any = None, **options: str
) -> tuple[Any, Any]:
    path, feeds = cnn
    target = Target(
        name=f"cpu-{precision}",
        backend="openvino",
        precision=precision,
        quantization=quantization,
        options=options or None,
    )
    request = compile_request(target, onnx_path=path, out_dir=out, signature=[IMAGE], feeds=feeds, threads=2)
    backend = get_backend("openvino")
    artifact = backend.compile(request)
    runner = backend.load(artifact, threads=2)
    outputs = request.reference.with_outputs(f"openvino-{precision}", [runner.run(f) for f in feeds])
    verdict = run_results.compare(request.reference, outputs, resolve_thresholds(precision))
    return artifact, verdict


def test_fp32_ir_keeps_fp32_weights_and_matches_the_source(
    cnn: tuple[Path, list[Feeds]], tmp_path: Path
) -> None:
    artifact, verdict = _build(cnn, tmp_path, "fp32")
    assert verdict.passed, verdict.failures
    assert [name for _, name in artifact.files()] == ["model.xml", "model.bin"]
    assert all(path.is_file() for path, _ in artifact.files())
    # fp32 weights: the .bin holds 4 bytes per parameter of the small CNN (not fp16's 2)
    from models.small import small_cnn

    params = sum(p.numel() for p in small_cnn().parameters())
    assert artifact.files()[1][0].stat().st_size >= 4 * params * 0.9
    assert (
        artifact.options["runtime.INFERENCE_PRECISION_HINT"] == "f32"
    )  # explicit: bf16 CPUs default to bf16
    assert artifact.serving_parameters["PERFORMANCE_HINT"] == "LATENCY"
    assert artifact.toolchain["openvino"] and artifact.toolchain["nncf"]


def test_int8_is_calibrated_by_nncf_and_validates(cnn: tuple[Path, list[Feeds]], tmp_path: Path) -> None:
    artifact, verdict = _build(cnn, tmp_path, "int8")
    assert verdict.passed, verdict.failures
    opts = artifact.options
    assert opts["quantization"] == "nncf-ptq" and int(opts["fakeQuantizeNodes"]) > 0
    assert (
        opts["modelType"] == "none" and opts["preset"] == "performance" and opts["calibrationSamples"] == "6"
    )


def test_int8_that_quantizes_nothing_is_refused(cnn: tuple[Path, list[Feeds]], tmp_path: Path) -> None:
    """NNCF returns a model it finds nothing to quantize in as it was (said at INFO only): the fp32
    model, which validated and was labelled int8."""
    import onnx
    from onnx import TensorProto, helper

    spec = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 3, 32, 32]) for n in ("input", "logits")
    ]
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["logits"])], "relu", spec[:1], spec[1:])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    with pytest.raises(BackendError) as err:
        _build((path, cnn[1]), tmp_path / "out", "int8")
    assert "quantized no operator (no FakeQuantize in the model)" in str(err.value)
    assert "Build this target at fp32 or bf16" in str(err.value)


def test_keep_sensitive_on_a_graph_with_no_matmul_says_it_would_build_plain_int8(
    cnn: tuple[Path, list[Feeds]], tmp_path: Path
) -> None:
    """The rule keeps MatMuls; a convolutions-only graph has none, and keepFloat sensitive there
    would quantize exactly as plain int8 did."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((3, 3, 3, 3), 0.1, np.float32), "w")
    conv = helper.make_node("Conv", ["input", "w"], ["logits"], pads=[1, 1, 1, 1])
    spec = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 3, 32, 32]) for n in ("input", "logits")
    ]
    graph = helper.make_graph([conv], "conv", spec[:1], spec[1:], [weight])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    plain, _ = _build((path, cnn[1]), tmp_path / "plain", "int8")
    assert plain.options["sensitiveMatMuls"] == "0"
    assert plain.options["matmulWeightShare"] == "0.00"  # all in the convolution: the ladder's order
    with pytest.raises(BackendError) as err:
        _build((path, cnn[1]), tmp_path / "kept", "int8", keepFloat="sensitive")
    assert "no MatMul to keep in float" in str(err.value) and "quantization dynamic" in str(err.value)


def test_int8_remedies_build_and_validate(cnn: tuple[Path, list[Feeds]], tmp_path: Path) -> None:
    """Each remedy the backend offers after a failed int8 builds: accuracy control (NNCF measures
    the gate's own verdict), and int8 weights with float compute (no FakeQuantize at all)."""
    plain, _ = _build(cnn, tmp_path / "plain", "int8")
    offered = {r.name: r for r in get_backend("openvino").remedies(plain)}
    # The small CNN's weights are nearly all convolutions': where its float layers ran at f32 (a CPU
    # without fast bf16) weights-only would run at fp32's speed, and accuracy control comes first.
    assert float(plain.options["matmulWeightShare"]) < 0.5
    weights_only = ["weights-only", "weights-only-fine"]
    if plain.options["runtime.INFERENCE_PRECISION_HINT"] == "f32":
        assert list(offered) == ["keep-sensitive", "accuracy-control", *weights_only]
    else:
        assert list(offered) == ["keep-sensitive", *weights_only, "accuracy-control"]
    coarse, fine = offered["weights-only"], offered["weights-only-fine"]
    at_f32, _ = _build(cnn, tmp_path / "plain-f32", "int8", floatPrecision="fp32")  # on any CPU
    names = [r.name for r in get_backend("openvino").remedies(at_f32)]
    assert names == ["keep-sensitive", "accuracy-control", *weights_only]
    assert coarse.options == {"activationGroupSize": "128"} and fine.options == {
        "activationGroupSize": "auto"
    }
    controlled, verdict = _build(cnn, tmp_path / "control", "int8", accuracyControl="true")
    assert verdict.passed, verdict.failures
    assert controlled.options["accuracyControl"] == "true"
    # Tuned on the gate's own measure: it keeps a fifth of the gate's room (cosine 0.992 at int8).
    assert controlled.options["accuracyControlMetric"] == "gate-headroom"
    assert float(controlled.options["accuracyControlMaxDrop"]) == pytest.approx(0.8)
    weights, verdict = _build(cnn, tmp_path / "weights", "int8", quantization="dynamic")
    assert verdict.passed, verdict.failures
    assert (
        weights.options["quantization"] == "nncf-weights-int8" and "fakeQuantizeNodes" not in weights.options
    )
    # A weights-only build is not followed by full-int8 remedies.
    assert get_backend("openvino").remedies(weights) == []


def test_activation_group_size_travels_with_int8_weights_only(
    cnn: tuple[Path, list[Feeds]], tmp_path: Path
) -> None:
    """The group the CPU quantizes activations by is a run-time property: recorded, served, and used
    when the artifact is loaded back; only int8-weights artifacts carry it."""
    weights, verdict = _build(cnn, tmp_path / "w", "int8", quantization="dynamic", activationGroupSize="128")
    assert verdict.passed, verdict.failures
    assert weights.options["runtime.DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "128"
    assert weights.serving_parameters["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "128"
    runner = get_backend("openvino").load(weights, threads=2)
    assert str(runner.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) == "128"
    off, _ = _build(cnn, tmp_path / "off", "int8", quantization="dynamic", activationGroupSize="off")
    assert off.serving_parameters["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0"
    static, _ = _build(cnn, tmp_path / "s", "int8", activationGroupSize="128")
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in static.serving_parameters


def test_sensitive_matmuls_stay_float_in_a_transformer(tmp_path: Path) -> None:
    _, path, feeds, sig = bert_tiny_case(tmp_path)
    options = {"keepFloat": "sensitive", "floatPrecision": "bf16" if has_fast_bf16() else "fp32"}
    target = Target(name="cpu-int8", backend="openvino", precision="int8", options=options)
    request = compile_request(
        target, onnx_path=path, out_dir=tmp_path / "out", signature=sig, feeds=feeds, threads=2
    )
    artifact = get_backend("openvino").compile(request)
    assert artifact.options["keepFloat"] == "sensitive" and int(artifact.options["floatMatMuls"]) >= 4
    hint = artifact.options["runtime.INFERENCE_PRECISION_HINT"]
    assert hint == ("bf16" if has_fast_bf16() else "f32")  # the float layers at floatPrecision


def test_bf16_only_where_the_cpu_computes_it(cnn: tuple[Path, list[Feeds]], tmp_path: Path) -> None:
    if has_fast_bf16():
        artifact, verdict = _build(cnn, tmp_path, "bf16")
        assert verdict.passed, verdict.failures
        assert artifact.options["runtime.INFERENCE_PRECISION_HINT"] == "bf16"
    else:
        with pytest.raises(BackendError, match="no bf16 instructions"):
            _build(cnn, tmp_path, "bf16")


def test_a_classifier_heads_softmax_is_not_attention(tmp_path: Path) -> None:
    """Found by running MTCNN's ONet (facenet-pytorch's weights): convolutions, then four Linear
    layers and a softmax over face / not face, read as a transformer (a softmax beside two MatMuls),
    so its failed int8 took NNCF's transformer mode first. Attention's softmax feeds the MatMul
    with the values; a head's feeds the output."""
    import openvino as ov

    from kompile.compile_jobs.backends.openvino import is_transformer

    head = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.PReLU(8),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 10 * 10, 32),
        torch.nn.PReLU(32),
        torch.nn.Linear(32, 2),
        torch.nn.Softmax(dim=1),
    ).eval()
    feed = {"x": np.zeros((1, 3, 12, 12), dtype=np.float32)}
    path = torchscript_onnx(head, feed, tmp_path / "head.onnx", {"x": {0: "batch"}}, "probs")
    core = ov.Core()
    graph = core.read_model(str(path))
    assert sum(op.get_type_name() == "MatMul" for op in graph.get_ops()) >= 2
    assert not is_transformer(graph)
    _, bert, _, _ = bert_tiny_case(tmp_path)
    assert is_transformer(core.read_model(str(bert)))


def test_transformers_get_nncf_defaults_first_and_transformer_mode_on_request(tmp_path: Path) -> None:
    _, path, feeds, sig = bert_tiny_case(tmp_path)
    target = Target(name="cpu-int8", backend="openvino", precision="int8")
    request = compile_request(
        target, onnx_path=path, out_dir=tmp_path / "out", signature=sig, feeds=feeds, threads=2
    )
    backend = get_backend("openvino")
    artifact = backend.compile(request)
    # NNCF's defaults first (the fastest int8); transformer mode is the first remedy.
    assert artifact.options["modelType"] == "none" and artifact.options["graph"] == "transformer"
    names = [r.name for r in backend.remedies(artifact)]
    assert names == ["transformer", "weights-only", "weights-only-fine", "keep-sensitive", "accuracy-control"]
    # The float layers of an int8 model run at bf16 where the CPU has it (OpenVINO's default there).
    assert artifact.options["runtime.INFERENCE_PRECISION_HINT"] == ("bf16" if has_fast_bf16() else "f32")
    explicit = target.model_copy(update={"options": {"modelType": "transformer"}})
    request = compile_request(
        explicit, onnx_path=path, out_dir=tmp_path / "out2", signature=sig, feeds=feeds, threads=2
    )
    artifact = backend.compile(request)
    assert artifact.options["modelType"] == "transformer" and artifact.options["preset"] == "mixed"


def test_pipeline_writes_the_triton_openvino_layout(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(targets=[{"name": "cpu", "backend": "openvino", "precision": "int8"}])
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    repo = Path(t["artifact"]["uri"].removeprefix("file://"))
    assert sorted(p.name for p in (repo / "small" / "1").iterdir()) == ["model.bin", "model.xml"]
    config = (repo / "small" / "config.pbtxt").read_text()
    assert 'backend: "openvino"' in config and "platform:" not in config
    assert 'key: "PERFORMANCE_HINT"\n  value { string_value: "LATENCY" }' in config
    assert 'key: "INFERENCE_PRECISION_HINT"' in config and "max_batch_size: 16" in config


def test_auto_offers_openvino_and_says_what_it_left_out(
    kompile_run, write_manifest, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from kompile.compile_jobs import build

    monkeypatch.setattr(build, "has_fast_bf16", lambda: False)  # a CPU class without bf16 units
    doc = small_cnn_doc(
        targets=[{"name": "cpu-bf16", "precision": "bf16"}, {"name": "cpu-int8", "precision": "int8"}]
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    by = {t["name"]: t for t in res.status["targets"]}
    assert by["cpu-bf16"]["phase"] == "Skipped"
    left_out = " ".join(by["cpu-bf16"]["notOffered"])
    assert "openvino: " in left_out and "inductor: " in left_out and "no bf16 instructions" in left_out
    assert {c["backend"] for c in by["cpu-int8"]["candidates"]} == {"onnxruntime", "openvino"}
    assert any(n.startswith("inductor: ") for n in by["cpu-int8"]["notOffered"])  # no int8 in inductor
    assert by["cpu-int8"]["phase"] == "Succeeded", by["cpu-int8"]


def test_a_node_openvino_refuses_at_a_declared_size_is_named_in_the_message(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path
) -> None:
    """Found by running PaddleOCR's text-direction classifier (rapidocr-onnxruntime's ONNX file):
    ONNX Runtime runs a 2x2 MaxPool on a 1-pixel-high input (one partial window), OpenVINO refuses
    it, and the candidate said only 'Exception from src/inference/src/cpp/infer_request.cpp:224:'."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, "height", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, None, 4])
    pool = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    model = helper.make_model(
        helper.make_graph([pool], "pool", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "pool.onnx"))
    dims = [
        {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 2},
        {"axis": 2, "name": "height", "min": 1, "opt": 8, "max": 16},
    ]
    doc = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "pool"},
        "spec": {
            "source": {"uri": str(tmp_path / "pool.onnx")},
            "inputs": [{"name": "x", "shape": [-1, 4, -1, 8], "dynamicDims": dims}],
            "targets": [{"name": "cpu", "candidates": [{"backend": "onnxruntime"}, {"backend": "openvino"}]}],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
        },
    }
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    cands = {c["name"]: c for c in res.status["targets"][0]["candidates"]}
    assert cands["onnxruntime-fp32"]["phase"] == "Succeeded"
    refused = cands["openvino-fp32"]
    assert refused["reason"] == "ValidationFailed", refused
    # With two or more cores OpenVINO 2026.4 raises, and its node is named; on one core (a pinned
    # test worker, a one-core pod) it raises nothing and returns the previous size's output
    # ([1, 4, 4, 4] where the source gives [1, 4, 1, 4]): the shape check refuses that instead.
    message = refused["message"]
    assert "at height 1" in message and "Exception from" not in message, refused
    if "does not match the source model's [1, 4, 1, 4]" not in message:
        assert "MaxPool node with name 'y'" in message, refused
        assert "Kernel after dilation has size (dim: 2) larger than the data shape" in message, refused
