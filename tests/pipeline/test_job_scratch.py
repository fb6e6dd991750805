"""A compile Job leaves its node's disk as it found it: what it wrote under its scratch folder (the
pod's emptyDir, also its HOME and TMPDIR: exported models, compiler caches of hundreds of MB) is
removed when it exits, published or failed, since a finished pod keeps its emptyDir until the Job's
TTL deletes it a day later. What was there before it started is not its own and stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from kompile.api.job_contract import ExitCode
from kompile.api.spec import Target
from tests.pipeline.conftest import EXAMPLES, run_compile_job, small_cnn_doc


def test_a_published_job_removes_what_it_wrote_and_keeps_what_was_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "theirs.txt").write_text("not the job's")
    code, status = run_compile_job(monkeypatch, small_cnn_doc(), Target(name="cpu-fp32"), tmp_path, EXAMPLES)
    assert code == ExitCode.VERDICT and status.phase == "Succeeded", status
    assert sorted(p.name for p in scratch.iterdir()) == ["termination-log", "theirs.txt"]
    published = [p.name for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert "result.json" in published and "model.onnx" in published, published


def test_a_failed_job_removes_what_it_wrote_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Built, then failed by a gate no int8 build passes: the export and the build were written.
    impossible = {"maxAbsError": 0.0, "minCosine": 1.0}
    target = Target.model_validate(
        {"name": "cpu-int8", "backend": "onnxruntime", "precision": "int8", "tolerances": impossible}
    )
    code, status = run_compile_job(monkeypatch, small_cnn_doc(), target, tmp_path, EXAMPLES)
    assert code == ExitCode.VERDICT
    assert status.phase == "Failed" and "max abs error" in (status.message or ""), status
    assert [p.name for p in (tmp_path / "scratch").iterdir()] == ["termination-log"]


def test_a_job_with_a_bad_source_leaves_only_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = small_cnn_doc(source={"uri": "python://models.small:no_such_model"})
    code, status = run_compile_job(monkeypatch, doc, Target(name="cpu-fp32"), tmp_path, EXAMPLES)
    assert code == ExitCode.BAD_INPUT
    assert status.phase == "Failed" and "no_such_model" in (status.message or ""), status
    assert [p.name for p in (tmp_path / "scratch").iterdir()] == ["termination-log"]
