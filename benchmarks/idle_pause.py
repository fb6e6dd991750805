"""The pipeline timer's pause before each timed call: a fixed 50 ms against waiting until the previous
runtime's threads stop (bounded by 100 ms); prints JSON.

A runtime's worker pool spins for a while after its call, and a spinning pool takes the cores from
whatever is timed next. The timer used to sleep a fixed 50 ms before each timed call; it now waits
until no other thread of its process (or of the processes a backend's own environment runs in) is
running, at most 100 ms (kompile.compile_jobs.benchmark.wait_until_idle). This measures, in one run,
with the modes' blocks alternating (A B A B ...) on the same loaded runtimes:

- each runtime's p50 under each mode (median over the mode's blocks, with min and max): the figures
  a user reads must not move with the pause;
- each runtime's speedup over eager under each mode (what the pipeline reports and selects on);
- the wall time of a block under each mode: what the pause costs a `kompile run`.

Runtimes: eager PyTorch, ONNX Runtime fp32 and int8 (static, calibrated on the feeds), OpenVINO fp32,
all built and loaded by kompile's own backends at this machine's thread count.

    python benchmarks/idle_pause.py --models small_cnn,resnet50 --iterations 20 --blocks 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "examples")]

from cpu_artifacts import emit_json, machine  # noqa: E402

from kompile.api.spec import Target  # noqa: E402
from kompile.compile_jobs.backends.base import get_backend  # noqa: E402
from kompile.compile_jobs.benchmark import runner_call, set_threads, time_interleaved  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.timing import PAUSE_S, SETTLE_CALLS  # noqa: E402

FIXED_S = 0.05  # the timer's pause before this change
MODES = {"fixed_50ms": (FIXED_S, False), "until_idle": (PAUSE_S, True)}
SHAPES = {"small_cnn": (3, 32, 32), "resnet50": (3, 224, 224)}
BUILDS = (  # (name, backend, precision)
    ("onnxruntime-fp32", "onnxruntime", "fp32"),
    ("onnxruntime-int8", "onnxruntime", "int8"),
    ("openvino-fp32", "openvino", "fp32"),
)


def _model(name: str) -> Any:
    from models import cnn, small

    return {"small_cnn": small.small_cnn, "resnet50": cnn.resnet50}[name]()


def _callers(name: str, work: Path, threads: int) -> dict[str, Callable[[], object]]:
    """Eager and each build of model `name`, every one ready to call on one batch-1 input."""
    import torch

    model = _model(name).eval()
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((1, *SHAPES[name])).astype(np.float32)} for _ in range(4)]
    onnx = work / f"{name}.onnx"
    example = (torch.from_numpy(feeds[0]["input"]),)
    torch.onnx.export(model, example, str(onnx), input_names=["input"], output_names=["output"], dynamo=False)
    x = example[0]

    def eager() -> object:
        with torch.no_grad():
            return model(x)

    callers: dict[str, Callable[[], object]] = {"eager": eager}
    for label, backend_name, precision in BUILDS:
        backend = get_backend(backend_name)
        target = Target(name=label, backend=backend_name, precision=precision)
        request = compile_request(
            target, onnx_path=onnx, out_dir=work / name / label, signature=[], feeds=feeds, threads=threads
        )
        callers[label] = runner_call(backend.load(backend.compile(request), threads), feeds[0])
    return callers


def _measure(callers: dict[str, Callable[[], object]], iterations: int, blocks: int) -> dict[str, Any]:
    p50: dict[str, dict[str, list[float]]] = {m: {n: [] for n in callers} for m in MODES}
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    for block in range(blocks):
        order = list(MODES) if block % 2 == 0 else list(reversed(MODES))
        for mode in order:
            pause_s, until_idle = MODES[mode]
            start = time.perf_counter()
            stats = time_interleaved(
                callers, 1, 2, iterations, pause_s=pause_s, settle=SETTLE_CALLS, until_idle=until_idle
            )
            wall[mode].append(time.perf_counter() - start)
            for n, s in stats.items():
                p50[mode][n].append(s.p50_ms)
    out: dict[str, Any] = {}
    for mode in MODES:
        eager = statistics.median(p50[mode]["eager"])
        out[mode] = {
            "block_wall_s": round(statistics.median(wall[mode]), 2),
            "runtimes": {
                n: {
                    "p50_ms": round(statistics.median(v), 3),
                    "p50_min_ms": round(min(v), 3),
                    "p50_max_ms": round(max(v), 3),
                    "speedup": round(eager / statistics.median(v), 3),
                }
                for n, v in p50[mode].items()
            },
        }
    fixed, idle = out["fixed_50ms"]["runtimes"], out["until_idle"]["runtimes"]
    out["until_idle_over_fixed"] = {
        "p50": {n: round(idle[n]["p50_ms"] / fixed[n]["p50_ms"], 3) for n in callers},
        "block_wall": round(out["until_idle"]["block_wall_s"] / out["fixed_50ms"]["block_wall_s"], 3),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="small_cnn,resnet50", help=f"comma-separated: {','.join(SHAPES)}")
    p.add_argument("--iterations", type=int, default=20, help="timed rounds per block")
    p.add_argument("--blocks", type=int, default=4, help="blocks per mode, the modes alternating")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    args = p.parse_args(argv)
    threads = set_threads()
    report: dict[str, Any] = {
        "machine": machine(threads),
        "settings": {
            "iterations": args.iterations,
            "blocks": args.blocks,
            "settle_calls": SETTLE_CALLS,
            "modes": {m: {"pause_s": s, "until_idle": i} for m, (s, i) in MODES.items()},
            "batch": 1,
        },
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="kompile-idle-pause-") as tmp:
        for name in args.models.split(","):
            callers = _callers(name, Path(tmp), threads)
            report["models"][name] = _measure(callers, args.iterations, args.blocks)
    emit_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
