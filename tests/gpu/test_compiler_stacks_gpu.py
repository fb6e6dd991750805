"""The compiler stacks on a GPU, each in its own environment (scripts/setup-backend-env.sh <name>):
the small CNN compiled for cuda, validated against fp32 eager and timed in that environment's
process. iree: PTX for the newest CUDA target IREE knows at or below the GPU's compute capability;
tvm: CUDA kernels for the GPU's sm_XY by TVM's default DLight schedules, compiled by NVRTC at load;
xla: StableHLO exported for the cuda platform, compiled by XLA through JAX's CUDA plugin at load.
Skipped where torch sees no CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompile.compile_jobs.tvm_database import ROOT_ENV
from tests.gpu.common import GPU_ONLY, small_cnn_validated_on_gpu

torch = pytest.importorskip("torch")

pytestmark = GPU_ONLY


def _capability() -> str:
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def test_iree_cuda_vmfb_validates_against_eager_and_is_timed(tmp_path: Path) -> None:
    o = small_cnn_validated_on_gpu("iree", tmp_path).options
    assert (o["halDevice"], o["computeCapability"]) == ("cuda", _capability())


def test_tvm_cuda_library_tuned_on_the_gpu_validates_against_eager_and_is_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the class's node MetaSchedule tunes into the GPU class's own database (here a fresh one),
    # measuring each candidate on the GPU; a small budget keeps the test short.
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "databases"))
    o = small_cnn_validated_on_gpu("tvm", tmp_path / "out", {"tuningTrials": "16"}).options
    sm = "sm_" + _capability().replace(".", "")
    assert (o["tvmDevice"], o["computeCapability"], o["tvmTarget"]) == (
        "cuda",
        _capability(),
        f"cuda -arch={sm}",
    )
    assert (o["tuning"], o["pipeline"]) == ("metaschedule", "metaschedule-database+dlight")
    assert int(o["tuningTrialsRun"]) > 0 and o["tuningRecordsShared"] == o["tuningTrialsRun"]
    assert o["tuningDatabase"].startswith("gpu-") and o["tuningDatabase"].endswith(f"cuda--arch={sm}")


def test_xla_cuda_module_validates_against_eager_and_is_timed(tmp_path: Path) -> None:
    o = small_cnn_validated_on_gpu("xla", tmp_path).options
    assert (o["xlaDevice"], o["computeCapability"], o["stablehloPlatforms"]) == (
        "cuda",
        _capability(),
        "cuda",
    )
    # Full fp32: at XLA's default precision (TF32 on the GPU) MobileNetV2 failed the fp32 gate on an H100.
    assert o["matmulPrecision"] == "highest"
