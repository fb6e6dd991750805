"""The Core ML backend, export only, for real on a small CNN: an `.mlpackage` per precision through
torch.export and coremltools, recorded as Exported (no Core ML runtime on Linux), never validated,
timed, selected or served, and not holding a run's Ready back."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("coremltools")
pytest.importorskip("torch")

from kompile.api.spec import Target
from kompile.compile_jobs.backends.base import BackendUnavailable, get_backend
from kompile.compile_jobs.build import compile_request
from kompile.compile_jobs.inputs import generate_feeds
from tests.pipeline.conftest import IMAGE, fresh_kompile, small_cnn_doc


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_mlpackage_per_precision_in_one_zip(
    precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from models.small import small_cnn

    # coremltools converted into a tmp*.mlpackage of the system's temp folder, left there.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    backend = get_backend("coreml")
    target = Target(name=f"mac-{precision}", backend="coreml", precision=precision)  # type: ignore[arg-type]
    feeds = generate_feeds([IMAGE], 2, seed=0)
    request = compile_request(target, module=small_cnn(), out_dir=tmp_path, signature=[IMAGE], feeds=feeds)
    artifact = backend.compile(request)
    assert artifact.model_path.name == "model.mlpackage.zip" and artifact.serving is None
    names = zipfile.ZipFile(artifact.model_path).namelist()
    assert "model.mlpackage/Manifest.json" in names
    assert any(n.endswith("model.mlmodel") for n in names)
    assert artifact.options["precision"] == precision
    assert artifact.options["exportedStatic"] == "input=[1, 3, 32, 32]"
    with pytest.raises(BackendUnavailable, match="not validated: no Core ML runtime on this class"):
        backend.load(artifact)
    del artifact
    import gc

    gc.collect()  # a model object coremltools would delete its package with is gone too
    assert list((tmp_path / "tmp").iterdir()) == []


def test_kompile_run_records_coreml_as_exported_beside_a_validated_target(
    kompile_run: Any, write_manifest: Any
) -> None:
    doc = small_cnn_doc(
        targets=[
            {"name": "cpu-fp32", "backend": "onnxruntime", "precision": "fp32"},
            {"name": "mac-fp16", "backend": "coreml", "precision": "fp16"},
        ]
    )
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr[-2000:]
    status = res.status
    by_name = {t["name"]: t for t in status["targets"]}
    mac = by_name["mac-fp16"]
    assert mac["phase"] == "Exported" and mac["reason"] == "Exported"
    assert mac["message"] == "not validated: no Core ML runtime on this class"
    assert "validation" not in mac and not mac.get("latency")
    assert Path(mac["artifact"]["uri"].removeprefix("file://"), "small", "1", "model.mlpackage.zip").is_file()
    # The validated target alone decides Ready and best; the export neither counts nor blocks.
    assert by_name["cpu-fp32"]["phase"] == "Succeeded"
    assert status["targetsReady"] == "1/1" and status["best"]["target"] == "cpu-fp32"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and "1 exported (not validated)" in ready["message"]


def test_a_fresh_run_prints_none_of_coremltools_import_notes(tmp_path: Path, write_manifest: Any) -> None:
    """A fresh `kompile run` imports coremltools when it reaches the target: eleven lines (untested
    torch and scikit-learn versions, its macOS libraries missing) landed amid the progress, none
    of them anything a user can act on."""
    doc = small_cnn_doc(targets=[{"name": "mac-fp16", "backend": "coreml", "precision": "fp16"}])
    manifest = write_manifest(doc)
    done = fresh_kompile(tmp_path, "run", manifest.name, "--no-register")
    assert done.returncode == 0, done.stderr
    assert "exported, not validated" in done.stdout + done.stderr, done.stdout
    for note in ("Failed to load", "has not been tested", "scikit-learn version"):
        assert note not in done.stderr + done.stdout, done.stderr


def test_onnx_sources_are_refused_with_the_reason() -> None:
    from kompile.compile_jobs.build import skip_reason

    reason = skip_reason(Target(name="m", backend="coreml", precision="fp16"), "cpu", source="onnx")
    assert reason is not None and reason[0] == "UnsupportedSource"
