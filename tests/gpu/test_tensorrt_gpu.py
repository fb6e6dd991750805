"""The TensorRT backend on a GPU, for real: prepare on CPU, build a strongly typed engine, validate it
against the eager model, time it, reuse the timing cache. Skipped without a CUDA GPU or TensorRT."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
trt = pytest.importorskip("tensorrt")
pytest.importorskip("modelopt.onnx.autocast")

from kompile.api.spec import Precision, Target  # noqa: E402
from kompile.compile_jobs.backends.base import get_backend  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.trt import cache, plan  # noqa: E402
from kompile.compile_jobs.validate import compare, resolve_thresholds  # noqa: E402
from tests.gpu.common import GPU_ONLY, IMAGE, image_feeds  # noqa: E402

pytestmark = GPU_ONLY


def _export(model: torch.nn.Module, path: Path) -> Path:
    torch.onnx.export(
        model,
        (torch.randn(2, 3, 32, 32),),
        str(path),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return path


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_build_validate_and_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: Precision
) -> None:
    from models.small import small_cnn

    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "timing-caches"))
    backend = get_backend("tensorrt")
    assert backend.unavailable_reason() is None
    model = small_cnn()
    onnx_path = _export(model, tmp_path / "small_cnn.onnx")
    feeds = image_feeds(4, 8)
    target = Target(name=f"gpu-{precision}", backend="tensorrt", precision=precision)
    request = compile_request(
        target,
        onnx_path=onnx_path,
        out_dir=tmp_path / "build",
        signature=[IMAGE],
        feeds=feeds,
        module=model,
        device="cuda",
    )
    artifact = backend.compile(request)
    assert artifact.serving is not None and artifact.serving.triton_platform == "tensorrt_plan"
    assert [name for _, name in artifact.files()] == ["model.plan"]
    # The header parser agrees with the library that wrote the plan.
    header = plan.read_header(artifact.model_path)
    assert trt.__version__.startswith(f"{header.major}.{header.minor}.{header.patch}")
    assert artifact.options["planTensorrtVersion"] == header.version
    cache_file = tmp_path / "timing-caches" / artifact.options["timingCache"]
    assert cache_file.is_file() and cache_file.stat().st_size > 0

    runner = backend.load(artifact, device="cuda")
    with torch.no_grad():
        reference = [[model(torch.from_numpy(f["input"])).numpy()] for f in feeds]
    result = compare(reference, [runner.run(f) for f in feeds], ["logits"], resolve_thresholds(precision))
    assert result.passed, result.failures
    for batch in (1, 64):  # both ends of the profile
        (out,) = runner.run(image_feeds(batch, 1)[0])
        assert out.shape == (batch, 10)
    times = runner.time_ms(image_feeds(8, 1)[0], iterations=50)
    print(f"{precision}: p50 {sorted(times)[len(times) // 2]:.4f} ms at batch 8, {artifact.options}")

    # A second build reads the class's timing cache and writes it back.
    again = backend.compile(
        compile_request(
            target,
            onnx_path=onnx_path,
            out_dir=tmp_path / "again",
            signature=[IMAGE],
            feeds=feeds,
            module=model,
        )
    )
    assert again.options["timingCache"] == artifact.options["timingCache"] and cache_file.is_file()
