"""Where a tuned TVM model's time goes against ONNX Runtime fp32's, convolution by convolution, at
each thread count given; prints JSON.

The model is exported as the other benchmarks do, built by kompile's `tvm` backend on this machine's
class's shared tuning database (`--tvm-trials 0`, the default, tunes nothing: what the fleet tuned
before is applied), then timed in rounds that alternate the two runtimes and the thread counts:

- TVM in its own environment's process (this file, `--worker`), each kernel timed in the model
  through the Relax VM's instrument hook (one Python callback around each kernel: a few
  microseconds of overhead per kernel, not in the whole-call figure);
- ONNX Runtime fp32 (the session options of kompile's `ort-fp32` artifacts), each node timed by its
  own profiler.

The convolutions of both (ResNet-50: 53 each) are paired by channels and image size, the n-th of a
shape with the n-th (the two run a block's branches in different orders), and reported with their
ratio: the medians over rounds of each one's per-round median. The whole-call medians are
uninstrumented. The CPU's instruction sets are printed beside the figures.

    python benchmarks/tvm_layers.py --models resnet50 --threads 1,2 --rounds 3 --calls 20 \
        --out benchmarks/results/tvm-layers-<date>-<cpu>.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
CONV_OPS = {"Conv", "FusedConv"}
"""ONNX Runtime's convolution nodes: `Conv` (its NCHWc one after layout optimization, activation and
residual add fused) and `FusedConv` (without the NCHWc layout)."""


def small_residual() -> Any:
    """A small residual CNN (a stem, a bottleneck whose shortcut is a 1x1 convolution, a head): the
    branches that the two runtimes may run in different orders, at a size a test can afford."""
    import torch

    class SmallResidual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            conv, relu = torch.nn.Conv2d, torch.nn.ReLU
            self.stem = torch.nn.Sequential(conv(3, 16, 3, padding=1), relu())
            self.main = torch.nn.Sequential(
                conv(16, 16, 1), relu(), conv(16, 16, 3, padding=1), relu(), conv(16, 32, 1)
            )
            self.shortcut = conv(16, 32, 1)
            self.head = torch.nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.stem(x)
            y = torch.relu(self.main(y) + self.shortcut(y))
            return self.head(y.mean(dim=(2, 3)))

    return SmallResidual()


def _small_feeds(rng: Any, batch: int) -> dict[str, Any]:
    import numpy as np

    return {"input": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}


def worker(model: str, feed: str, threads: int, warmup: int, calls: int) -> dict[str, Any]:
    """Runs in the tvm environment: the library at `model` on `threads` threads, timed whole and
    kernel by kernel (imports numpy and TVM only)."""
    os.environ["TVM_NUM_THREADS"] = str(threads)  # read once, when the runtime's pool starts
    import numpy as np
    import tvm
    from tvm import relax

    with np.load(feed) as data:
        args = [tvm.runtime.tensor(data[str(i)]) for i in range(len(data.files))]
    vm = relax.VirtualMachine(tvm.runtime.load_module(model), tvm.cpu())
    for _ in range(warmup):
        vm["main"](*args)
    whole = []
    for _ in range(calls):
        start = time.perf_counter()
        vm["main"](*args)
        whole.append(time.perf_counter() - start)
    kernels: list[tuple[str, str, float]] = []
    started: dict[str, float] = {}

    def instrument(_func: Any, name: str, before: bool, _ret: Any, *call: Any) -> None:
        if "conv2d" not in name:
            return
        if before:
            started[name] = time.perf_counter()
        else:
            key = kernel_key(name, [[int(d) for d in a.shape] for a in call])
            kernels.append((name, key, time.perf_counter() - started[name]))

    vm.set_instrument(instrument)
    for _ in range(calls):
        vm["main"](*args)
    vm.set_instrument(None)
    for _ in range(calls):  # whole calls again, after: the host's speed drifts
        start = time.perf_counter()
        vm["main"](*args)
        whole.append(time.perf_counter() - start)
    per_call = len(kernels) // calls
    return {
        "whole_ms": statistics.median(whole) * 1e3,
        "kernels": [
            [
                kernels[i][1],
                kernels[i][0],
                statistics.median(kernels[c * per_call + i][2] for c in range(calls)) * 1e3,
            ]
            for i in range(per_call)
        ],
    }


def ort_round(
    onnx_path: Path, feeds: dict[str, Any], threads: int, warmup: int, calls: int
) -> dict[str, Any]:
    """ONNX Runtime fp32 on `threads` threads: the whole call, then each convolution node (its
    profiler), in execution order."""
    from kompile.compile_jobs.backends.onnxruntime import OrtRunner

    plain = OrtRunner(onnx_path, threads)
    for _ in range(warmup):
        plain.run(feeds)
    whole = []
    for _ in range(calls):
        start = time.perf_counter()
        plain.run(feeds)
        whole.append(time.perf_counter() - start)
    del plain
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as tmp:
        # The same session options, its profiler on: a session of its own, as profiling slows calls.
        profiled = OrtRunner(onnx_path, threads, profile_prefix=Path(tmp) / "ort")
        for _ in range(warmup + calls):
            profiled.run(feeds)
        events = json.loads(Path(profiled.session.end_profiling()).read_text())
    nodes = [
        (
            _conv_key(
                _first_shape(e["args"]["input_type_shape"]), _first_shape(e["args"]["output_type_shape"])
            ),
            _shapes(e["args"]["input_type_shape"]),
            e["dur"] / 1e3,
        )
        for e in events
        if e.get("cat") == "Node"
        and e["name"].endswith("_kernel_time")
        and e.get("args", {}).get("op_name") in CONV_OPS
    ]
    per_call = len(nodes) // (warmup + calls)
    nodes = nodes[warmup * per_call :]
    return {
        "whole_ms": statistics.median(whole) * 1e3,
        "kernels": [
            [nodes[i][0], nodes[i][1], statistics.median(nodes[c * per_call + i][2] for c in range(calls))]
            for i in range(per_call)
        ],
    }


def _conv_key(inp: list[int], out: list[int]) -> str:
    """'64@56x56 -> 256@56x56': a convolution's input and output channels and image sizes, from
    NCHW or blocked NCHW{c}c shapes (TVM's kernels and ONNX Runtime's nodes alike)."""

    def part(shape: list[int]) -> str:
        channels = shape[1] * shape[4] if len(shape) == 5 else shape[1]
        return f"{channels}@{shape[2]}x{shape[3]}"

    return f"{part(inp)} -> {part(out)}"


def kernel_key(name: str, shapes: list[list[int]]) -> str:
    """A TVM convolution kernel's pairing key from its arguments' shapes: input first, output last,
    both blocked (N, C/c, H, W, c). A kernel that writes into its residual (`..._inplace<k>`) has no
    output argument: argument k, the residual, has the output's shape."""
    written = re.search(r"_inplace(\d+)$", name)
    return _conv_key(shapes[0], shapes[int(written.group(1))] if written else shapes[-1])


def _first_shape(types: list[dict[str, list[int]]]) -> list[int]:
    """The first tensor's shape in ORT's profile's `input_type_shape` / `output_type_shape`."""
    return list(next(iter(types[0].values())))


def _shapes(inputs: list[dict[str, list[int]]]) -> str:
    """'1x64x56x56 * 256x64x1x1': a convolution's input and weight shapes from ORT's profile."""
    return " * ".join("x".join(map(str, _first_shape([i]))) for i in inputs[:2])


def build_tvm(
    case: Any, feeds: dict[str, Any], work: Path, threads: int, options: dict[str, str]
) -> tuple[Path, Path, dict[str, Any]]:
    """The ONNX export, the tvm library built from it on the class's shared database at `feeds`'
    static shapes, and the build's record."""
    from cpu_artifacts import build, export, feed_signature

    from kompile.api.spec import Target
    from kompile.compile_jobs.backends.base import get_backend
    from kompile.compile_jobs.build import compile_request

    model = build(case).eval()
    onnx_path = work / f"{case.name}.onnx"
    export(case, model, onnx_path)
    backend = get_backend("tvm")
    target = Target(name="tvm-tuned", backend="tvm", precision="fp32", options=options)
    request = compile_request(
        target,
        module=model,
        onnx_path=onnx_path,
        out_dir=work / "tvm",
        signature=feed_signature(case, feeds),
        feeds=[feeds],
        threads=threads,
    )
    start = time.perf_counter()
    artifact = backend.compile(request)
    record = {"compile_s": round(time.perf_counter() - start, 1), "options": artifact.options}
    return onnx_path, artifact.model_path, record


def tvm_round(model: Path, feed: Path, threads: int, warmup: int, calls: int) -> dict[str, Any]:
    """One worker process (a fresh runtime pool at `threads`) in the tvm environment."""
    from kompile.compile_jobs.backends.base import BackendError
    from kompile.compile_jobs.environments import find_environment

    try:
        python = find_environment("tvm") / "bin" / "python"
    except BackendError as err:  # EnvironmentMissing: says how to build it
        raise SystemExit(str(err)) from err
    argv = [str(python), __file__, "--worker", str(model), str(feed), str(threads), str(warmup), str(calls)]
    out = subprocess.run(
        argv, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": ""}
    )
    if out.returncode:
        raise SystemExit(f"the tvm worker failed (rc {out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _paired(ort_k: list[list[list[Any]]], tvm_k: list[list[list[Any]]]) -> list[dict[str, Any]] | str:
    """Each ONNX Runtime convolution beside TVM's kernel with the same key (channels and image
    sizes), the n-th of a key with the n-th (the runtimes order a block's branches differently);
    each time the median over rounds. A string saying why where the two do not pair."""
    keys_o, keys_t = [k[0] for k in ort_k[0]], [k[0] for k in tvm_k[0]]
    if sorted(keys_o) != sorted(keys_t):
        return f"ONNX Runtime ran {len(keys_o)} convolutions, TVM {len(keys_t)}, not of the same shapes"
    layers = []
    for i, key in enumerate(keys_o):
        nth = keys_o[: i + 1].count(key) - 1
        j = [m for m, k in enumerate(keys_t) if k == key][nth]
        o = statistics.median(run[i][2] for run in ort_k)
        t = statistics.median(run[j][2] for run in tvm_k)
        layers.append(
            {
                "convolution": key,
                "shapes": ort_k[0][i][1],
                "tvm_kernel": tvm_k[0][j][1],
                "ort_ms": round(o, 3),
                "tvm_ms": round(t, 3),
                "ratio": round(t / o, 2),
            }
        )
    return layers


def report(rounds: list[dict[str, Any]], threads: list[int]) -> dict[str, Any]:
    """Per thread count: whole-call medians and the paired convolutions (medians over rounds)."""
    out: dict[str, Any] = {}
    for th in threads:
        mine = [r for r in rounds if r["threads"] == th]
        ort_k, tvm_k = [r["ort"]["kernels"] for r in mine], [r["tvm"]["kernels"] for r in mine]
        entry: dict[str, Any] = {
            "ort_whole_ms": round(statistics.median(r["ort"]["whole_ms"] for r in mine), 2),
            "tvm_whole_ms": round(statistics.median(r["tvm"]["whole_ms"] for r in mine), 2),
            "ort_whole_ms_rounds": [round(r["ort"]["whole_ms"], 2) for r in mine],
            "tvm_whole_ms_rounds": [round(r["tvm"]["whole_ms"], 2) for r in mine],
        }
        entry["tvm_over_ort_whole"] = round(entry["tvm_whole_ms"] / entry["ort_whole_ms"], 3)
        layers = _paired(ort_k, tvm_k)
        if isinstance(layers, str):
            entry["unpaired"] = layers
            out[str(th)] = entry
            continue
        entry["conv_sum_ms"] = {
            "ort": round(sum(lay["ort_ms"] for lay in layers), 2),
            "tvm": round(sum(lay["tvm_ms"] for lay in layers), 2),
        }
        entry["layers"] = layers
        out[str(th)] = entry
    if len(threads) > 1 and all("layers" in out[str(t)] for t in threads):
        one, many = out[str(threads[0])]["layers"], out[str(threads[-1])]["layers"]
        # How each runtime's convolutions speed up from the first thread count to the last.
        out["scaling_median"] = {"from_to": [threads[0], threads[-1]]} | {
            rt: round(
                statistics.median(a[f"{rt}_ms"] / b[f"{rt}_ms"] for a, b in zip(one, many, strict=True)), 2
            )
            for rt in ("ort", "tvm")
        }
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(ROOT)]
    import numpy as np
    from cpu_artifacts import CASES, ModelCase, emit_json, machine

    from kompile.compile_jobs.backends.base import BackendError
    from kompile.compile_jobs.envs import write_arrays

    cases = {
        **CASES,
        "small_residual": ModelCase(
            "small_residual", "tvm_layers:small_residual", ["input"], "logits", _small_feeds, {}
        ),
    }
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50", help=f"comma-separated: {','.join(cases)}")
    p.add_argument(
        "--threads", default="1,2", help="thread counts, comma-separated (TVM is built for the last)"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=20, help="timed calls of each runtime a round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--tvm-trials", default="0", help="trials tuned before the build (0: the database as it is)"
    )
    p.add_argument("--tvm-minutes", default="30")
    p.add_argument(
        "--tvm-scope",
        choices=["missing", "all"],
        default="missing",
        help="tasks tuned: those the database lacks, or all of them from the database's best",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if unknown := [m for m in args.models.split(",") if m not in cases]:
        p.error(f"unknown model(s) {unknown}; choose from {list(cases)}")
    doc: dict[str, Any] = {"machine": machine(threads[-1]), "models": []}
    options = {
        "tuningTrials": args.tvm_trials,
        "tuningMinutes": args.tvm_minutes,
        "tuningScope": args.tvm_scope,
        "weightLayout": "prepacked",
    }
    with tempfile.TemporaryDirectory(prefix="tvm-layers-") as tmp:
        for name in args.models.split(","):
            case, work = cases[name], Path(tmp) / name
            work.mkdir()
            feeds = case.make(np.random.default_rng(0), 1)
            try:
                onnx_path, library, record = build_tvm(case, feeds, work, threads[-1], options)
            except BackendError as err:  # the tvm environment missing, or the build refused
                raise SystemExit(f"{name}: the tvm build failed: {err}") from err
            feed_file = work / "feed.npz"
            write_arrays(str(feed_file), [feeds[n] for n in case.inputs])
            rounds = []
            for r in range(args.rounds):
                for th in threads:
                    ort_r = ort_round(onnx_path, feeds, th, args.warmup, args.calls)
                    tvm_r = tvm_round(library, feed_file, th, args.warmup, args.calls)
                    rounds.append({"round": r, "threads": th, "ort": ort_r, "tvm": tvm_r})
                    ort_ms, tvm_ms = ort_r["whole_ms"], tvm_r["whole_ms"]
                    print(
                        f"round {r} threads {th}: ORT {ort_ms:.1f} ms, TVM {tvm_ms:.1f} ms", file=sys.stderr
                    )
            doc["models"].append({"model": name, "tvm_build": record, "by_threads": report(rounds, threads)})
    doc["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    emit_json(doc, args.out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        model, feed, threads, warmup, calls = sys.argv[2:7]
        print(json.dumps(worker(model, feed, int(threads), int(warmup), int(calls))))
        raise SystemExit(0)
    raise SystemExit(main())
