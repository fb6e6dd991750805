"""The inductor backend on a GPU: an fp16 AOTInductor package for CUDA, validated against fp32 eager
and timed against it. Skipped where torch sees no CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kompile.api.spec import Target  # noqa: E402
from kompile.compile_jobs.backends.base import get_backend  # noqa: E402
from kompile.compile_jobs.benchmark import time_interleaved  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.validate import compare, resolve_thresholds  # noqa: E402
from tests.gpu.common import GPU_ONLY, IMAGE, image_feeds  # noqa: E402

pytestmark = GPU_ONLY


@pytest.mark.parametrize("cuda_graphs", ["false", "true"])
def test_fp16_cuda_package_validates_and_is_timed(tmp_path: Path, cuda_graphs: str) -> None:
    from models.small import small_cnn

    backend = get_backend("inductor")
    model = small_cnn()
    target = Target(
        name="gpu-fp16", backend="inductor", precision="fp16", options={"cudaGraphs": cuda_graphs}
    )
    request = compile_request(
        target,
        out_dir=tmp_path,
        signature=[IMAGE],
        feeds=image_feeds(8, 2),
        module=model,
        device="cuda",
    )
    artifact = backend.compile(request)
    assert artifact.options["device"] == "cuda" and artifact.options["cudaGraphs"] == cuda_graphs
    assert artifact.toolchain["cuda"] and artifact.toolchain["computeCapability"]
    runner = backend.load(artifact, device="cuda")
    for batch in (1, 32):
        feeds = image_feeds(batch, 3)
        with torch.no_grad():
            reference = [[model(torch.from_numpy(f["input"])).numpy()] for f in feeds]
        cand = [runner.run(f) for f in feeds]
        result = compare(reference, cand, runner.output_names, resolve_thresholds("fp16"))
        assert result.passed, result.failures
    gpu_model = small_cnn().cuda()
    feed = image_feeds(32, 1)[0]

    def eager() -> None:  # host to device and back, as the runner does
        with torch.no_grad():
            gpu_model(torch.from_numpy(feed["input"]).cuda()).cpu()

    stats = time_interleaved({"eager": eager, "aoti": lambda: runner.run(feed)}, 32, 5, 20)
    print({k: round(v.p50_ms, 3) for k, v in stats.items()})  # shown with pytest -s
    assert all(s.p50_ms > 0 for s in stats.values())
