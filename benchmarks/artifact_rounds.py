"""Saved CPU artifacts timed against each other, each in a fresh process per round; prints JSON.

ONNX models (`.onnx`) run with ONNX Runtime in this environment (all graph optimizations, the given
threads), TVM libraries (`.so`) with the Relax VM in the tvm environment (TVM_NUM_THREADS). Each round
starts one process per artifact, one at a time and in a rotated order: it loads the artifact, warms
it, then times `--calls` calls (each after `--pause-ms` idle and one untimed call, as
benchmarks/cpu_artifacts.py does); the round's median counts. The figures: the median of the rounds'
medians, their p10-p90, each artifact's ratio to the first one named, and the median of its
per-round ratios to the first (paired within a round) with the rounds it was faster in.

Why fresh processes, one at a time: TVM's runtime pool keeps spinning after a call, and runtimes
loaded in one process or run side by side slow each other; the pipeline's benchmarks time every
runtime of a model in the same rounds of one process, which on a 2-core machine moved TVM's median
by several percent from run to run.

    python benchmarks/artifact_rounds.py --rounds 16 --calls 30 --threads 2 \\
        ort=work/resnet50/ort-fp32/model.onnx tvm=work/resnet50/tvm-tuned/model.so
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT.parent)]


def worker(kind: str, path: str, calls: int, pause_ms: float, shape: list[int]) -> list[float]:
    """One process's timed calls (ms) of one artifact; imports only numpy and its runtime."""
    import numpy as np

    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    if kind == "tvm":
        import tvm
        from tvm.runtime.vm import VirtualMachine

        vm = VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
        arg = tvm.runtime.tensor(x)

        def call() -> Any:
            return vm["main"](arg)
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ["KOMPILE_ROUNDS_THREADS"])
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}

        def call() -> Any:
            return session.run(None, feed)

    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        time.sleep(pause_ms / 1e3)
        call()  # settles the threads after the pause
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _kind(path: Path) -> str:
    if path.suffix == ".so":
        return "tvm"
    if path.suffix == ".onnx":
        return "ort"
    raise ValueError(f"{path}: give an .onnx model (ONNX Runtime) or a TVM .so")


def _python(kind: str) -> str:
    """The interpreter that runs an artifact of this kind (the tvm environment's for TVM libraries)."""
    if kind != "tvm":
        return sys.executable
    from kompile.compile_jobs.environments import find_environment

    return str(find_environment("tvm") / "bin" / "python")


Artifact = tuple[str, Path, str, str]
"""name, path, kind (tvm | ort) and the interpreter that runs it."""


def spread(values: list[float]) -> tuple[float, float]:
    """p10 and p90 of the rounds' medians. Inclusive: the default (exclusive) method extrapolates
    past the data when there are fewer rounds than deciles, down to a negative p10."""
    if len(values) < 2:
        return values[0], values[0]
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return deciles[0], deciles[-1]


def measure(args: argparse.Namespace, artifacts: list[Artifact]) -> dict[str, Any]:
    from cpu_artifacts import isa

    medians: dict[str, list[float]] = {name: [] for name, *_ in artifacts}
    env = {**os.environ, "TVM_NUM_THREADS": str(args.threads), "KOMPILE_ROUNDS_THREADS": str(args.threads)}
    shape = ",".join(str(d) for d in args.input_shape)
    loads = []
    for r in range(args.rounds):
        order = artifacts[r % len(artifacts) :] + artifacts[: r % len(artifacts)]
        for name, path, kind, python in order:
            cmd = [python, str(Path(__file__).resolve()), "--worker", kind, str(path)]
            cmd += ["--calls", str(args.calls), "--pause-ms", str(args.pause_ms), "--input-shape", shape]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"{name} failed in round {r}: {done.stderr.strip()[-2000:]}")
            medians[name].append(statistics.median(json.loads(done.stdout.strip().splitlines()[-1])))
        loads.append(round(os.getloadavg()[0], 2))
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:.2f}" for n, v in medians.items()), file=sys.stderr)
    reference = medians[artifacts[0][0]]
    first = statistics.median(reference)
    report: dict[str, Any] = {}
    for name, path, *_ in artifacts:
        values = medians[name]
        p10, p90 = spread(values)
        # Each round's ratio to the first artifact's in that round: a host's drift falls on both.
        paired = [v / ref for v, ref in zip(values, reference, strict=True)]
        report[name] = {
            "artifact": str(path),
            "p50_ms": round(statistics.median(values), 4),
            "p10_ms": round(p10, 4),
            "p90_ms": round(p90, 4),
            "ratio_to_first": round(statistics.median(values) / first, 4),
            "paired_ratio_to_first": round(statistics.median(paired), 4),
            "rounds_faster_than_first": sum(1 for r in paired if r < 1),
            "round_medians_ms": [round(v, 4) for v in values],
        }
    return {
        "machine": {"isa": isa(), "threads": args.threads, "load_average_per_round": loads},
        "settings": {
            "rounds": args.rounds,
            "calls": args.calls,
            "pause_ms": args.pause_ms,
            "input_shape": args.input_shape,
            "p50": "median over rounds of each round's median call; a fresh process per artifact and round",
        },
        "artifacts": report,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("artifacts", nargs="*", help="name=path (.onnx or .so), the first the reference")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--pause-ms", type=float, default=100.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--input-shape", type=lambda s: [int(d) for d in s.split(",")], default=[1, 3, 224, 224])
    p.add_argument("--worker", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.calls, args.pause_ms, args.input_shape)))
        return 0
    from kompile.compile_jobs.environments import EnvironmentMissing

    artifacts: list[Artifact] = []
    for item in args.artifacts:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            p.error(f"{item!r}: give name=path of an existing .onnx or .so")
        # Checked before any round runs: a bad artifact or a missing environment wastes none.
        try:
            kind = _kind(Path(path))
            artifacts.append((name, Path(path), kind, _python(kind)))
        except (ValueError, EnvironmentMissing) as err:
            p.error(str(err))
    if not artifacts:
        p.error("name at least one artifact")
    text = json.dumps(measure(args, artifacts), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
