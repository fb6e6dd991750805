"""The iree backend on a GPU: the small CNN compiled for cuda (the GPU's compute capability, PTX
for the newest target IREE knows at or below it), validated against fp32 eager and timed in the
iree environment's process. Skipped where torch sees no CUDA device; needs the iree environment
(scripts/setup-backend-env.sh iree)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kompile.api.spec import Target  # noqa: E402
from kompile.compile_jobs.backends.base import get_backend  # noqa: E402
from kompile.compile_jobs.benchmark import SelfTimed  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.validate import compare, resolve_thresholds  # noqa: E402
from tests.gpu.common import GPU_ONLY, IMAGE, image_feeds  # noqa: E402

pytestmark = GPU_ONLY


def test_cuda_vmfb_validates_against_eager_and_is_timed(tmp_path: Path) -> None:
    from models.small import small_cnn

    model = small_cnn()
    feeds = image_feeds(8, 2)
    target = Target(name="gpu-iree", backend="iree", precision="fp32")
    request = compile_request(
        target, out_dir=tmp_path, signature=[IMAGE], feeds=feeds, module=model, device="cuda"
    )
    backend = get_backend("iree")
    artifact = backend.compile(request)
    major, minor = torch.cuda.get_device_capability(0)
    assert artifact.options["halDevice"] == "cuda"
    assert artifact.options["computeCapability"] == f"{major}.{minor}"
    runner = backend.load(artifact)
    try:
        with torch.no_grad():
            reference = [[model(torch.from_numpy(f["input"])).numpy()] for f in feeds]
        got = [runner.run(f) for f in feeds]
        result = compare(reference, got, runner.output_names, resolve_thresholds("fp32"))
        assert result.passed, result.failures
        timed = runner.timed(feeds[0])
        assert isinstance(timed, SelfTimed) and timed.ns > 0
    finally:
        runner.close()
