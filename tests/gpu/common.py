"""What the GPU tests share: the skip where no CUDA device exists, a small image signature, and the
small CNN compiled for the GPU, validated and timed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kompile.api.spec import InputSpec
from kompile.compile_jobs.backends.base import CompiledArtifact, Feeds


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# A GPU test skips only where no GPU exists.
GPU_ONLY = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs an NVIDIA GPU with CUDA")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

IMAGE = InputSpec.model_validate(
    {
        "name": "input",
        "shape": [-1, 3, 32, 32],
        "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 8, "max": 64}],
    }
)


def image_feeds(batch: int, count: int) -> list[Feeds]:
    rng = np.random.default_rng(batch)
    return [{"input": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)} for _ in range(count)]


def small_cnn_validated_on_gpu(
    backend_name: str, tmp_path: Path, options: dict[str, str] | None = None
) -> CompiledArtifact:
    """The small CNN compiled by `backend_name` (with the target's `options`) for this node's GPU
    (device cuda), validated against fp32 eager and timed by its runner: the artifact, for the
    caller to check what it records."""
    import torch
    from models.small import small_cnn

    from kompile.api.spec import Target
    from kompile.compile_jobs.backends.base import get_backend
    from kompile.compile_jobs.benchmark import SelfTimed
    from kompile.compile_jobs.build import compile_request
    from kompile.compile_jobs.validate import compare, resolve_thresholds

    model = small_cnn()
    feeds = image_feeds(8, 2)
    target = Target(name=f"gpu-{backend_name}", backend=backend_name, precision="fp32", options=options or {})
    request = compile_request(
        target, out_dir=tmp_path, signature=[IMAGE], feeds=feeds, module=model, device="cuda"
    )
    backend = get_backend(backend_name)
    artifact = backend.compile(request)
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
    return artifact
