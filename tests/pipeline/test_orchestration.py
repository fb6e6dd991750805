"""The orchestration around compilers (candidates, selection, failure isolation, skips, saved run
results, registration), tested with the null backend: a STAND-IN compiler that copies the source
and runs it eagerly, told by its options to fail, to add noise or to be slow. Seconds, not minutes:
no real compiler runs here (tests/pipeline/test_*_backend.py hold the real ones)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kompile.api.job_contract import RESULT_FILE, JobResult
from kompile.cli import app
from kompile.compile_jobs import build
from tests.pipeline.conftest import small_cnn_doc

FAST = {"name": "fast", "backend": "null"}
SLOW = {"name": "slow", "backend": "null", "options": {"latencyMs": "20"}}
BROKEN = {"name": "broken", "backend": "null", "options": {"failCompile": "true"}}
NOISY = {"name": "noisy", "backend": "null", "options": {"perturb": "0.5"}}


@pytest.fixture(autouse=True)
def _even_with_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in runs the source eagerly, so the ladder's quick timing against eager would read
    noise (about 1.0x either side): it is stood in for, every rung as fast as the source."""
    monkeypatch.setattr(
        build.timing, "quick_speedups", lambda cm, loaded, ref, runners, feeds: dict.fromkeys(runners, 1.0)
    )


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in items}


def test_fastest_validated_candidate_wins_and_every_candidate_is_recorded(
    kompile_run, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(
        targets=[{"name": "cpu", "candidates": [SLOW, FAST, BROKEN, NOISY]}],
        # The settle loop (timing until figures agree) is tested on its own: bounded here.
        benchmark={"batchSizes": [1, 4], "warmup": 1, "iterations": 5, "maxIterations": 6},
    )
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = _by_name(t["candidates"])
    assert list(cands) == ["slow", "fast", "broken", "noisy"]
    assert cands["broken"]["phase"] == "Failed" and cands["broken"]["reason"] == "CompileFailed"
    assert "failCompile" in cands["broken"]["message"]
    # Said as it happens, as a failed validation is: the table shows CompileFailed and no why.
    assert f"[cpu/broken] failed to compile: {cands['broken']['message']}" in res.stderr, res.stderr
    assert cands["noisy"]["phase"] == "Failed" and cands["noisy"]["reason"] == "ValidationFailed"
    assert not cands["noisy"]["latency"]  # only validated candidates are timed
    assert [n for n, c in cands.items() if c["selected"]] == ["fast"]
    assert cands["slow"]["phase"] == "Succeeded" and cands["slow"]["latency"][0]["p50Ms"] >= 20
    # The target carries the winner's build and figures.
    assert t["phase"] == "Succeeded" and t["backend"] == "null"
    assert t["latency"][0]["p50Ms"] == cands["fast"]["latency"][0]["p50Ms"]
    assert t["artifact"]["digest"] == cands["fast"]["artifactDigest"]
    sel = t["selection"]
    assert sel["policy"] == "minLatency" and sel["winner"] == "fast" and sel["batchSize"] == 1
    # result.json (the Job contract's model) keeps all candidates; the saved run results sit beside it.
    repo = Path(t["artifact"]["uri"].removeprefix("file://"))
    result = JobResult.loads((repo / RESULT_FILE).read_text())
    assert [c.name for c in result.target.candidates] == list(cands)
    assert result.saved_results == {"reference": "reference.npz", "outputs": "outputs.npz"}
    assert (repo / "reference.npz").is_file() and (repo / "outputs.npz").is_file()
    assert not (repo / "small" / "config.pbtxt").exists()  # null is never served: no Triton config

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=res.status["registry"]["trackingUri"])
    (version,) = client.search_model_versions("name='small'")
    run = client.get_run(version.run_id)
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{version.run_id}'"
    )
    tags = {r.data.tags["kompile.candidate"]: r.data.tags for r in children}
    assert set(tags) == set(cands)
    assert tags["fast"]["kompile.selected"] == "true" and tags["broken"]["kompile.phase"] == "Failed"


def test_max_throughput_under_a_budget_and_when_nothing_meets_it(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    targets = [
        {
            "name": "roomy",
            "candidates": [FAST, SLOW],
            "selection": {"policy": "maxThroughput", "latencyBudgetMs": 10000},
        },
        {
            "name": "tight",
            "candidates": [FAST, SLOW],
            "selection": {"policy": "maxThroughput", "latencyBudgetMs": 1e-6},
        },
    ]
    doc = small_cnn_doc(
        targets=targets, benchmark={"batchSizes": [1, 8], "warmup": 1, "iterations": 3, "maxIterations": 6}
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    roomy, tight = (t for t in res.status["targets"])
    best = max(
        ((c["name"], lat) for c in roomy["candidates"] for lat in c["latency"]),
        key=lambda nl: nl[1]["throughput"],
    )
    assert roomy["selection"]["winner"] == best[0] == "fast"
    assert roomy["selection"]["batchSize"] == best[1]["batchSize"]
    assert tight["selection"]["winner"] in ("fast", "slow")
    assert tight["selection"]["message"].startswith("no candidate kept p90 within")


def test_no_validated_candidate_fails_the_target_and_nothing_ships(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    noisier = {"name": "noisier", "backend": "null", "options": {"perturb": "2"}}
    res = kompile_run(
        write_manifest(small_cnn_doc(targets=[{"name": "cpu", "candidates": [NOISY, noisier]}]))
    )
    assert res.code == 1
    (t,) = res.status["targets"]
    assert t["phase"] == "Failed" and t["reason"] == "NoCandidateValidated"
    assert "noisy: ValidationFailed" in t["message"] and "noisier: ValidationFailed" in t["message"]
    assert not any(c["selected"] for c in t["candidates"]) and "artifact" not in t
    ready = next(c for c in res.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "NoCandidateValidated"


def test_one_failing_target_does_not_stop_the_others(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    targets = [
        {"name": "ok", "backend": "null"},
        {"name": "bad", "backend": "null", "options": {"failCompile": "true"}},
        {"name": "off", "backend": "null", "precision": "int8", "options": {"perturb": "0.5"}},
        {"name": "gpu", "backend": "null", "options": {"device": "cuda"}},
    ]
    res = kompile_run(write_manifest(small_cnn_doc(targets=targets)))
    assert res.code == 1
    by = _by_name(res.status["targets"])
    assert by["ok"]["phase"] == "Succeeded" and by["ok"]["registeredVersion"]
    assert (by["bad"]["phase"], by["bad"]["reason"]) == ("Failed", "CompileFailed")
    assert (by["off"]["phase"], by["off"]["reason"]) == ("Failed", "ValidationFailed")
    # The int8 thresholds (cosine, top-k) judged it: noise of 0.5 passes no classifier gate.
    assert by["off"]["validation"]["thresholds"]["minCosine"] == 0.99
    assert (by["gpu"]["phase"], by["gpu"]["reason"]) == ("Skipped", "NoMatchingHardware")
    assert res.status["targetsReady"] == "1/3"  # a skipped target is not counted


def test_torch_only_backends_skip_the_onnx_export(tmp_path: Path, write_manifest) -> None:  # type: ignore[no-untyped-def]
    from kompile.api.resource import load_manifest
    from kompile.compile_jobs.pipeline import LogReporter, PipelineOptions, run_pipeline

    lines: list[str] = []
    opts = PipelineOptions(base_dir=tmp_path, work_dir=tmp_path / "w", artifact_root=tmp_path / "a")
    path = write_manifest(small_cnn_doc(targets=[{"name": "cpu", "backend": "null"}]))
    result = run_pipeline(load_manifest(path), opts, LogReporter(lines.append))
    assert result.status.targets[0].phase == "Succeeded"
    assert not any("to ONNX" in line for line in lines) and not (tmp_path / "w" / "export").exists()
    assert (tmp_path / "w" / "reference.npz").is_file()  # computed once, then copied beside each artifact


def _compare(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["compare", *args])
    return res.exit_code, res.stderr


def test_kompile_compare_holds_saved_results_to_each_other(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    targets = [
        {"name": "good", "backend": "null"},
        {"name": "noisy", "backend": "null", "options": {"perturb": "0.02"}},
    ]
    doc = small_cnn_doc(
        targets=targets, validation={"samples": 3, "tolerances": {"maxAbsError": 10.0, "minCosine": 0.9}}
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    repos = {t["name"]: Path(t["artifact"]["uri"].removeprefix("file://")) for t in res.status["targets"]}
    good, noisy = repos["good"], repos["noisy"]
    # An artifact against the source's saved outputs: what the run decided, reproduced offline.
    code, err = _compare(str(good / "reference.npz"), str(good))
    assert code == 0 and "passed" in err and "eager:" in err and "3 samples" in err, err
    # Two artifacts against each other, with the fp32 defaults: the noisy one misses them.
    code, err = _compare(str(good), str(noisy))
    assert code == 1 and "failed:" in err and "max abs error" in err, err
    code, err = _compare(str(good), str(noisy), "--max-abs-error", "10", "--min-cosine", "0.9")
    assert code == 0, err
    code, err = _compare(str(good), str(noisy), "--max-scaled-error", "10", "--min-cosine", "0.9")
    assert code == 0, err
    # Results of other inputs cannot be compared; a file that is not saved results says so.
    other = write_manifest(
        small_cnn_doc(targets=[targets[0]], validation={"samples": 3, "seed": 7}), "other.yaml"
    )
    res2 = kompile_run(other, "--no-register", "--work-dir", str(good.parent.parent.parent / "other"))
    other_repo = Path(res2.status["targets"][0]["artifact"]["uri"].removeprefix("file://"))
    code, err = _compare(str(good), str(other_repo))
    assert code == 2 and "ran on different inputs" in err, err
    junk = good.parent / "junk.npz"
    junk.write_bytes(b"not an npz")
    code, err = _compare(str(junk), str(good))
    assert code == 2 and "not kompile run results" in err and "Traceback" not in err, err
    result = json.loads((good / RESULT_FILE).read_text())
    assert result["savedResults"]["outputs"] == "outputs.npz"


def test_figures_that_never_settle_are_marked_everywhere(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A runtime whose every call is slower than the last (the null stand-in's driftMs) never
    settles (held to 0.1%, its windows' medians grow about 7% apart): timed up to the bound, then
    marked unstable in --json/status, the table and MLflow."""
    targets = [
        {"name": "steady", "backend": "null"},
        {"name": "drifting", "backend": "null", "options": {"driftMs": "1"}},
    ]
    doc = small_cnn_doc(
        targets=targets,
        benchmark={
            "batchSizes": [1],
            "warmup": 1,
            "iterations": 4,
            "maxIterations": 12,
            "settleTolerance": 0.001,
        },
    )
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr
    by = _by_name(res.status["targets"])
    assert by["drifting"]["latency"][0]["stable"] is False and by["drifting"]["speedupStable"] is False
    assert by["drifting"]["latency"][0]["spread"] > 0
    # ...saying which check failed, with its figures (the windows' medians, not the machine's load).
    why = by["drifting"]["latency"][0]["unsettled"]
    assert "windows' medians differed by" in why and "(settleTolerance 0.1%)" in why, why
    assert res.status["baselines"][0]["latency"][0]["p50Ms"] > 0

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=res.status["registry"]["trackingUri"])
    versions = {v.tags["kompile.target"]: v for v in client.search_model_versions("name='small'")}
    assert versions["drifting"].tags["kompile.speedup_stable"] == "false"
    assert client.get_run(versions["drifting"].run_id).data.metrics["stable_b1"] == 0.0

    # The summary table a person reads: the unsettled figures carry a ~ and the caption says why,
    # beside the CPU they were measured on.
    from rich.console import Console

    from kompile.api.resource import CompiledModel
    from kompile.api.status import CompiledModelStatus
    from kompile.local_run import summary_table

    cm = CompiledModel.model_validate(doc)
    console = Console(width=200, record=True)
    console.print(summary_table(cm, CompiledModelStatus.model_validate(res.status)))
    text = console.export_text()
    row = next(line for line in text.splitlines() if "drifting" in line)
    assert "~" in row, row
    assert "never settled" in text and "CPU: " in text and "threads" in text
    assert " ".join(f"drifting: {why}".split()) in " ".join(text.split()), text  # as wrapped to the width


def test_precision_auto_climbs_the_ladder_and_remedies_stop_at_the_first_pass(
    kompile_run, write_manifest, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """precision auto: int8 first; a failed generated int8 tries its backend's remedies in order and
    the first that passes ends the climb, the slower rungs listed as not tried. Without remedies the
    ladder goes on to bf16 and fp32 (every rung noisy here, so none passes; fp16 is a GPU class's
    rung, left out with a note); on a CPU without bf16 units the bf16 rung is left out too."""
    # The ladder as on a CPU with bf16 units, whatever this machine has (an AVX2-only CPU drops the
    # bf16 rung: the last case below).
    monkeypatch.setattr(build, "has_fast_bf16", lambda: True)
    noisy = {"name": "cpu", "backend": "null", "precision": "auto", "options": {"perturb": "0.5"}}
    bench = {"batchSizes": [1], "warmup": 1, "iterations": 3, "maxIterations": 3}
    res = kompile_run(write_manifest(small_cnn_doc(targets=[noisy], benchmark=bench)), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = _by_name(t["candidates"])
    assert list(cands) == ["null-int8", "null-int8-calmer"]
    assert cands["null-int8"]["reason"] == "ValidationFailed"
    assert cands["null-int8-calmer"]["phase"] == "Succeeded" and cands["null-int8-calmer"]["selected"]
    assert cands["null-int8-calmer"]["options"]["perturb"] == "0.05"
    assert t["precision"] == "int8" and t["phase"] == "Succeeded"
    gpu_rung, note = t["notOffered"]
    assert gpu_rung.startswith("null fp16: precision auto climbs fp16 on GPU classes only"), gpu_rung
    assert note.startswith("bf16, fp32: not tried, int8 validated first")

    plain = dict(noisy, selection={"remedies": False})
    res = kompile_run(
        write_manifest(small_cnn_doc(targets=[plain], benchmark=bench), "plain.yaml"), "--no-register"
    )
    assert res.code == 1
    (t,) = res.status["targets"]
    # No fp16 rung on a CPU class: validated, it would end the climb before a faster fp32.
    assert [c["name"] for c in t["candidates"]] == ["null-int8", "null-bf16", "null-fp32"]
    assert t["reason"] == "NoCandidateValidated"
    (note,) = t["notOffered"]
    assert note.startswith("null fp16: precision auto climbs fp16 on GPU classes only"), note

    monkeypatch.setattr(build, "has_fast_bf16", lambda: False)
    res = kompile_run(
        write_manifest(small_cnn_doc(targets=[plain], benchmark=bench), "no-bf16.yaml"), "--no-register"
    )
    assert res.code == 1
    (t,) = res.status["targets"]
    assert [c["name"] for c in t["candidates"]] == ["null-int8", "null-fp32"]
    fp16, bf16 = t["notOffered"]
    assert fp16.startswith("null fp16: precision auto climbs fp16 on GPU classes only"), fp16
    assert bf16.startswith("null bf16: this CPU") and "has no bf16 instructions" in bf16, bf16


def test_a_rung_slower_than_the_source_does_not_end_the_climb(
    kompile_run, write_manifest, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """precision auto on a small model: int8 validated first and ended the climb at 0.50x eager
    (its quantize steps cost more than its arithmetic saves), and auto shipped an artifact slower
    than the model it was given. A rung that a quick timing finds slower than the source now lets
    the climb go on, and the benchmark picks among every rung built. (The quick timing is stood in
    for: which rung is faster on this machine is the benchmark's to find, not a test's.)"""
    monkeypatch.setattr(build, "has_fast_bf16", lambda: True)
    asked: list[list[str]] = []

    def quick(cm, loaded, reference, runners, feeds):  # type: ignore[no-untyped-def]
        asked.append(sorted(runners))
        return {name: 0.5 if "int8" in name else 1.5 for name in runners}

    monkeypatch.setattr(build.timing, "quick_speedups", quick)
    target = {"name": "cpu", "backend": "null", "precision": "auto"}
    bench = {"batchSizes": [1], "warmup": 1, "iterations": 3, "maxIterations": 3}
    res = kompile_run(write_manifest(small_cnn_doc(targets=[target], benchmark=bench)), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    assert [c["name"] for c in t["candidates"]] == ["null-int8", "null-bf16"], t["candidates"]
    assert asked == [["null-int8"], ["null-bf16"]]
    note = t["notOffered"][-1]
    assert note.startswith("fp32: not tried, bf16 validated first"), note


def test_time_budget_skips_candidates_not_yet_started(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    slow = {"backend": "null", "options": {"compileMs": "1200"}}
    target = {
        "name": "cpu",
        "candidates": [dict(slow, name="first"), dict(slow, name="second"), dict(slow, name="third")],
        "selection": {"timeBudgetSeconds": 1},
    }
    bench = {"batchSizes": [1], "warmup": 1, "iterations": 3, "maxIterations": 3}
    res = kompile_run(write_manifest(small_cnn_doc(targets=[target], benchmark=bench)), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = _by_name(t["candidates"])
    assert cands["first"]["phase"] == "Succeeded" and cands["first"]["selected"]
    for name in ("second", "third"):
        assert cands[name]["phase"] == "Skipped" and cands[name]["reason"] == "BudgetSpent"
        assert "time budget of 1 s" in cands[name]["message"]


def test_remedies_are_for_int8_only(kompile_run, write_manifest) -> None:  # type: ignore[no-untyped-def]
    """A float candidate that fails validation has no int8 remedy to try: before, ONNX Runtime's
    fp32 build was followed by 'static int8 with the sensitive layers kept in float', which built
    the same fp32 artifact again (same digest) under a misleading name."""
    strict = {"name": "cpu", "precision": "fp32", "tolerances": {"maxAbsError": 0.0, "minCosine": 1.0}}
    res = kompile_run(write_manifest(small_cnn_doc(targets=[strict])), "--no-register")
    (t,) = res.status["targets"]
    names = [c["name"] for c in t["candidates"]]
    assert any(c["reason"] == "ValidationFailed" for c in t["candidates"]), t["candidates"]
    assert all(n.endswith("-fp32") for n in names), names
