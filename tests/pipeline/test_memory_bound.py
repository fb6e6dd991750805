"""A run that memory cannot hold with every artifact loaded: each validated artifact is unloaded
and timed in a round of its own beside eager, and nothing is lost (kompile.compile_jobs.residency).
KOMPILE_MEMORY_LIMIT stands for a machine too small for the model: the rule is the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import small_cnn_doc


def test_artifacts_that_do_not_fit_are_timed_one_at_a_time(
    kompile_run: Callable[..., Any],
    write_manifest: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KOMPILE_MEMORY_LIMIT", "1")
    doc = small_cnn_doc(
        targets=[
            {
                "name": "cpu",
                "candidates": [
                    {"name": "ort", "backend": "onnxruntime", "precision": "fp32"},
                    {"name": "ov", "backend": "openvino", "precision": "fp32"},
                ],
            }
        ],
        benchmark={"batchSizes": [1, 4], "warmup": 1, "iterations": 3},
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    assert res.stderr.count("unloaded until its benchmark round") == 2, res.stderr
    assert "benchmarking batch 4: eager and cpu/ov (loaded again for its own round)" in res.stderr, res.stderr
    status = json.loads(res.stdout)
    (target,) = status["targets"]
    assert target["phase"] == "Succeeded", target.get("message")
    for cand in target["candidates"]:
        assert cand["phase"] == "Succeeded", cand.get("message")
        assert [s["batchSize"] for s in cand["latency"]] == [1, 4]
        assert cand["speedup"] > 0
    # Against the eager of its own round, at both batch sizes; compared on one scale.
    assert [s["batchSize"] for s in target["eagerLatency"]] == [1, 4]
    assert "scaling each round by its eager" in target["selection"]["message"]
    (eager,) = [b for b in status["baselines"] if b["name"] == "eager"]
    assert [s["batchSize"] for s in eager["latency"]] == [1, 4]


def test_a_memory_limit_that_is_not_a_size_stops_the_run_before_any_build(
    kompile_run: Callable[..., Any],
    write_manifest: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was found after every build, as "kompile failed unexpectedly ... a bug in kompile"."""
    monkeypatch.setenv("KOMPILE_MEMORY_LIMIT", "lots")
    res = kompile_run(write_manifest(small_cnn_doc()), "--no-register")
    assert res.code == 2, res.stderr
    assert "KOMPILE_MEMORY_LIMIT='lots'" in res.stderr and "Gi" in res.stderr, res.stderr
    assert "compiling" not in res.stderr and "bug in kompile" not in res.stderr, res.stderr


def test_the_memory_benchmark_reports_both_runs() -> None:
    """benchmarks/memory_bound.py on a small MLP, the bounded run's limit below anything: every
    artifact is unloaded there and none in the other, and both runs pick a validated winner."""
    from tests.pipeline.conftest import run_benchmark

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_bound.py"
    args = ["--width", "64", "--depth", "2", "--limit", "1", "--iterations", "3"]
    report = run_benchmark(script, *args, "--backends", "onnxruntime,openvino")
    loaded, bounded = report["runs"]
    assert (loaded["mode"], loaded["unloaded"]) == ("all-loaded", 0)
    assert (bounded["mode"], bounded["unloaded"]) == ("bounded", 2)
    for r in (loaded, bounded):
        assert set(r["candidates"]) == {"onnxruntime", "openvino"} and r["winner"] in r["candidates"]
        assert r["peakRssGB"] > 0
    assert report["cpu"] and report["weightsGB"] == 0.0
