"""IREE's flag sets vs eager PyTorch vs ONNX Runtime fp32 on this machine's CPU; prints JSON.

For each model at batch 1: the IREE backend built with each flag set (`--variants`:
`name=key:value;key:value` of the backend's options, `|` between variants), validated against
eager, and timed in the same interleaved rounds as eager and ONNX Runtime fp32 (IREE in its own
environment's process, which times its own calls); medians, compile times and the load average:

    python benchmarks/iree_flags.py --models resnet50,bert_base --out /tmp/iree.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "benchmarks")]

from cpu_artifacts import CASES, build, export, torch_call  # noqa: E402

from kompile.api.spec import InputSpec, Target  # noqa: E402
from kompile.api.vocabulary import DNS_LABEL_PATTERN, NAME_MAX  # noqa: E402
from kompile.compile_jobs import benchmark  # noqa: E402
from kompile.compile_jobs.backends.base import BackendError, Feeds, Runner, get_backend  # noqa: E402
from kompile.compile_jobs.benchmark import QuietRounds, set_threads, time_interleaved  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402
from kompile.compile_jobs.hardware import cpu_description  # noqa: E402
from kompile.compile_jobs.run_results import compare  # noqa: E402
from kompile.compile_jobs.validate import resolve_thresholds  # noqa: E402

DEFAULT_VARIANTS = (
    "iree-default=flags:default|iree-tuned=flags:tuned|iree-tuned-host=flags:tuned;targetCpu:host"
)


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def signature(name: str) -> list[InputSpec]:
    if name == "resnet50":
        dims = [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32}]
        return [InputSpec.model_validate({"name": "input", "shape": [-1, 3, 224, 224], "dynamicDims": dims})]
    dims = [
        {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32},
        {"axis": 1, "name": "seq", "min": 1, "opt": 128, "max": 512},
    ]
    return [
        InputSpec.model_validate({"name": n, "dtype": "int64", "shape": [-1, -1], "dynamicDims": dims})
        for n in ("input_ids", "attention_mask")
    ]


def variants(text: str) -> dict[str, dict[str, str]]:
    """name=key:value;key:value|... (options of the iree backend)."""
    out: dict[str, dict[str, str]] = {}
    for item in filter(None, text.split("|")):
        name, _, spec = item.partition("=")
        if not re.match(DNS_LABEL_PATTERN, name) or len(name) > NAME_MAX:
            # The name becomes a target's; a bad one would fail only after the first model's export.
            raise SystemExit(
                f"--variants: {name!r} is not a target name (up to 63 lower-case letters, digits and -)"
            )
        out[name] = dict(kv.split(":", 1) for kv in spec.split(";") if kv)
    return out


def ort_runner(path: Path, sig: list[InputSpec], feed: Feeds, threads: int) -> Runner:
    target = Target(name="ort", backend="onnxruntime", precision="fp32")
    backend = get_backend("onnxruntime")
    out = path.parent / "ort"
    request = compile_request(
        target, onnx_path=path, out_dir=out, signature=sig, feeds=[feed], threads=threads
    )
    return backend.load(backend.compile(request), threads=threads)


def run_model(
    name: str, chosen: dict[str, dict[str, str]], threads: int, iterations: int, work: Path
) -> dict[str, Any]:
    case = CASES[name]
    model = build(case).eval()
    feed = case.make(np.random.default_rng(0), 1)
    onnx_path = work / f"{name}.onnx"
    export(case, model, onnx_path)
    fns: dict[str, Any] = {"eager": torch_call(model, feed)}
    result: dict[str, Any] = {"variants": {}}
    runners: list[Any] = []
    sig = signature(name)
    for label, options in chosen.items():
        target = Target(name=label, backend="iree", precision="fp32", options=options)
        request = compile_request(
            target,
            module=model,
            onnx_path=onnx_path,
            out_dir=work / label,
            signature=sig,
            feeds=[feed],
            threads=threads,
        )
        started = time.perf_counter()
        try:
            artifact = get_backend("iree").compile(request)
        except BackendError as err:
            result["variants"][label] = {"options": options, "error": str(err)}
            continue
        compile_s = time.perf_counter() - started
        runner = get_backend("iree").load(artifact, threads=threads)
        runners.append(runner)
        got = request.reference.with_outputs(label, [runner.run(feed)])
        verdict = compare(request.reference, got, resolve_thresholds("fp32"))
        result["variants"][label] = {
            "options": options,
            "compileFlags": artifact.options["compileFlags"],
            "compileSeconds": round(compile_s, 1),
            "validated": verdict.passed,
            "cosine": min(o.cosine for o in verdict.outputs),
        }
        fns[label] = benchmark.runner_call(runner, feed)
    ort = ort_runner(onnx_path, sig, feed, threads)
    fns["onnxruntime-fp32"] = benchmark.runner_call(ort, feed)
    # As the pipeline times: the rounds other processes disturbed least (a shared machine's load
    # makes every runtime's latency bimodal).
    quiet = QuietRounds()
    stats = time_interleaved(fns, 1, warmup=3, iterations=iterations, pause_s=0.2, settle=1, quiet=quiet)
    result["p50_ms"] = {k: round(v.p50_ms, 2) for k, v in stats.items()}
    result["p90_ms"] = {k: round(v.p90_ms, 2) for k, v in stats.items()}
    result["rounds_discarded"] = quiet.discarded
    result["loadavg_after"] = loadavg()
    for r in runners:
        r.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert_base")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    chosen = variants(args.variants)  # checked before any model is exported
    threads = set_threads(args.threads)
    figures: dict[str, Any] = {
        "threads": threads,
        "loadavg_before": loadavg(),
        "cpu": cpu_description(),
    }
    with tempfile.TemporaryDirectory(prefix="iree-flags-") as tmp:
        for name in args.models.split(","):
            figures[name] = run_model(name, chosen, threads, args.iterations, Path(tmp))
    text = json.dumps(figures, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
