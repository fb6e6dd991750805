"""Two bugs of the untyped backend seam, found by reading (issue 17), each held by a test:

- `options.device` is read by the candidate expansion and the operator's target resolution, but
  reached every backend's option parser, which refused it: the target ended CompileFailed.
- TensorRT's CPU pre-check took its thresholds from the target alone and ignored
  `spec.validation` (tolerances and task), so spec-level tolerances never reached it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.conftest import small_cnn_doc


def test_options_device_is_a_known_option_of_every_backend(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(
        targets=[{"name": "cpu", "backend": "onnxruntime", "precision": "fp32", "options": {"device": "cpu"}}]
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    assert t["phase"] == "Succeeded", t.get("message")


def test_tensorrt_cpu_precheck_holds_spec_level_tolerances(
    tmp_path: Path, write_manifest, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Strict tolerances in spec.validation (none on the target) must refuse an int8 graph on CPU,
    before any GPU build. Stand-ins at the GPU edge only: this machine is told it has an NVIDIA
    GPU class and TensorRT; the build never gets that far when the CPU check refuses."""
    pytest.importorskip("modelopt.onnx.quantization")
    from kompile.api.resource import load_manifest
    from kompile.compile_jobs import build, pipeline
    from kompile.compile_jobs.backends import tensorrt

    monkeypatch.setattr(build, "local_cuda_class", lambda: "nvidia-stand-in")
    monkeypatch.setattr(tensorrt.TensorRTBackend, "unavailable_reason", lambda self: None)
    doc = small_cnn_doc(
        targets=[{"name": "gpu-int8", "backend": "tensorrt", "precision": "int8"}],
        validation={"samples": 4, "tolerances": {"maxAbsError": 1e-7, "minCosine": 0.99999999}},
    )
    opts = pipeline.PipelineOptions(
        base_dir=tmp_path, work_dir=tmp_path / "w", artifact_root=tmp_path / "a", device="cuda"
    )
    result = pipeline.run_pipeline(load_manifest(write_manifest(doc)), opts, pipeline.LogReporter(print))
    (t,) = result.status.targets
    assert t.phase == "Failed" and t.reason == "CompileFailed"
    assert "missed the validation thresholds on CPU" in (t.message or ""), t.message
