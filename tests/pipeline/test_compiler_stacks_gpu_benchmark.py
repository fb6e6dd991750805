"""benchmarks/compiler_stacks_gpu.py end to end where no GPU is needed: `build` compiles the small
CNN with iree, tvm and xla for an H100 (the GPU probe stood in), `measure` speaks to each
environment's process as a compile Job does and, on a machine without a GPU, reports each
environment's own refusal instead of figures (on a GPU node it validates and times them); and
benchmarks/tvm_gpu_tuning.py's export here and its checks before any compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kompile.compile_jobs.environments import find_environment
from tests.pipeline.conftest import require_environment, run_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "compiler_stacks_gpu.py"
BACKENDS = ("iree", "tvm", "xla")


def _run(*args: str) -> dict[str, Any]:
    return run_benchmark(SCRIPT, *args)


def test_build_for_an_h100_here_then_measure_reports_each_environments_refusal(tmp_path: Path) -> None:
    for name in BACKENDS:
        require_environment(name)
    import torch

    built = _run("build", "--out", str(tmp_path), "--models", "small-cnn", "--capability", "9.0")
    files = {e["backend"]: e for e in built["artifacts"]}
    assert set(files) == set(BACKENDS) and all("error" not in e for e in files.values())
    assert files["iree"]["options"]["halDevice"] == "cuda"
    assert files["tvm"]["options"]["tvmTarget"] == "cuda -arch=sm_90"
    assert files["xla"]["options"]["matmulPrecision"] == "highest"
    assert (tmp_path / "small-cnn-feed.npz").is_file() and (tmp_path / "small-cnn-reference.npz").is_file()

    pythons = [f"--python={n}={find_environment(n) / 'bin' / 'python'}" for n in BACKENDS]
    quick = ["--no-peers", "--iterations", "3", "--warmup", "0"]
    report = _run("measure", "--dir", str(tmp_path), *quick, *pythons)
    rows = {r["runtime"]: r for r in report["results"]}
    assert set(rows) == set(BACKENDS)
    assert report["versions"]["tvm"]["apache-tvm"] == "0.27.0.post1"
    gpu = torch.cuda.is_available()
    for name, row in rows.items():
        if gpu:
            assert row["validation"]["passed"] and row["p50_ms"] > 0, (name, row)
        else:
            assert "no cuda device here" in row["error"], (name, row)


TUNING = ROOT / "benchmarks" / "tvm_gpu_tuning.py"


def _tuning(*args: str, path: str = str(ROOT)) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TUNING), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
        timeout=900,
    )


def test_tvm_gpu_tuning_exports_here_and_checks_the_gate_and_the_gpu_before_any_compile(
    tmp_path: Path,
) -> None:
    # On an H100 the first run of this benchmark tuned for minutes, then lost every figure at the
    # first validation: kompile's gate needs pydantic, which the bare GPU node lacked.
    require_environment("tvm")
    import torch

    done = _tuning("export", "--out", str(tmp_path), "--models", "small-cnn")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["models"] == [{"model": "small-cnn", "program": "small-cnn.onnx"}]
    assert (tmp_path / "small-cnn.onnx").is_file() and (tmp_path / "small-cnn-reference.npz").is_file()

    python = str(find_environment("tvm") / "bin" / "python")
    tune = [
        "tune",
        "--dir",
        str(tmp_path),
        "--python",
        python,
        "--trials",
        "0",
        "--out",
        str(tmp_path / "r.json"),
    ]
    no_pydantic = tmp_path / "no-pydantic"
    no_pydantic.mkdir()
    (no_pydantic / "pydantic.py").write_text("raise ImportError('no pydantic on this node')\n")
    done = _tuning(*tune, path=f"{no_pydantic}{os.pathsep}{ROOT}")
    assert done.returncode == 1 and "validation gate cannot be imported here" in done.stderr
    assert not list(tmp_path.glob("*.so")) and not (tmp_path / "r.json").exists()

    done = _tuning(*tune)
    if not torch.cuda.is_available():
        assert (
            done.returncode == 1 and "no CUDA device here: run the tune step on the GPU node" in done.stderr
        )
        return
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [c["label"] for c in report["compiles"]] == ["tvm-untuned", "tvm-tuned"]
    timed = [r for r in report["results"] if r["runtime"].startswith("tvm-")]
    assert len(timed) == 2 and all(r["validation"]["passed"] for r in timed)
