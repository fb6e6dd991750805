"""Eager PyTorch vs torch.compile vs AOTInductor packages on this machine's NVIDIA GPU; prints JSON.

For each example model (ResNet-50, BERT-base at sequence length 128) and batch size: p50/p90/p99
latency, throughput and speedup over eager fp32 (eager fp32 p50 / runtime p50, every runtime timed in
the same interleaved rounds) of eager fp32, eager fp16 and bf16, torch.compile (fp32) and the
inductor backend's AOTInductor packages (fp32, fp16), plus each candidate's validation figures
against eager fp32. Every runtime takes numpy inputs and returns numpy outputs, host-device copies
included, as the pipeline's runners do. Needs a GPU; exits non-zero without one:

    python benchmarks/gpu_artifacts.py --models resnet50,bert_base --batch-sizes 1,32 --out /tmp/gpu.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

from kompile.api.spec import InputSpec, Precision, Target  # noqa: E402
from kompile.compile_jobs.backends.base import Feeds, Runner, get_backend  # noqa: E402
from kompile.compile_jobs.benchmark import time_interleaved  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.validate import compare, resolve_thresholds  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from cpu_artifacts import emit_json, image_feeds, token_feeds  # noqa: E402  (same inputs as the CPU benchmark)

Array = np.ndarray[Any, Any]
SEQ = 128
Call = Callable[[], object]


@dataclass
class ModelCase:
    name: str
    factory: str
    signature: list[InputSpec]
    make: Callable[[np.random.Generator, int], Feeds]


def _batch_dim(max_batch: int) -> dict[str, Any]:
    return {"axis": 0, "name": "batch", "min": 1, "opt": max_batch, "max": max_batch}


def cases(max_batch: int) -> dict[str, ModelCase]:
    image = {"name": "input", "shape": [-1, 3, 224, 224], "dynamicDims": [_batch_dim(max_batch)]}
    tokens = [
        {"name": n, "dtype": "int64", "shape": [-1, SEQ], "dynamicDims": [_batch_dim(max_batch)]}
        for n in ("input_ids", "attention_mask")
    ]
    return {
        "resnet50": ModelCase(
            "resnet50", "models.cnn:resnet50", [InputSpec.model_validate(image)], image_feeds
        ),
        "bert_base": ModelCase(
            "bert_base",
            "models.transformer:bert_base",
            [InputSpec.model_validate(t) for t in tokens],
            token_feeds,
        ),
    }


def build(case: ModelCase) -> Any:
    import importlib

    module, fn = case.factory.split(":")
    return getattr(importlib.import_module(module), fn)()


def torch_call(model: Any, feeds: Feeds, *, dtype: Any) -> Call:
    """numpy in, numpy out, on the GPU: float inputs cast to the model's dtype."""
    import torch

    def run() -> list[Array]:
        with torch.inference_mode():
            args = [torch.from_numpy(a).cuda() for a in feeds.values()]
            args = [a.to(dtype) if a.is_floating_point() else a for a in args]
            return [model(*args).float().cpu().numpy()]

    return run


def runner_call(runner: Runner, feeds: Feeds) -> Call:
    return lambda: runner.run(feeds)


def add_eager(model: Any, runtimes: dict[str, Any], callers: dict[str, Callable[[Feeds], Call]]) -> None:
    import copy

    import torch

    for name, dtype in (
        ("eager-fp32", torch.float32),
        ("eager-fp16", torch.float16),
        ("eager-bf16", torch.bfloat16),
    ):
        m = copy.deepcopy(model).to(device="cuda", dtype=dtype)
        callers[name] = partial(torch_call, m, dtype=dtype)
        runtimes[name] = {}
    compiled = torch.compile(copy.deepcopy(model).cuda())
    callers["torch.compile"] = partial(torch_call, compiled, dtype=torch.float32)
    runtimes["torch.compile"] = {}


def add_packages(
    case: ModelCase,
    model: Any,
    work: Path,
    precisions: list[Precision],
    runtimes: dict[str, Any],
    callers: dict[str, Callable[[Feeds], Call]],
) -> None:
    """Build and load each AOTInductor package through the backend: what the pipeline ships."""
    backend = get_backend("inductor")
    for precision in precisions:
        name = f"aoti-{precision}"
        target = Target(name=name, backend="inductor", precision=precision)
        start = time.perf_counter()
        request = compile_request(
            target,
            out_dir=work / case.name / name,
            signature=case.signature,
            feeds=[case.make(np.random.default_rng(0), 2)],
            module=model,
            device="cuda",
        )
        artifact = backend.compile(request)
        runner: Runner = backend.load(artifact, device="cuda")
        runtimes[name] = {"compile_s": round(time.perf_counter() - start, 1), "options": artifact.options}
        callers[name] = partial(runner_call, runner)


def run_case(case: ModelCase, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = build(case)
    runtimes: dict[str, Any] = {}
    callers: dict[str, Callable[[Feeds], Call]] = {}
    add_eager(model, runtimes, callers)
    add_packages(case, model, work, args.precisions, runtimes, callers)
    rng = np.random.default_rng(args.seed)
    feeds = [case.make(rng, 2) for _ in range(args.samples)]
    reference = [callers["eager-fp32"](f)() for f in feeds]
    for name, runtime in runtimes.items():
        start = time.perf_counter()  # torch.compile compiles on its first calls
        cand = [callers[name](f)() for f in feeds]
        runtime["first_calls_s"] = round(time.perf_counter() - start, 2)
        precision = next((p for p in ("fp16", "bf16") if p in name), "fp32")
        result = compare(reference, cand, ["output"], resolve_thresholds(precision))  # type: ignore[arg-type]
        out = result.outputs[0]
        runtime["validation"] = {
            "passed": result.passed,
            "max_abs_error": out.max_abs_error,
            "cosine": out.cosine,
        }
    report: dict[str, Any] = {"model": case.name, "runtimes": runtimes, "latency": {}}
    for batch in args.batch_sizes:
        feed = case.make(np.random.default_rng(batch), batch)
        fns = {n: c(feed) for n, c in callers.items()}
        stats = time_interleaved(fns, batch, args.warmup, args.iterations)
        base = stats["eager-fp32"].p50_ms
        report["latency"][str(batch)] = {
            n: {**s.model_dump(exclude={"batch_size"}), "speedup": round(base / s.p50_ms, 3)}
            for n, s in stats.items()
        }
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="resnet50,bert_base", help="comma-separated: resnet50,bert_base")
    p.add_argument("--batch-sizes", default="1,32", type=lambda s: [int(b) for b in s.split(",")])
    p.add_argument("--precisions", default="fp32,fp16", type=lambda s: s.split(","), help="AOTI packages")
    p.add_argument("--iterations", type=int, default=50, help="timed rounds per batch size")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--samples", type=int, default=4, help="reference inputs (batch 2 each) to validate on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=None, help="keep the packages here")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    args = p.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in cases(1)]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {list(cases(1))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu_artifacts: no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is "
            "False); run it on a machine with an NVIDIA GPU and a CUDA build of torch",
            file=sys.stderr,
        )
        return 2
    all_cases = cases(max(args.batch_sizes))
    with tempfile.TemporaryDirectory(prefix="kompile-gpu-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        doc = {
            "machine": {
                "gpu": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
            },
            "settings": {
                "iterations": args.iterations,
                "warmup": args.warmup,
                "seq_len": SEQ,
                "speedup": "eager fp32 p50 / runtime p50, interleaved rounds in one run",
            },
            "models": [run_case(all_cases[m], args, work) for m in args.models.split(",")],
        }
    emit_json(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
