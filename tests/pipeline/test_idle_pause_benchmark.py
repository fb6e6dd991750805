"""benchmarks/idle_pause.py on the small CNN: the pipeline timer's pause before each timed call,
fixed against waiting for idle threads, both modes timing the same loaded runtimes."""

from __future__ import annotations

from pathlib import Path

from tests.pipeline.conftest import run_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "idle_pause.py"


def test_both_pauses_time_every_runtime_in_alternating_blocks() -> None:
    report = run_benchmark(SCRIPT, "--models", "small_cnn", "--iterations", "4", "--blocks", "2")
    assert report["machine"]["isa"] and report["settings"]["modes"]["until_idle"]["until_idle"] is True
    runs = report["models"]["small_cnn"]
    names = {"eager", "onnxruntime-fp32", "onnxruntime-int8", "openvino-fp32"}
    for mode in ("fixed_50ms", "until_idle"):
        assert set(runs[mode]["runtimes"]) == names
        for figures in runs[mode]["runtimes"].values():
            assert 0 < figures["p50_min_ms"] <= figures["p50_ms"] <= figures["p50_max_ms"]
        assert runs[mode]["block_wall_s"] > 0
    # The ratios a reader compares by (how long a pool spins depends on the CPU: no bound here).
    ratios = runs["until_idle_over_fixed"]
    assert set(ratios["p50"]) == names and all(r > 0 for r in ratios["p50"].values())
    assert ratios["block_wall"] > 0
