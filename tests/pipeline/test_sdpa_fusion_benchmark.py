"""benchmarks/sdpa_fusion.py end to end on a 2-layer BERT on SDPA: the user's dynamo-exported file
and the module itself, each built by kompile and timed against plain ONNX Runtime and OpenVINO."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.conftest import run_benchmark

pytest.importorskip("openvino")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sdpa_fusion.py"


def test_both_ways_in_are_fused_validated_and_timed_against_the_peers() -> None:
    report = run_benchmark(
        SCRIPT, "--models", "bert_tiny_sdpa", "--batch-sizes", "1", "--iterations", "2",
        "--samples", "2", "--no-torch-compile", "--max-foreign-cores", "-1",
    )  # fmt: skip
    assert report["machine"]["isa"] and report["machine"]["threads"] >= 1
    (model,) = report["models"]
    runtimes = model["runtimes"]
    assert {"eager", "onnxruntime", "openvino-f32", "kompile-onnx-file", "kompile-module"} <= set(runtimes)
    for name, runtime in runtimes.items():
        assert name == "eager" or runtime["validation"]["passed"], (name, runtime)
    assert runtimes["kompile-onnx-file"]["options"]["sdpaFusion"] == "Attention=2"
    assert runtimes["kompile-module"]["traced_with_eager_attention"] is True
    assert "Attention=2" in runtimes["kompile-module"]["options"]["fusedOps"]
    # Traced as it is, SDPA stays unfused: what kompile built before, kept as the comparison.
    assert "Attention" not in runtimes["kompile-module-sdpa-traced"]["options"]["fusedOps"]
    ratios = model["verdict"]["plain_onnxruntime_p50_over_kompile_p50"]["1"]
    assert set(ratios) == {"kompile-onnx-file", "kompile-module", "kompile-module-sdpa-traced"}
    assert all(r > 0 for r in ratios.values()), ratios
