"""Candidates and selection: several ways to build one target, the fastest validated one wins, and
every candidate's figures are kept in status, result.json and MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.pipeline.conftest import small_cnn_doc


def _only_target(status: dict[str, Any]) -> dict[str, Any]:
    (target,) = status["targets"]
    return target


def test_fastest_validated_candidate_wins_and_every_candidate_is_recorded(
    kompile_run, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(
        targets=[
            {
                "name": "cpu",
                "candidates": [
                    {"backend": "onnxruntime", "precision": "fp32"},
                    {"backend": "onnxruntime", "precision": "int8", "quantization": "static"},
                    # A compile that fails (bad option value) is reported and never wins.
                    {"name": "broken", "backend": "onnxruntime", "options": {"optLevel": "fastest"}},
                ],
            }
        ],
        benchmark={"batchSizes": [1, 4], "warmup": 1, "iterations": 5},
    )
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr
    t = _only_target(res.status)
    cands = {c["name"]: c for c in t["candidates"]}
    assert list(cands) == ["onnxruntime-fp32", "onnxruntime-int8", "broken"]
    assert cands["broken"]["phase"] == "Failed" and cands["broken"]["reason"] == "CompileFailed"
    assert "optLevel" in cands["broken"]["message"] and not cands["broken"]["selected"]
    timed = {n: c for n, c in cands.items() if c["phase"] == "Succeeded"}
    assert set(timed) == {"onnxruntime-fp32", "onnxruntime-int8"}
    winner = min(timed.values(), key=lambda c: c["latency"][0]["p50Ms"])
    assert [c["name"] for c in cands.values() if c["selected"]] == [winner["name"]]
    # The target carries the winner's build and figures.
    assert t["phase"] == "Succeeded" and t["precision"] == winner["precision"]
    assert t["latency"][0]["p50Ms"] == winner["latency"][0]["p50Ms"]
    assert t["artifact"]["digest"] == winner["artifactDigest"]
    sel = t["selection"]
    assert sel["policy"] == "minLatency" and sel["winner"] == winner["name"] and sel["batchSize"] == 1
    assert winner["name"] in sel["message"] and "ms" in sel["message"]
    # result.json beside the shipped artifact keeps all candidates.
    repo = Path(t["artifact"]["uri"].removeprefix("file://"))
    assert repo.name.startswith("cpu-")
    result = json.loads((repo / "result.json").read_text())
    assert [c["name"] for c in result["target"]["candidates"]] == list(cands)

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=res.status["registry"]["trackingUri"])
    (version,) = client.search_model_versions("name='small'")
    assert version.tags["kompile.precision"] == winner["precision"]
    target_run = client.get_run(version.run_id)
    children = client.search_runs(
        [target_run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{version.run_id}'"
    )
    by_candidate = {r.data.tags["kompile.candidate"]: r for r in children}
    assert set(by_candidate) == set(cands)
    assert by_candidate[winner["name"]].data.tags["kompile.selected"] == "true"
    assert by_candidate[winner["name"]].data.metrics["p50_ms_b4"] > 0
    assert by_candidate["broken"].data.tags["kompile.phase"] == "Failed"


def test_max_throughput_under_a_budget_and_when_nothing_meets_it(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    candidates = [
        {"backend": "onnxruntime", "precision": "fp32"},
        {"backend": "onnxruntime", "precision": "fp32", "options": {"optLevel": "basic"}},
    ]
    targets = [
        {
            "name": "roomy",
            "candidates": candidates,
            "selection": {"policy": "maxThroughput", "latencyBudgetMs": 10000},
        },
        {
            "name": "tight",
            "candidates": candidates,
            "selection": {"policy": "maxThroughput", "latencyBudgetMs": 0.000001},
        },
    ]
    doc = small_cnn_doc(targets=targets, benchmark={"batchSizes": [1, 8], "warmup": 1, "iterations": 3})
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    by_name = {t["name"]: t for t in res.status["targets"]}
    roomy = by_name["roomy"]
    names = [c["name"] for c in roomy["candidates"]]
    assert names == ["onnxruntime-fp32", "onnxruntime-fp32-2"]  # unnamed duplicates get a suffix
    best = max(
        ((c["name"], lat) for c in roomy["candidates"] for lat in c["latency"]),
        key=lambda nl: nl[1]["throughput"],
    )
    assert roomy["selection"]["winner"] == best[0]
    assert roomy["selection"]["batchSize"] == best[1]["batchSize"]
    tight = by_name["tight"]["selection"]
    assert tight["winner"] in names and tight["message"].startswith("no candidate kept p90 within")


def test_no_validated_candidate_fails_the_target(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(
        targets=[
            {
                "name": "cpu",
                "precision": "int8",
                "tolerances": {"minCosine": 1.0, "maxAbsError": 0.0},
                "candidates": [
                    {"backend": "onnxruntime", "quantization": "static"},
                    {"backend": "onnxruntime", "quantization": "dynamic"},
                ],
            }
        ]
    )
    res = kompile_run(write_manifest(doc))
    assert res.code == 1
    t = _only_target(res.status)
    assert t["phase"] == "Failed" and t["reason"] == "NoCandidateValidated"
    assert "onnxruntime-int8" in t["message"] and "onnxruntime-int8-2" in t["message"]
    assert not any(c["selected"] for c in t["candidates"])
    assert "artifact" not in t
    ready = next(c for c in res.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "NoCandidateValidated"


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
