"""The onnxruntime backend on real small models: build, run, compare with eager, record options."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

from kompile.api.catalog import CATALOG, OptionsError  # noqa: E402
from kompile.api.spec import Precision, Target  # noqa: E402
from kompile.api.vocabulary import Quantization  # noqa: E402
from kompile.compile_jobs.backends.base import BackendError, Feeds, get_backend  # noqa: E402
from kompile.compile_jobs.backends.onnxruntime import (  # noqa: E402
    OnnxRuntimeBackend,
    detect_heads,
    detect_model_type,
    load_checked,
)
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.validate import compare, resolve_thresholds  # noqa: E402
from tests.pipeline.conftest import small_cnn_doc, torchscript_onnx  # noqa: E402

Array = np.ndarray[Any, Any]
SEQ = 32
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:  # the example factories live in examples/models
    sys.path.insert(0, str(EXAMPLES))


@pytest.fixture(scope="module")
def backend() -> OnnxRuntimeBackend:
    b = get_backend("onnxruntime")
    assert isinstance(b, OnnxRuntimeBackend)
    return b


def _eager(model: Any, feeds: list[Feeds]) -> list[list[Array]]:
    with torch.no_grad():
        return [[model(*(torch.from_numpy(a) for a in f.values())).numpy()] for f in feeds]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, list[Feeds]]:
    from models.small import small_cnn

    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)} for _ in range(4)]
    model = small_cnn()
    path = tmp_path_factory.mktemp("cnn") / "small_cnn.onnx"
    return (
        model,
        torchscript_onnx(model, feeds[0], path, {"input": {0: "batch"}, "logits": {0: "batch"}}, "logits"),
        feeds,
    )


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, list[Feeds]]:
    from models.transformer import bert_tiny

    rng = np.random.default_rng(0)
    feeds = []
    for i in range(4):
        mask = np.ones((2, SEQ), dtype=np.int64)
        mask[1, SEQ // 2 + i :] = 0  # padded second row: the fused attention must honour the mask
        feeds.append({"input_ids": rng.integers(0, 1000, (2, SEQ)).astype(np.int64), "attention_mask": mask})
    model = bert_tiny()
    dyn = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "last_hidden_state")}
    path = tmp_path_factory.mktemp("bert") / "bert_tiny.onnx"
    return model, torchscript_onnx(model, feeds[0], path, dyn, "last_hidden_state"), feeds


@pytest.fixture(scope="module")
def bert_sdpa(bert: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, list[Feeds]]:
    """The same tiny BERT on SDPA attention (transformers' default), exported as users export it now:
    torch.onnx.export(dynamo=True), whose SDPA pattern ONNX Runtime's optimizer does not fuse."""
    import warnings

    from models.transformer import bert_tiny_sdpa

    _, _, feeds = bert
    model = bert_tiny_sdpa()
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=128)
    path = tmp_path_factory.mktemp("bert_sdpa") / "bert_sdpa.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            tuple(torch.from_numpy(a) for a in feeds[0].values()),
            str(path),
            input_names=list(feeds[0]),
            output_names=["last_hidden_state"],
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    return model, path, feeds


def _build_and_check(
    backend: OnnxRuntimeBackend, case: tuple[Any, Path, list[Feeds]], out: Path, target: Target
) -> dict[str, str]:
    model, onnx_path, feeds = case
    art = backend.compile(
        compile_request(target, onnx_path=onnx_path, out_dir=out, signature=[], feeds=feeds, threads=1)
    )
    assert art.model_path.is_file() and art.model_path.parent == out
    assert art.serving is not None and (art.serving.kserve_format, art.serving.triton_platform) == (
        "onnx",
        "onnxruntime_onnx",
    )
    assert [name for _, name in art.files()] == ["model.onnx"]
    assert art.toolchain["onnxruntime"] == backend.version()
    runner = backend.load(art)
    result = compare(
        _eager(model, feeds),
        [runner.run(f) for f in feeds],
        runner.output_names,
        resolve_thresholds(target.precision),
    )
    assert result.passed, result.failures
    assert art.options["intraOpThreads"] == "1" and art.options["precision"] == target.precision
    return art.options


@pytest.mark.parametrize(
    ("precision", "quantization", "expected"),
    [
        ("fp32", None, None),
        ("int8", "static", "static"),
        ("int8", "dynamic", "dynamic"),
        ("int8", None, "static"),
    ],
)
def test_small_cnn(
    backend: OnnxRuntimeBackend,
    cnn: Any,
    tmp_path: Path,
    precision: Precision,
    quantization: Quantization | None,
    expected: str | None,
) -> None:
    target = Target(name="cpu", backend="onnxruntime", precision=precision, quantization=quantization)
    options = _build_and_check(backend, cnn, tmp_path, target)
    assert options["modelType"] == "none" and "fusedOps" not in options
    assert options.get("quantization") == expected
    if expected == "static":
        assert options["perChannel"] == "true" and options["calibrationSamples"] == "3"


@pytest.mark.parametrize(("precision", "quantization"), [("fp32", None), ("int8", "dynamic"), ("int8", None)])
def test_bert_tiny_fuses_and_quantizes(
    backend: OnnxRuntimeBackend,
    bert: Any,
    tmp_path: Path,
    precision: Precision,
    quantization: Quantization | None,
) -> None:
    target = Target(name="cpu", backend="onnxruntime", precision=precision, quantization=quantization)
    options = _build_and_check(backend, bert, tmp_path, target)
    assert options["modelType"] == "bert"
    assert "Attention=2" in options["fusedOps"] and "EmbedLayerNormalization=1" in options["fusedOps"]
    # Add + LayerNormalization stays unfused: the CPU SkipLayerNormalization kernel is slower.
    assert "SkipLayerNormalization" not in options["fusedOps"]
    assert options["disabledOptimizers"] == "SkipLayerNormFusion"
    assert (options["numHeads"], options["hiddenSize"], options["attentionMask"]) == ("2", "128", "raw")
    gelu = "FastGelu=2" if precision == "int8" else "BiasGelu=2"  # tanh GELU only where int8 rounds anyway
    assert gelu in options["fusedOps"] and options["geluApproximation"] == str(precision == "int8").lower()
    if precision == "int8":
        assert options["quantization"] == "dynamic"  # the transformer default


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_dynamo_exported_sdpa_attention_is_fused(
    backend: OnnxRuntimeBackend, bert_sdpa: Any, tmp_path: Path, precision: Precision
) -> None:
    """A user's ONNX file from torch.onnx.export(dynamo=True) on SDPA: ONNX Runtime's optimizer fused
    no attention in it (fusedOps BiasGelu and LayerNormalization only), leaving it 10% slower than
    the same model exported with eager attention. Fused through onnxscript's rules, padded rows
    included (the feeds pad the second row). int8 is left as it was: QAttention cannot take the
    fused op's mask, and its projections quantized unfused run as fast."""
    target = Target(name="cpu", backend="onnxruntime", precision=precision)
    options = _build_and_check(backend, bert_sdpa, tmp_path / "out", target)
    assert options["modelType"] == "bert", options
    import onnx

    ops = {n.op_type for n in onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node}
    if precision == "fp32":
        assert options["sdpaFusion"] == "Attention=2" and "Attention=2" in options["fusedOps"], options
        assert "SkipLayerNormalization" not in options["fusedOps"] and "Attention" in ops, ops
    else:
        assert "sdpaFusion" not in options and "Attention" not in ops, (options, ops)
        assert "DynamicQuantizeMatMul" in ops or "MatMulInteger" in ops, ops


def test_a_failing_sdpa_rule_leaves_the_graph_unfused(
    backend: OnnxRuntimeBackend, bert_sdpa: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fusion is an optimization: whatever onnxscript raises, the artifact is built unfused and
    its options say why."""
    from kompile.compile_jobs import sdpa_fusion

    def broken(src: Path, dst: Path, external: bool) -> int:
        raise AttributeError("'NoneType' object has no attribute 'shape'")

    monkeypatch.setattr(sdpa_fusion, "fuse_sdpa_attention", broken)
    target = Target(name="cpu", backend="onnxruntime", precision="fp32")
    options = _build_and_check(backend, bert_sdpa, tmp_path / "out", target)
    assert options["sdpaFusion"] == "failed: 'NoneType' object has no attribute 'shape'", options
    assert "Attention" not in options["fusedOps"], options


def test_a_fused_graph_onnx_runtime_cannot_optimize_falls_back_to_the_unfused_one(
    backend: OnnxRuntimeBackend, bert_sdpa: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kompile.compile_jobs import sdpa_fusion

    def not_onnx(src: Path, dst: Path, external: bool) -> int:
        dst.write_bytes(b"not a model")
        return 2

    monkeypatch.setattr(sdpa_fusion, "fuse_sdpa_attention", not_onnx)
    target = Target(name="cpu", backend="onnxruntime", precision="fp32")
    options = _build_and_check(backend, bert_sdpa, tmp_path / "out", target)
    assert options["sdpaFusion"].startswith("failed: transformer fusion (bert)"), options
    assert "Attention" not in options["fusedOps"], options


def test_a_python_source_on_sdpa_is_traced_with_eager_attention(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    """A python:// factory returning a Hugging Face model on SDPA (transformers' default): the
    TorchScript exporter wrote its attention as a pattern neither ONNX Runtime's optimizer nor
    onnxscript's rules fuse (fusedOps without Attention). Traced with eager attention it fuses; the
    model is put back on SDPA after the trace."""
    import json

    dims = [
        {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4},
        {"axis": 1, "name": "seq", "min": 1, "opt": 16, "max": 64},
    ]
    doc = small_cnn_doc(
        source={"uri": "python://models.transformer:bert_tiny_sdpa"},
        inputs=[
            {"name": n, "dtype": "int64", "shape": [-1, -1], "low": lo, "high": hi, "dynamicDims": dims}
            for n, lo, hi in (("input_ids", 0, 1000), ("attention_mask", 1, 2))
        ],
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (target,) = json.loads(res.stdout)["targets"]
    assert target["phase"] == "Succeeded", target
    result = json.loads((Path(target["artifact"]["uri"].removeprefix("file://")) / "result.json").read_text())
    assert "Attention=2" in result["options"]["fusedOps"], result["options"]
    assert "sdpaFusion" not in result["options"]  # fused by ONNX Runtime's own optimizer
    assert "traced with eager attention" in res.stderr


def test_eager_attention_lasts_for_the_trace_only() -> None:
    from models.transformer import bert_tiny, bert_tiny_sdpa

    from kompile.compile_jobs.export import eager_attention

    notes: list[str] = []
    model = bert_tiny_sdpa()
    with eager_attention(model, notes.append):
        assert model.bert.config._attn_implementation == "eager"
    assert model.bert.config._attn_implementation == "sdpa" and len(notes) == 1
    with eager_attention(bert_tiny(), notes.append):  # already eager: nothing to switch or say
        pass
    assert len(notes) == 1


def test_sdpa_fusion_keeps_external_weights_outside(
    backend: OnnxRuntimeBackend, bert_sdpa: Any, tmp_path: Path
) -> None:
    """The same file with its weights in ONNX external data (as exports over 2 GB must have them):
    the fused graph keeps them outside too."""
    import onnx

    model, path, feeds = bert_sdpa
    external = tmp_path / "src" / "bert_sdpa.onnx"
    external.parent.mkdir()
    onnx.save(onnx.load(str(path)), str(external), save_as_external_data=True, location="weights.bin")
    target = Target(name="cpu", backend="onnxruntime", precision="fp32")
    art = backend.compile(
        compile_request(target, onnx_path=external, out_dir=tmp_path / "out", signature=[], feeds=feeds)
    )
    assert art.options["sdpaFusion"] == "Attention=2" and art.options["externalData"] == "true", art.options
    assert [name for _, name in art.files()] == ["model.onnx", "model.onnx.data"]
    runner = backend.load(art)
    got = [runner.run(f) for f in feeds]
    result = compare(_eager(model, feeds), got, runner.output_names, resolve_thresholds("fp32"))
    assert result.passed, result.failures


def test_skip_layer_norm_on_request(backend: OnnxRuntimeBackend, bert: Any, tmp_path: Path) -> None:
    target = Target(name="cpu", backend="onnxruntime", options={"skipLayerNorm": "true"})
    options = _build_and_check(backend, bert, tmp_path, target)
    assert "SkipLayerNormalization=4" in options["fusedOps"] and options["disabledOptimizers"] == ""


def test_bert_tiny_static_int8(
    backend: OnnxRuntimeBackend, bert: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = Target(name="cpu", backend="onnxruntime", precision="int8", quantization="static")
    options = _build_and_check(backend, bert, tmp_path, target)
    assert options["quantization"] == "static" and options["quantFormat"] == "qdq"
    # Its per-channel pass logs a line per LayerNorm weight (rank 1: quantized per tensor, as it
    # should be) on the root logger: 13 WARNING lines amid all-MiniLM's progress, none of them news.
    assert not [r for r in caplog.records if "is out-of-range for weight" in r.getMessage()]


def test_graph_detection(bert: Any, cnn: Any) -> None:
    assert detect_model_type(load_checked(bert[1])) == "bert"
    assert detect_heads(load_checked(bert[1])) == (2, 128)
    assert detect_model_type(load_checked(cnn[1])) == "none"


def test_model_type_override_skips_fusion(backend: OnnxRuntimeBackend, bert: Any, tmp_path: Path) -> None:
    target = Target(name="cpu", backend="onnxruntime", options={"modelType": "none", "optLevel": "all"})
    options = _build_and_check(backend, bert, tmp_path, target)
    assert options["modelType"] == "none" and "fusedOps" not in options and options["optLevel"] == "all"


def test_corrupt_onnx_names_the_file(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf" * 10)
    target = Target(name="cpu", backend="onnxruntime")
    with pytest.raises(BackendError, match=r"broken\.onnx.*not a valid ONNX model"):
        backend.compile(
            compile_request(target, onnx_path=bad, out_dir=tmp_path / "out", signature=[], feeds=[])
        )


def test_missing_file_and_static_without_calibration(
    backend: OnnxRuntimeBackend, cnn: Any, tmp_path: Path
) -> None:
    with pytest.raises(BackendError, match="does not exist"):
        backend.compile(
            compile_request(
                Target(name="c", backend="onnxruntime"),
                onnx_path=tmp_path / "nope.onnx",
                out_dir=tmp_path,
                signature=[],
                feeds=[],
            )
        )
    target = Target(name="c", backend="onnxruntime", precision="int8", quantization="static")
    with pytest.raises(BackendError, match="quantization: dynamic"):
        backend.compile(compile_request(target, onnx_path=cnn[1], out_dir=tmp_path, signature=[], feeds=[]))


def test_options_are_checked() -> None:
    parse = CATALOG["onnxruntime"].parse_options
    assert parse({"optLevel": "ALL", "perChannel": "true"}).record()["optLevel"] == "all"
    with pytest.raises(OptionsError, match=r"optLevel=.fast.*extended"):
        parse({"optLevel": "fast"})
    with pytest.raises(OptionsError, match=r"unknown onnxruntime option.*optlevel"):
        parse({"optlevel": "all"})
    with pytest.raises(OptionsError, match="numHeads"):
        parse({"numHeads": "twelve"})
    with pytest.raises(BackendError, match="fp16"):
        OnnxRuntimeBackend().compile(
            compile_request(
                Target(name="c", backend="onnxruntime", precision="fp16"),
                onnx_path=Path("x.onnx"),
                out_dir=Path("."),
                signature=[],
                feeds=[],
            )
        )


def test_runner_names_missing_inputs(backend: OnnxRuntimeBackend, cnn: Any, tmp_path: Path) -> None:
    art = backend.compile(
        compile_request(
            Target(name="c", backend="onnxruntime"),
            onnx_path=cnn[1],
            out_dir=tmp_path,
            signature=[],
            feeds=[],
        )
    )
    runner = backend.load(art, threads=1)
    with pytest.raises(BackendError, match=r"\['input'\] missing"):
        runner.run({"x": np.zeros((1, 3, 32, 32), np.float32)})
    out = runner.run({"input": np.zeros((1, 3, 32, 32), np.float64)})  # dtype converted to the model's
    assert out[0].shape == (1, 10) and runner.output_names == ["logits"]


def test_a_fused_graph_onnx_runtime_refuses_to_load_is_built_unfused(
    kompile_run: Any, tmp_path: Path
) -> None:
    """wav2vec2 (as wav2vec2-base-960h is shaped, here small) at a fixed second of audio: ONNX
    Runtime 1.31 loads the transformer-fused graph only with MatMulAddFusion off (`Attempt to replace
    the existing tensor`, at ORT_ENABLE_EXTENDED and up), and the target failed CompileFailed where
    the unfused graph builds and validates. The fusion is an optimization: the artifact is built
    without it, and its options say why."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    config = Wav2Vec2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
    )  # fmt: skip
    Wav2Vec2ForCTC(config).save_pretrained(tmp_path / "wav2vec2")
    doc = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "wav2vec2"},
        "spec": {
            "source": {"uri": "wav2vec2"},
            "inputs": [{"name": "input_values", "dtype": "float32", "shape": [1, 16000]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime", "precision": "fp32"}],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
            "validation": {"samples": 2},
        },
    }
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    res = kompile_run(manifest, "--no-register")
    (target,) = res.status["targets"]
    assert res.code == 0 and target["phase"] == "Succeeded", (target.get("message"), res.stderr[-2000:])
    folder = Path(target["artifact"]["uri"].removeprefix("file://"))
    options = json.loads((folder / "result.json").read_text())["options"]
    assert options["transformerFusion"].startswith(
        "not loadable, built unfused: ONNX Runtime could not load"
    ), options
    assert "fusedOps" not in options, options
    # ONNX Runtime's own log line (colour codes and all) stays out of the progress: the error is said once.
    assert "\x1b[" not in res.stderr and "[E:onnxruntime" not in res.stderr, res.stderr[-2000:]


def test_heads_are_read_from_the_layers_not_a_convolutional_front_end(tmp_path: Path) -> None:
    """wav2vec2 normalizes its convolutional features (512 wide in wav2vec2-base, 32 here) before
    its transformer layers (768, 64 here): read from the first LayerNormalization, the hidden size
    was the convolution's, and ONNX Runtime's fusion said `Input hidden size (32) is not same as
    weight matrix dimension of q,k,v (64)` and fused no attention."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer",
    )  # fmt: skip
    # Eager attention, as kompile loads a Hugging Face model (its scale is one Mul to read).
    model = Wav2Vec2Model._from_config(config, attn_implementation="eager").eval()
    feed = {"input_values": np.zeros((1, 1600), np.float32)}
    dynamic = {"input_values": {0: "batch", 1: "samples"}}
    path = torchscript_onnx(model, feed, tmp_path / "wav2vec2.onnx", dynamic, "last_hidden_state")
    assert detect_heads(load_checked(path)) == (4, 64)
