"""The LiteRT backend for real on a small CNN, in its own environment (scripts/setup-backend-env.sh
litert; `make test` builds it): torch.export here, litert-torch and ai-edge-quantizer there, the
`.tflite` validated against eager and timed by the LiteRT interpreter in that environment's process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kompile.api.spec import InputSpec, Precision, Target
from kompile.compile_jobs.backends.base import BackendError, Feeds
from kompile.compile_jobs.benchmark import SelfTimed
from kompile.compile_jobs.calibration import calibrating
from tests.pipeline.conftest import (
    IMAGE,
    build_and_compare,
    cnn_feeds,
    require_environment,
    run_static_target,
)


@pytest.fixture(scope="module", autouse=True)
def _litert_environment() -> None:
    require_environment("litert")


@pytest.fixture(scope="module")
def feeds() -> list[Feeds]:
    return cnn_feeds(8)


def _build(
    feeds: list[Feeds], out: Path, precision: Precision, quantization: Any = None
) -> tuple[Any, Any, Any]:
    from models.small import small_cnn

    target = Target(
        name=f"edge-{precision}", backend="litert", precision=precision, quantization=quantization
    )
    return build_and_compare(target, small_cnn(), [IMAGE], feeds, out)


@pytest.fixture(scope="module")
def fp32(feeds: list[Feeds], tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    return _build(feeds, tmp_path_factory.mktemp("fp32"), "fp32")


def test_fp32_tflite_matches_eager_and_is_timed_in_its_environment(
    fp32: tuple[Any, Any, Any], feeds: list[Feeds]
) -> None:
    artifact, runner, verdict = fp32
    assert verdict.passed, verdict.failures
    assert min(o.cosine for o in verdict.outputs) > 0.99999
    assert artifact.model_path.name == "model.tflite" and artifact.serving is None
    o = artifact.options
    assert o["threads"] == "2" and o["converter"] == "litert-torch"
    assert o["exportedStatic"] == "input=[1, 3, 32, 32]"  # litert-torch converts static shapes only
    assert artifact.toolchain["torch"] == "2.14.1" and artifact.toolchain["litert-torch"] == "0.10.0"
    assert runner.output_names == ["output"]
    timed = runner.timed(feeds[0])
    assert isinstance(timed, SelfTimed) and timed.ns > 0
    with pytest.raises(BackendError, match=r"converted at the static shapes \[\(1, 3, 32, 32\)\]"):
        runner.run({"input": np.zeros((2, 3, 32, 32), np.float32)})


def test_int8_static_is_full_integer_calibrated_and_smaller(
    fp32: tuple[Any, Any, Any], feeds: list[Feeds], tmp_path: Path
) -> None:
    int8, _, verdict = _build(feeds, tmp_path, "int8", "static")
    assert verdict.passed, verdict.failures
    assert min(o.cosine for o in verdict.outputs) > 0.999
    o = int8.options
    assert o["quantization"] == "ai-edge-quantizer-static-wi8-ai8" and o["integerIo"] == "true"
    assert o["calibrationSamples"] == str(len(calibrating(len(feeds))))  # every fourth held out
    assert int8.model_path.stat().st_size < 0.6 * fp32[0].model_path.stat().st_size


def test_int8_dynamic_needs_no_calibration(feeds: list[Feeds], tmp_path: Path) -> None:
    artifact, _, verdict = _build(feeds, tmp_path, "int8", "dynamic")
    assert verdict.passed, verdict.failures
    assert artifact.options["quantization"] == "ai-edge-quantizer-dynamic-wi8-afp32"
    assert artifact.options["calibrationSamples"] == "0" and artifact.options["integerIo"] == "false"
    # Both convolutions' and the classifier's weights are int8; the activations stay float.
    assert artifact.options["int8Weights"] == "3"


class _Elementwise(torch.nn.Module):
    """No convolution, no matmul: nothing the dynamic recipe quantizes (it takes weights of
    CONV_2D, FULLY_CONNECTED and the like)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(1, 16))
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.norm(x * self.w))


def test_int8_dynamic_that_quantizes_no_weight_is_refused_not_labelled_int8(tmp_path: Path) -> None:
    """It built an all-float .tflite and reported it as int8 (found by reading)."""
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(3)]
    spec = InputSpec.model_validate({"name": "x", "shape": [1, 16], "dtype": "float32"})
    target = Target(name="elem-int8", backend="litert", precision="int8", quantization="dynamic")
    with pytest.raises(BackendError, match=r"quantized no weight.*ops: .*MUL.*quantization: static"):
        build_and_compare(target, _Elementwise().eval(), [spec], feeds, tmp_path)


def test_kompile_run_validates_and_times_a_litert_target(kompile_run: Any, write_manifest: Any) -> None:
    run_static_target(kompile_run, write_manifest, "litert", "int8")


class _TokenClassifier(torch.nn.Module):
    """Token ids in (int64, as tokenizers give them), like a transformer's first layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(ids)).mean(dim=1))


def test_int8_static_calibrates_a_model_fed_token_ids(tmp_path: Path) -> None:
    """LiteRT takes the ids as int32: calibration (and each run) feeds them in the model's dtype
    (int64 calibration data made every int8 MiniLM build fail)."""
    rng = np.random.default_rng(1)
    ids = [{"ids": rng.integers(0, 100, (1, 12)).astype(np.int64)} for _ in range(6)]
    spec = InputSpec.model_validate({"name": "ids", "shape": [1, 12], "dtype": "int64"})
    target = Target(name="ids-int8", backend="litert", precision="int8", quantization="static")
    _, _, verdict = build_and_compare(target, _TokenClassifier().eval(), [spec], ids, tmp_path)
    assert verdict.passed, verdict.failures
