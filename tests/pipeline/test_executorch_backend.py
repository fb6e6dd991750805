"""The ExecuTorch backend for real on a small CNN: torch.export -> XNNPACK-lowered `.pte`, fp32 and
PT2E int8 calibrated on the reference inputs; the program loaded back through ExecuTorch's runtime
and compared with eager; static export of a dynamic signature; ONNX sources refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("executorch")
torch = pytest.importorskip("torch")

from kompile.api.spec import Precision, Target  # noqa: E402
from kompile.compile_jobs.backends.base import BackendError, Feeds  # noqa: E402
from kompile.compile_jobs.build import skip_reason  # noqa: E402
from kompile.compile_jobs.calibration import calibrating  # noqa: E402
from tests.pipeline.conftest import IMAGE, build_and_compare, cnn_feeds, run_static_target  # noqa: E402

# tests.pipeline.conftest puts examples/ on sys.path: `models.*` imports as in manifests.


@pytest.fixture(scope="module")
def feeds() -> list[Feeds]:
    return cnn_feeds(8)


def _build(
    feeds: list[Feeds], out: Path, precision: Precision, quantization: Any = None, **options: str
) -> tuple[Any, Any, Any]:
    from models.small import small_cnn

    target = Target(
        name=f"edge-{precision}",
        backend="executorch",
        precision=precision,
        quantization=quantization,
        options=options or None,
    )
    return build_and_compare(target, small_cnn(), [IMAGE], feeds, out)


def test_fp32_pte_runs_in_the_executorch_runtime_and_matches_eager(
    feeds: list[Feeds], tmp_path: Path
) -> None:
    artifact, runner, verdict = _build(feeds, tmp_path, "fp32")
    assert verdict.passed, verdict.failures
    assert min(o.cosine for o in verdict.outputs) > 0.99999
    assert artifact.model_path.name == "model.pte" and artifact.model_path.stat().st_size > 0
    assert artifact.serving is None  # for devices: no Triton layout, never rolled out
    o = artifact.options
    assert o["threads"] == "2" and int(o["delegatedPartitions"]) >= 1
    # The dynamic batch is exported at the signature's opt, and the options say so.
    assert o["exportedStatic"] == "input=[1, 3, 32, 32]"
    assert runner.output_names == ["output"]
    with pytest.raises(BackendError, match=r"exported at the static shapes \[\(1, 3, 32, 32\)\]"):
        runner.run({"input": np.zeros((2, 3, 32, 32), np.float32)})


def test_int8_is_calibrated_per_channel_validates_and_is_smaller(feeds: list[Feeds], tmp_path: Path) -> None:
    fp32, _, _ = _build(feeds, tmp_path / "fp32", "fp32")
    int8, _, verdict = _build(feeds, tmp_path / "int8", "int8", "static")
    assert verdict.passed, verdict.failures
    o = int8.options
    assert o["quantization"] == "pt2e-xnnpack-static" and o["perChannel"] == "true"
    assert o["calibrationSamples"] == str(len(calibrating(len(feeds))))  # every fourth held out
    # int8 weights: well under the fp32 program (the CNN is small, so headers weigh in).
    assert int8.model_path.stat().st_size < 0.6 * fp32.model_path.stat().st_size


def test_int8_dynamic_needs_no_calibration_and_per_channel_weights(
    feeds: list[Feeds], tmp_path: Path
) -> None:
    artifact, _, verdict = _build(feeds, tmp_path, "int8", "dynamic")
    assert artifact.options["quantization"] == "pt2e-xnnpack-dynamic"
    assert artifact.options["calibrationSamples"] == "0"
    assert verdict.passed, verdict.failures
    with pytest.raises(BackendError, match="int8 dynamic needs per-channel weights: remove perChannel=false"):
        _build(feeds, tmp_path / "pt", "int8", "dynamic", perChannel="false")


def test_int8_dynamic_on_a_model_without_linear_layers_is_refused(feeds: list[Feeds], tmp_path: Path) -> None:
    """XNNPACK quantizes activations at run time in linear layers only: a CNN without one came back
    whole, and its fp32 program validated under the int8 label."""
    convs = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).eval()
    target = Target(name="cpu-int8", backend="executorch", precision="int8", quantization="dynamic")
    with pytest.raises(BackendError) as err:
        build_and_compare(target, convs, [IMAGE], feeds, tmp_path)
    assert "quantized no operator" in str(err.value), err.value
    assert "dynamic quantizes linear layers only and the model has none" in str(err.value)
    assert "Use quantization static" in str(err.value)


def test_onnx_sources_and_other_precisions_are_refused() -> None:
    target = Target(name="e", backend="executorch", precision="fp32")
    reason = skip_reason(target, "cpu", source="onnx")
    assert reason is not None and reason[0] == "UnsupportedSource" and "onnxruntime" in reason[1]
    bf16 = Target(name="e", backend="executorch", precision="bf16")
    assert skip_reason(bf16, "cpu")[0] == "UnsupportedPrecision"  # type: ignore[index]
    assert skip_reason(target, "cuda")[0] == "UnsupportedDevice"  # type: ignore[index]


def test_kompile_run_validates_and_times_an_executorch_target(kompile_run: Any, write_manifest: Any) -> None:
    target = run_static_target(kompile_run, write_manifest, "executorch", "int8")
    assert [s["batchSize"] for s in target["eagerLatency"]] == [1, 2]


def test_a_transformer_int8_quantizes_only_float_tensors(tmp_path: Path) -> None:
    """A BERT builds its attention mask with integer arithmetic on aranges; the XNNPACK quantizer's
    global config would quantize it and the index tensor would turn float. The int8 program builds,
    runs at the exported shape (batch 2, sequence 16, right-padded rows) and tracks eager."""
    from tests.pipeline.conftest import bert_tiny_case

    model, _, feeds, signature = bert_tiny_case(tmp_path)
    target = Target(name="edge-int8", backend="executorch", precision="int8", quantization="static")
    artifact, _, verdict = build_and_compare(target, model, signature, feeds, tmp_path / "pte")
    assert artifact.options["exportedStatic"] == "input_ids=[2, 16];attention_mask=[2, 16]"
    assert artifact.options["calibrationSamples"] == str(len(calibrating(len(feeds))))
    # Random weights: the figure that matters is that the program runs and tracks eager closely.
    assert min(o.cosine for o in verdict.outputs) > 0.95, verdict.failures
