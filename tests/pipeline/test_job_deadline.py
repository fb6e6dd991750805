"""A compile Job near its deadline stops starting candidates and publishes what it built.

activeDeadlineSeconds ends a Job with SIGTERM, and a stopped Job publishes nothing: a target whose
candidates ran long lost every validated build to the last one started. The operator tells the Job
when its deadline ends (counted from the Job's creation, so a retried pod knows how much is left),
and the Job keeps the last share of it to time and publish what it has."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kompile.api.job_contract import ExitCode, JobDeadline
from kompile.api.spec import Target
from tests.pipeline.conftest import EXAMPLES, run_compile_job, small_cnn_doc


def test_a_job_near_its_deadline_publishes_what_it_built_and_skips_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = Target.model_validate(
        {
            "name": "cpu",
            "backend": "auto",
            "candidates": [{"backend": "onnxruntime"}, {"backend": "openvino"}],
            "precision": "fp32",
        }
    )
    # Created 1000 s ago with a 1100 s deadline: 100 s left, less than the 220 s (20%) kept.
    deadline = JobDeadline(created=time.time() - 1000, seconds=1100)
    code, status = run_compile_job(
        monkeypatch, small_cnn_doc(), target, tmp_path, EXAMPLES, deadline=deadline
    )
    assert code == ExitCode.VERDICT and status.phase == "Succeeded", status
    phases = {c.backend: (c.phase, c.reason) for c in status.candidates}
    assert phases == {"onnxruntime": ("Succeeded", "Validated"), "openvino": ("Skipped", "DeadlineNear")}, (
        phases
    )
    skipped = next(c for c in status.candidates if c.backend == "openvino")
    message = skipped.message or ""
    assert "1100 s" in message and "KOMPILE_JOB_DEADLINE_SECONDS" in message, message
    published = [p.name for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert "result.json" in published and "model.onnx" in published, published


def test_a_job_with_time_left_builds_every_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = Target.model_validate(
        {
            "name": "cpu",
            "backend": "auto",
            "candidates": [{"backend": "onnxruntime"}, {"backend": "openvino"}],
            "precision": "fp32",
        }
    )
    deadline = JobDeadline(created=time.time(), seconds=3600)
    code, status = run_compile_job(
        monkeypatch, small_cnn_doc(), target, tmp_path, EXAMPLES, deadline=deadline
    )
    assert code == ExitCode.VERDICT
    assert {c.backend: c.phase for c in status.candidates} == {
        "onnxruntime": "Succeeded",
        "openvino": "Succeeded",
    }
