"""Candidates with the real backends: what `auto` offers on each device and how it behaves there.
The orchestration itself (selection, failures, skips, records) is tested with the null stand-in in
tests/pipeline/test_orchestration.py, in seconds."""

from __future__ import annotations

from pathlib import Path

from tests.pipeline.conftest import small_cnn_doc


def test_a_cuda_job_on_a_machine_without_a_gpu_skips_with_the_reason(tmp_path: Path, write_manifest) -> None:  # type: ignore[no-untyped-def]
    """What a GPU class's compile Job reports when its pod lands without a usable GPU."""
    from kompile.api.resource import load_manifest
    from kompile.compile_jobs.pipeline import LogReporter, PipelineOptions, run_pipeline

    path = write_manifest(small_cnn_doc(targets=[{"name": "gpu", "precision": "fp16"}]))
    lines: list[str] = []
    opts = PipelineOptions(
        base_dir=tmp_path, work_dir=tmp_path / "w", artifact_root=tmp_path / "a", device="cuda"
    )
    result = run_pipeline(load_manifest(path), opts, LogReporter(lines.append))
    (t,) = result.status.targets
    assert t.phase == "Skipped" and not result.built
    assert {c.backend for c in t.candidates} == {"tensorrt", "inductor"}
    assert all(c.phase == "Skipped" for c in t.candidates)
    assert any("GPU" in (c.message or "") or "tensorrt" in (c.message or "") for c in t.candidates)
    assert t.message and "inductor-fp16" in t.message


def test_bert_example_runs_end_to_end_with_auto_candidates(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    """examples/bert-base.yaml as written, on the 2-layer BERT of the same code: the transformers
    mask helpers' tracer warnings do not block export, and both CPU backends compete."""
    import yaml

    from tests.pipeline.conftest import EXAMPLES

    doc = yaml.safe_load((EXAMPLES / "bert-base.yaml").read_text())
    doc["spec"]["source"]["uri"] = "python://models.transformer:bert_tiny"
    for spec in doc["spec"]["inputs"]:
        if spec["name"] == "input_ids":
            spec["high"] = 1000  # bert_tiny's vocabulary
    doc["spec"]["inputs"][0]["dynamicDims"][1]["max"] = 128  # bert_tiny's positions
    doc["spec"]["inputs"][1]["dynamicDims"][1]["max"] = 128
    doc["spec"]["targets"].append({"name": "cpu-auto"})
    doc["spec"]["benchmark"] = {"batchSizes": [1], "warmup": 1, "iterations": 3}
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    by_name = {t["name"]: t for t in res.status["targets"]}
    assert set(by_name) == {"cpu-fp32", "cpu-int8", "cpu-auto"}
    assert all(t["phase"] == "Succeeded" for t in by_name.values())
    auto = by_name["cpu-auto"]
    assert {c["name"]: c["phase"] for c in auto["candidates"]} == {
        "onnxruntime-fp32": "Succeeded",
        "openvino-fp32": "Succeeded",
        "inductor-fp32": "Succeeded",
    }
    assert auto["backend"] == auto["selection"]["winner"].split("-")[0]


def test_inductor_only_targets_skip_the_onnx_export(tmp_path: Path, write_manifest) -> None:  # type: ignore[no-untyped-def]
    """Inductor compiles the module itself: no ONNX export is made (or can fail), and the Triton
    config takes its tensor specs from the signature and eager runs at two sizes."""
    import yaml

    from kompile.api.resource import load_manifest
    from kompile.compile_jobs.pipeline import LogReporter, PipelineOptions, run_pipeline
    from tests.pipeline.conftest import EXAMPLES

    doc = yaml.safe_load((EXAMPLES / "bert-base.yaml").read_text())
    doc["spec"]["source"]["uri"] = "python://models.transformer:bert_tiny"
    for spec in doc["spec"]["inputs"]:
        spec["high"] = 1000 if spec["name"] == "input_ids" else spec["high"]
        spec["dynamicDims"][1]["max"] = 128
    doc["spec"]["targets"] = [{"name": "cpu", "backend": "inductor"}]
    doc["spec"]["benchmark"] = {"batchSizes": [1], "warmup": 1, "iterations": 2}
    lines: list[str] = []
    opts = PipelineOptions(base_dir=tmp_path, work_dir=tmp_path / "w", artifact_root=tmp_path / "a")
    result = run_pipeline(load_manifest(write_manifest(doc)), opts, LogReporter(lines.append))
    (t,) = result.status.targets
    assert t.phase == "Succeeded", t.message
    assert not any("to ONNX" in line for line in lines) and not (tmp_path / "w" / "export").exists()
    config = (result.built[0].repo_dir / "bert-base" / "config.pbtxt").read_text()
    assert 'platform: "torch_aoti"' in config and "max_batch_size: 32" in config
    # batch is Triton's; the sequence stays dynamic on inputs and output, hidden size is fixed
    assert 'name: "ARGS[0]"\n    data_type: TYPE_INT64\n    dims: [ -1 ]' in config
    assert 'name: "RESULT"\n    data_type: TYPE_FP32\n    dims: [ -1, 128 ]' in config
