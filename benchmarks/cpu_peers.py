"""kompile's selected CPU artifact against the peers a user would pick instead, in one interleaved
run per model and batch size; prints JSON.

Peers, each with the settings a user gets by default: eager PyTorch, torch.compile, plain OpenVINO
(f32, bf16 where the CPU has it, NNCF int8 with default settings), plain ONNX Runtime (its default
optimization level, `quantize_dynamic` int8 with defaults). kompile: each CPU candidate `auto`
offers at fp32, int8 and bf16 (ONNX Runtime and OpenVINO artifacts as the pipeline builds them;
inductor is left out here, it ran 1.0x eager on BERT-base and takes a minute to build), and its
selection: the fastest that validated, per batch size. Every runtime is validated against eager
with kompile's thresholds for its precision.

    python benchmarks/cpu_peers.py --models resnet50,bert_base --batch-sizes 1,8 --out /tmp/peers.json
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_artifacts import (
    Caller,
    ModelCase,
    add_torch_compile,
    build,
    export,
    runner_call,
    time_batch,
    torch_call,
    validation_figures,
)

from kompile.api.spec import Precision, Target
from kompile.compile_jobs.backends.base import Feeds, get_backend
from kompile.compile_jobs.build import compile_request
from kompile.compile_jobs.hardware import has_fast_bf16

Array = np.ndarray[Any, Any]
KOMPILE_PREFIX = "kompile/"


class PlainRunner:
    """A peer runtime called the way its own docs show, outputs as numpy arrays."""

    def __init__(self, fn: Any, names: list[str]) -> None:
        self.fn, self.names = fn, names

    def run(self, feeds: Feeds) -> list[Array]:
        return [np.asarray(o) for o in self.fn({n: feeds[n] for n in self.names})]


def plain_openvino(onnx_path: Path, feeds: list[Feeds], threads: int) -> dict[str, tuple[PlainRunner, str]]:
    """OpenVINO as its quick start shows: convert, compile for CPU, NNCF int8 with defaults."""
    import nncf
    import openvino as ov

    core = ov.Core()
    model = ov.convert_model(str(onnx_path))
    names = [p.get_any_name() for p in model.inputs]
    base = {"INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY"}
    out: dict[str, tuple[PlainRunner, str]] = {}
    hints = [("f32", "fp32")] + ([("bf16", "bf16")] if has_fast_bf16() else [])
    for hint, precision in hints:
        compiled = core.compile_model(model, "CPU", {**base, "INFERENCE_PRECISION_HINT": hint})
        out[f"openvino-{hint}"] = (PlainRunner(_ov_call(compiled), names), precision)
    quantized = nncf.quantize(model, nncf.Dataset(feeds, lambda f: {n: f[n] for n in names}))
    compiled = core.compile_model(quantized, "CPU", base)
    out["openvino-int8-nncf"] = (PlainRunner(_ov_call(compiled), names), "int8")
    return out


def _ov_call(compiled: Any) -> Any:
    request = compiled.create_infer_request()
    return lambda inputs: [np.array(v) for v in request.infer(inputs).values()]


def plain_onnxruntime(onnx_path: Path, work: Path, threads: int) -> dict[str, tuple[PlainRunner, str]]:
    """ONNX Runtime with default session options and quantize_dynamic's defaults."""
    import onnxruntime as ort
    from onnxruntime.quantization import quantize_dynamic

    dynamic = work / "plain-ort-int8.onnx"
    quantize_dynamic(str(onnx_path), str(dynamic))
    out: dict[str, tuple[PlainRunner, str]] = {}
    for name, path, precision in (
        ("onnxruntime", onnx_path, "fp32"),
        ("onnxruntime-int8-dynamic", dynamic, "int8"),
    ):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        out[name] = (PlainRunner(partial(session.run, None), names), precision)
    return out


def kompile_artifacts(
    case: ModelCase, onnx_path: Path, out: Path, threads: int, feeds: list[Feeds]
) -> dict[str, tuple[Any, str]]:
    """What auto builds on this CPU class (ONNX Runtime and OpenVINO), through kompile's backends."""
    plans: list[tuple[str, Precision]] = [
        ("onnxruntime", "fp32"),
        ("onnxruntime", "int8"),
        ("openvino", "fp32"),
        ("openvino", "int8"),
    ]
    if has_fast_bf16():
        plans.append(("openvino", "bf16"))
    built: dict[str, tuple[Any, str]] = {}
    for backend_name, precision in plans:
        target = Target(name=f"{backend_name}-{precision}", backend=backend_name, precision=precision)
        request = compile_request(
            target, onnx_path=onnx_path, out_dir=out / target.name, signature=[], feeds=feeds, threads=threads
        )
        backend = get_backend(backend_name)
        artifact = backend.compile(request)
        built[f"{KOMPILE_PREFIX}{target.name}"] = (backend.load(artifact, threads), precision)
    return built


def run_case(case: ModelCase, args: argparse.Namespace, work: Path, threads: int) -> dict[str, Any]:
    model = build(case)
    onnx_path = work / f"{case.name}.onnx"
    report: dict[str, Any] = {"model": case.name, "export_s": round(export(case, model, onnx_path), 2)}
    rng = np.random.default_rng(args.seed)
    feeds = [case.make(rng, 2) for _ in range(args.samples)]
    reference = [[torch_call(model, f)()] for f in feeds]
    runtimes: dict[str, dict[str, Any]] = {"eager": {}}
    callers: dict[str, Caller] = {"eager": partial(torch_call, model)}
    if args.torch_compile:
        add_torch_compile(model, case, feeds, reference, runtimes, callers)
    groups = [
        lambda: plain_openvino(onnx_path, feeds, threads),
        lambda: plain_onnxruntime(onnx_path, work, threads),
        lambda: kompile_artifacts(case, onnx_path, work / case.name, threads, feeds),
    ]
    for group in groups:
        start = time.perf_counter()
        for name, (runner, precision) in group().items():
            cand = [runner.run(f) for f in feeds]
            runtimes[name] = {
                "precision": precision,
                "validation": validation_figures(reference, cand, [case.output], precision),
            }
            callers[name] = partial(runner_call, runner)
        for name in runtimes:
            runtimes[name].setdefault("build_s_group", round(time.perf_counter() - start, 1))
    report["runtimes"] = runtimes
    report["latency"], report["discarded_rounds"] = {}, {}
    for batch in args.batch_sizes:
        stats, discarded = time_batch(case, callers, batch, args)
        report["latency"][str(batch)] = stats
        report["discarded_rounds"][str(batch)] = discarded
    report["verdict"] = verdict(report)
    return report


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Per batch size: kompile's selection (its fastest validated artifact) and the best validated peer."""
    out: dict[str, Any] = {}
    ok = {n for n, r in report["runtimes"].items() if n != "eager" and r["validation"]["passed"]}
    for batch, stats in report["latency"].items():
        mine = [n for n in ok if n.startswith(KOMPILE_PREFIX)]
        peers = [n for n in ok if not n.startswith(KOMPILE_PREFIX)]
        pick = min(mine, key=lambda n: stats[n]["p50_ms"]) if mine else None
        peer = min(peers, key=lambda n: stats[n]["p50_ms"]) if peers else None
        out[batch] = {
            "kompile_selected": pick,
            "kompile_p50_ms": round(stats[pick]["p50_ms"], 3) if pick else None,
            "best_peer": peer,
            "best_peer_p50_ms": round(stats[peer]["p50_ms"], 3) if peer else None,
            "kompile_vs_best_peer": round(stats[peer]["p50_ms"] / stats[pick]["p50_ms"], 3)
            if pick and peer
            else None,
            "speedup_over_eager": stats[pick]["speedup"] if pick else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    import cpu_artifacts

    return cpu_artifacts.main(argv, case_runner=run_case)


if __name__ == "__main__":
    raise SystemExit(main())
