"""benchmarks/artifact_rounds.py end to end: a small CNN's ONNX export timed with ONNX Runtime against
the same model built by the tvm environment (untuned), each in fresh processes, in rotated rounds."""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.pipeline.conftest import require_environment, run_benchmark, run_in_environment, torchscript_onnx

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "artifact_rounds.py"

BUILD = """
import sys
import numpy as np
from kompile.compile_jobs.envs import write_arrays
from kompile.compile_jobs.envs.tvm import Steps

program, out, example = sys.argv[1:4]
write_arrays(example, [np.zeros((1, 3, 16, 16), "float32")])
# No tuning database handed over: TVM's default lowering, seconds to build.
Steps().op_compile({"precision": "fp32", "options": {"cores": "1"}, "example": example,
                    "program": program, "out": out})
"""


def test_an_onnx_model_and_a_tvm_library_timed_in_fresh_processes(tmp_path: Path) -> None:
    require_environment("tvm")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten())
    feed = {"input": torch.zeros(1, 3, 16, 16).numpy()}
    onnx = torchscript_onnx(model.eval(), feed, tmp_path / "m.onnx", {}, "output")
    script = tmp_path / "build.py"
    script.write_text(BUILD)
    library, example = tmp_path / "m.so", tmp_path / "ex.npz"
    run_in_environment("tvm", [str(script), str(onnx), str(library), str(example)], tmp_path)
    report = run_benchmark(
        SCRIPT,
        "--rounds",
        "2",
        "--calls",
        "3",
        "--pause-ms",
        "1",
        "--threads",
        "1",
        "--input-shape",
        "1,3,16,16",
        f"ort={onnx}",
        f"tvm={library}",
    )
    assert report["machine"]["isa"]  # the figures' ISA travels with them
    got = report["artifacts"]
    assert list(got) == ["ort", "tvm"]
    assert got["ort"]["ratio_to_first"] == got["ort"]["paired_ratio_to_first"] == 1.0
    assert got["ort"]["rounds_faster_than_first"] == 0
    assert 0 <= got["tvm"]["rounds_faster_than_first"] <= 2 and got["tvm"]["paired_ratio_to_first"] > 0
    for name in ("ort", "tvm"):
        assert len(got[name]["round_medians_ms"]) == 2
        assert 0 < got[name]["p10_ms"] <= got[name]["p50_ms"] <= got[name]["p90_ms"]
    ratio = got["tvm"]["p50_ms"] / got["ort"]["p50_ms"]
    assert got["tvm"]["ratio_to_first"] == pytest.approx(ratio, rel=0.02)  # p50s rounded to 0.1 us


def test_an_unknown_artifact_kind_is_refused_with_what_to_give(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0")
    cmd = [sys.executable, str(SCRIPT), "--rounds", "1", f"x={model}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "give an .onnx model (ONNX Runtime) or a TVM .so" in done.stderr


def test_the_spread_of_few_rounds_stays_inside_the_rounds() -> None:
    """Two rounds 0.02 and 0.2 ms once gave p10 = -0.0127 ms: statistics.quantiles' default method
    extrapolates past the data when there are fewer points than quantiles."""
    spec = importlib.util.spec_from_file_location("artifact_rounds", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for values in ([0.02, 0.2], [5.0], [3.0, 1.0, 2.0], [1.0, 1.0, 1.0, 9.0]):
        p10, p90 = module.spread(values)
        assert min(values) <= p10 <= statistics.median(values) <= p90 <= max(values), (values, p10, p90)
