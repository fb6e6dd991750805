"""Eager PyTorch vs torch.compile vs each ONNX Runtime artifact on this machine's CPU; prints JSON.

For each example model and batch size: p50/p90/p99 latency, throughput, speedup over eager (eager
p50 / runtime p50, every runtime timed in the same interleaved rounds) and the validation figures of
each artifact against the eager model. Works on its own (export, compile, validate, time):

    python benchmarks/cpu_artifacts.py --models resnet50,bert_base --batch-sizes 1,8 --out /tmp/cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

from kompile.api.spec import InputSpec, Precision, Target  # noqa: E402
from kompile.api.vocabulary import Quantization  # noqa: E402
from kompile.compile_jobs import benchmark  # noqa: E402
from kompile.compile_jobs.backends.base import Feeds, Runner, get_backend  # noqa: E402
from kompile.compile_jobs.benchmark import QuietRounds, set_threads, time_interleaved  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.validate import compare, resolve_thresholds  # noqa: E402

Array = np.ndarray[Any, Any]
SEQ = 128
# (target name, precision, quantization): the artifacts built for every model.
ARTIFACTS: list[tuple[str, Precision, Quantization | None]] = [
    ("ort-fp32", "fp32", None),
    ("ort-int8-dynamic", "int8", "dynamic"),
    ("ort-int8-static", "int8", "static"),
]


@dataclass
class ModelCase:
    """An example model with its input generator and export signature."""

    name: str
    factory: str
    inputs: list[str]
    output: str
    make: Callable[[np.random.Generator, int], Feeds]
    dynamic: dict[str, dict[int, str]] = field(default_factory=dict)
    dynamo: bool = False  # exported as users now do: torch.onnx.export(dynamo=True)


def image_feeds(rng: np.random.Generator, batch: int) -> Feeds:
    return {"input": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}


def token_feeds(rng: np.random.Generator, batch: int) -> Feeds:
    mask = np.ones((batch, SEQ), dtype=np.int64)
    for row in range(1, batch):  # right padding of varying length on all but the first row
        mask[row, int(rng.integers(SEQ // 2, SEQ)) :] = 0
    return {"input_ids": rng.integers(0, 30522, (batch, SEQ)).astype(np.int64), "attention_mask": mask}


CASES = {
    "resnet50": ModelCase(
        "resnet50",
        "models.cnn:resnet50",
        ["input"],
        "logits",
        image_feeds,
        {"input": {0: "batch"}, "logits": {0: "batch"}},
    ),
    "bert_base": ModelCase(
        "bert_base",
        "models.transformer:bert_base",
        ["input_ids", "attention_mask"],
        "last_hidden_state",
        token_feeds,
        {
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "last_hidden_state": {0: "batch", 1: "seq"},
        },
    ),
}


def feed_signature(case: ModelCase, feed: Feeds) -> list[InputSpec]:
    """`case`'s inputs at `feed`'s own shapes and dtypes."""
    return [
        InputSpec.model_validate({"name": n, "shape": list(feed[n].shape), "dtype": str(feed[n].dtype)})
        for n in case.inputs
    ]


def build(case: ModelCase) -> Any:
    import importlib

    module, fn = case.factory.split(":")
    return getattr(importlib.import_module(module), fn)()


def export(case: ModelCase, model: Any, path: Path) -> float:
    """TorchScript-based exporter, opset 17, dynamic batch (and sequence) axes; the dynamo exporter
    (its default opset, the same axes) for a case marked `dynamo`."""
    import torch

    example = tuple(torch.from_numpy(a) for a in case.make(np.random.default_rng(0), 1).values())
    auto = torch.export.Dim.AUTO  # ranges (a sequence up to the position table) as the model has them
    how: dict[str, Any] = (
        {
            "dynamic_shapes": {n: dict.fromkeys(case.dynamic[n], auto) for n in case.inputs},
            "external_data": False,
            "verbose": False,
        }
        if case.dynamo
        else {"dynamic_axes": case.dynamic, "opset_version": 17}
    )
    start = time.perf_counter()
    # The dynamo exporter prints its progress: stderr, as stdout carries this script's JSON.
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
        torch.onnx.export(
            model,
            example,
            str(path),
            input_names=case.inputs,
            output_names=[case.output],
            dynamo=case.dynamo,
            **how,
        )
    return time.perf_counter() - start


def torch_call(model: Any, feeds: Feeds) -> Callable[[], Array]:
    import torch

    args = [torch.from_numpy(a) for a in feeds.values()]

    def run() -> Array:
        with torch.no_grad():
            out: Array = model(*args).numpy()
        return out

    return run


def runner_call(runner: Runner, feeds: Feeds) -> Callable[[], object]:
    return benchmark.runner_call(runner, feeds)


def validation_figures(
    ref: list[list[Array]], cand: list[list[Array]], names: list[str], precision: str
) -> dict[str, Any]:
    result = compare(ref, cand, names, resolve_thresholds(precision))
    out = result.outputs[0]
    return {
        "passed": result.passed,
        "max_abs_error": out.max_abs_error,
        "max_rel_error": out.max_rel_error,
        "cosine": out.cosine,
        "top_k_agreement": out.top_k_agreement,
        "failures": result.failures,
        "thresholds": result.thresholds.model_dump(exclude_none=True),
    }


Caller = Callable[[Feeds], Callable[[], object]]


@dataclass
class CaseRun:
    """One model's run: its export, reference inputs and outputs, and the runtimes timed so far."""

    case: ModelCase
    args: argparse.Namespace
    work: Path
    threads: int
    model: Any
    onnx_path: Path
    report: dict[str, Any]
    feeds: list[Feeds]
    reference: list[list[Array]]
    runtimes: dict[str, dict[str, Any]]
    callers: dict[str, Caller]


def measure_case(
    case: ModelCase,
    args: argparse.Namespace,
    work: Path,
    threads: int,
    add_runtimes: Callable[[CaseRun], None],
    reference_batch: int = 2,
) -> dict[str, Any]:
    """Export, compute the eager reference (and torch.compile) on `args.samples` inputs of
    `reference_batch` rows, let `add_runtimes` build and validate the runtimes of this benchmark,
    then time them all interleaved with eager."""
    model = build(case)
    onnx_path = work / f"{case.name}.onnx"
    report: dict[str, Any] = {"model": case.name, "export_s": round(export(case, model, onnx_path), 2)}
    rng = np.random.default_rng(args.seed)
    feeds = [case.make(rng, reference_batch) for _ in range(args.samples)]
    reference = [[torch_call(model, f)()] for f in feeds]
    runtimes: dict[str, dict[str, Any]] = {"eager": {}}
    callers: dict[str, Caller] = {"eager": partial(torch_call, model)}
    if args.torch_compile:
        add_torch_compile(model, case, feeds, reference, runtimes, callers)
    add_runtimes(
        CaseRun(case, args, work, threads, model, onnx_path, report, feeds, reference, runtimes, callers)
    )
    report["runtimes"] = runtimes
    report["latency"], report["discarded_rounds"] = {}, {}
    for batch in args.batch_sizes:
        stats, discarded = time_batch(case, callers, batch, args)
        report["latency"][str(batch)] = stats
        report["discarded_rounds"][str(batch)] = discarded
    return report


def add_run_artifacts(run: CaseRun, artifacts: list[Spec]) -> None:
    """add_artifacts for one case's run: its ONNX export, folder, threads and reference."""
    add_artifacts(
        artifacts,
        run.onnx_path,
        run.work / run.case.name,
        run.threads,
        run.feeds,
        run.reference,
        run.runtimes,
        run.callers,
    )


def run_case(case: ModelCase, args: argparse.Namespace, work: Path, threads: int) -> dict[str, Any]:
    """Export, build every runtime, validate each against eager, then time them all interleaved."""

    def ort_artifacts(run: CaseRun) -> None:
        artifacts = [
            (n, p, q, {}) for n, p, q in ARTIFACTS if not args.only or n in args.only
        ] + args.artifact
        add_run_artifacts(run, artifacts)

    report = measure_case(case, args, work, threads, ort_artifacts)
    report["best"] = best_validated(report)
    return report


def add_torch_compile(
    model: Any,
    case: ModelCase,
    feeds: list[Feeds],
    reference: list[list[Array]],
    runtimes: dict[str, dict[str, Any]],
    callers: dict[str, Caller],
) -> None:
    import torch

    compiled = torch.compile(model)
    start = time.perf_counter()  # first calls compile; a new batch size recompiles during warm-up
    cand = [[torch_call(compiled, f)()] for f in feeds]
    runtimes["torch.compile"] = {
        "compile_s": round(time.perf_counter() - start, 2),
        "validation": validation_figures(reference, cand, [case.output], "fp32"),
    }
    callers["torch.compile"] = partial(torch_call, compiled)


Spec = tuple[str, Precision, Quantization | None, dict[str, str]]


def parse_artifact(text: str) -> Spec:
    """name=precision[/quantization][:key=value,key=value]: an extra ONNX Runtime artifact."""
    name, _, rest = text.partition("=")
    kind, _, opts = rest.partition(":")
    precision, _, quantization = kind.partition("/")
    options = dict(kv.split("=", 1) for kv in opts.split(",") if kv)
    return name, precision, quantization or None, options  # type: ignore[return-value]


def add_artifacts(
    artifacts: list[Spec],
    onnx_path: Path,
    out: Path,
    threads: int,
    feeds: list[Feeds],
    reference: list[list[Array]],
    runtimes: dict[str, dict[str, Any]],
    callers: dict[str, Caller],
) -> None:
    """Build, load and validate each ONNX Runtime artifact (the reference inputs calibrate static int8)."""
    backend = get_backend("onnxruntime")
    for name, precision, quantization, options in artifacts:
        target = Target(
            name=name, backend="onnxruntime", precision=precision, quantization=quantization, options=options
        )
        start = time.perf_counter()
        request = compile_request(
            target, onnx_path=onnx_path, out_dir=out / name, signature=[], feeds=feeds, threads=threads
        )
        artifact = backend.compile(request)
        runner = backend.load(artifact, threads)
        cand = [runner.run(f) for f in feeds]
        runtimes[name] = {
            "compile_s": round(time.perf_counter() - start, 2),
            "bytes": sum(path.stat().st_size for path, _ in artifact.files()),
            "options": artifact.options,
            "validation": validation_figures(reference, cand, runner.output_names, precision),
        }
        callers[name] = partial(runner_call, runner)


def time_batch(
    case: ModelCase, callers: dict[str, Caller], batch: int, args: argparse.Namespace
) -> tuple[dict[str, Any], int]:
    """Latency figures and speedup over eager of every runtime at one batch size; rounds dropped."""
    feeds = case.make(np.random.default_rng(batch), batch)
    fns = {n: c(feeds) for n, c in callers.items()}
    quiet = QuietRounds(max_foreign_cores=args.max_foreign_cores) if args.max_foreign_cores >= 0 else None
    pause = args.pause_ms / 1000
    stats = time_interleaved(
        fns, batch, args.warmup, args.iterations, pause_s=pause, quiet=quiet, settle=args.settle
    )
    eager_p50 = stats["eager"].p50_ms
    figures = {
        n: {**s.model_dump(exclude={"batch_size"}), "speedup": round(eager_p50 / s.p50_ms, 3)}
        for n, s in stats.items()
    }
    return figures, quiet.discarded if quiet else 0


def best_validated(report: dict[str, Any]) -> dict[str, Any]:
    """Per batch size: the fastest runtime (besides eager) whose validation passed."""
    out: dict[str, Any] = {}
    for batch, stats in report["latency"].items():
        ok = [
            n for n, r in report["runtimes"].items() if n != "eager" and r.get("validation", {}).get("passed")
        ]
        if ok:
            name = min(ok, key=lambda n: stats[n]["p50_ms"])
            out[batch] = {
                "runtime": name,
                "p50_ms": round(stats[name]["p50_ms"], 2),
                "speedup": stats[name]["speedup"],
            }
    return out


def machine(threads: int) -> dict[str, Any]:
    import onnxruntime
    import torch

    from kompile.compile_jobs.backends.onnxruntime import cpu_features
    from kompile.compile_jobs.hardware import cpu_description

    return {
        "cpu": cpu_description(),
        "cpu_features": cpu_features(),
        "isa": isa(),
        "threads": threads,
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def isa() -> str:
    """The vector and matrix extensions /proc/cpuinfo reports (what int8 and bf16 kernels pick from)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "unknown"
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith(("flags", "Features"))), [])
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "asimddp", "sve")
    return " ".join(f for f in flags if f in wanted or f.startswith("amx"))


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """How the figures were taken, printed beside them."""
    return {
        "iterations": args.iterations,
        "warmup": args.warmup,
        "seq_len": SEQ,
        "pause_ms": args.pause_ms,
        "settle_calls": args.settle,
        "max_foreign_cores": args.max_foreign_cores,
        "speedup": "eager p50 / runtime p50, interleaved rounds in one run",
    }


def emit_json(doc: Any, out: Path | None) -> None:
    """The report on stdout, and in `out` too when given."""
    text = json.dumps(doc, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="resnet50,bert_base", help=f"comma-separated: {','.join(CASES)}")
    p.add_argument("--batch-sizes", default="1,8", type=lambda s: [int(b) for b in s.split(",")])
    p.add_argument("--iterations", type=int, default=20, help="timed rounds per batch size")
    p.add_argument("--warmup", type=int, default=3)
    # ONNX Runtime's idle workers spin for 20-50 ms and slow whatever runs next: wait them out.
    p.add_argument("--pause-ms", type=float, default=100.0, help="idle time before each timed call")
    p.add_argument("--settle", type=int, default=1, help="untimed calls right before each timed one")
    p.add_argument(
        "--max-foreign-cores",
        type=float,
        default=0.25,
        help="drop rounds during which other processes used more CPU than this (negative: keep all)",
    )
    p.add_argument("--samples", type=int, default=4, help="reference inputs (batch 2 each) to validate on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="default: every core this process may use")
    p.add_argument("--no-torch-compile", dest="torch_compile", action="store_false")
    p.add_argument(
        "--only", type=lambda s: s.split(","), default=None, help="build only these standard artifacts"
    )
    p.add_argument(
        "--artifact",
        type=parse_artifact,
        action="append",
        default=[],
        help="extra artifact: name=precision[/quantization][:key=value,...] (ONNX Runtime options)",
    )
    p.add_argument("--work-dir", type=Path, default=None, help="keep exported and compiled files here")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    args = p.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in CASES]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {list(CASES)}")
    return args


CaseRunner = Callable[[ModelCase, argparse.Namespace, Path, int], dict[str, Any]]


def main(argv: list[str] | None = None, case_runner: CaseRunner | None = None) -> int:
    """Parse the flags, run each model's case (this script's, or another benchmark's), print JSON."""
    args = parse_args(argv)
    threads = set_threads(args.threads)
    runner = case_runner or run_case
    with tempfile.TemporaryDirectory(prefix="kompile-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": machine(threads),
            "settings": settings(args),
            "models": [runner(CASES[m], args, work, threads) for m in args.models.split(",")],
        }
    emit_json(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
