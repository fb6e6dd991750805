"""What the GPU tests share: the skip where no CUDA device exists, and a small image signature."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kompile.api.spec import InputSpec
from kompile.compile_jobs.backends.base import Feeds


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
