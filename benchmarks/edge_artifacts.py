"""The edge runtimes beside eager and ONNX Runtime on this machine's CPU; prints JSON.

For each model at batch 1 (the edge's usual call): ExecuTorch (XNNPACK) fp32 and int8 `.pte`
programs built by kompile's executorch backend, LiteRT fp32, int8 static (full-integer) and int8
dynamic `.tflite` models built by its litert backend in its own environment (timed in that
process), ONNX Runtime fp32 and int8 static built by its
onnxruntime backend, and eager PyTorch, each validated against eager (cosine and errors), with the
artifact's bytes and compile seconds, all timed in the same interleaved rounds (cpu_artifacts'
machinery: pauses before each timed call, rounds disturbed by other processes dropped). The CPU's
instruction sets are printed beside the figures.

    python benchmarks/edge_artifacts.py --models resnet50,mobilenet_v2_real,minilm_real --threads 2 \
        --out benchmarks/results/edge-artifacts-<date>-<cpu>.json

resnet50 has random weights (a speed reference); mobilenet_v2_real (torchvision's ImageNet weights
on real photos) and minilm_real (all-MiniLM-L6-v2 on real sentences, sequence 32) are real
pretrained models from requirements/pretrained.txt, where quantization shows what it costs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT)]

import cpu_peers  # noqa: E402,F401  (registers the real models' cases in cpu_artifacts.CASES)
from cpu_artifacts import (  # noqa: E402
    ARTIFACTS,
    CaseRun,
    ModelCase,
    add_run_artifacts,
    best_validated,
    feed_signature,
    main,
    measure_case,
    runner_call,
    validation_figures,
)

from kompile.api.spec import InputSpec, Precision, Target  # noqa: E402
from kompile.api.vocabulary import Quantization  # noqa: E402
from kompile.compile_jobs.backends.base import BackendError, get_backend  # noqa: E402
from kompile.compile_jobs.build import compile_request  # noqa: E402

BuiltSpec = tuple[str, str, Precision, Quantization | None, dict[str, str]]
"""(label, backend, precision, quantization, options) of an artifact a kompile backend builds."""

EDGE: list[BuiltSpec] = [
    ("executorch-fp32", "executorch", "fp32", None, {}),
    ("executorch-int8", "executorch", "int8", "static", {}),
    # LiteRT in its own environment (scripts/setup-backend-env.sh litert): timed in that process.
    ("litert-fp32", "litert", "fp32", None, {}),
    ("litert-int8", "litert", "int8", "static", {}),
    ("litert-int8-dynamic", "litert", "int8", "dynamic", {}),
]
ORT = [(n, p, q, {}) for n, p, q in ARTIFACTS if n in ("ort-fp32", "ort-int8-static")]


def static_signature(run: CaseRun) -> list[InputSpec]:
    """The inputs at the reference feeds' own (batch 1) shapes: what the .pte is exported at."""
    return feed_signature(run.case, run.feeds[0])


def add_built(run: CaseRun, specs: list[BuiltSpec]) -> None:
    """Build, load and validate each artifact with kompile's backend, as a run's candidate would be
    (the reference inputs calibrate int8); a backend's failure is recorded, not raised."""
    signature = static_signature(run)
    for name, backend_name, precision, quantization, options in specs:
        backend = get_backend(backend_name)
        target = Target(
            name=name, backend=backend.name, precision=precision, quantization=quantization, options=options
        )
        start = time.perf_counter()
        try:
            request = compile_request(
                target,
                module=run.model,
                onnx_path=run.onnx_path,
                out_dir=run.work / run.case.name / name,
                signature=signature,
                feeds=run.feeds,
                threads=run.threads,
            )
            artifact = backend.compile(request)
            compile_s = time.perf_counter() - start
            runner = backend.load(artifact, run.threads)
            load_s = time.perf_counter() - start - compile_s  # XLA compiles its module here
            cand = [runner.run(f) for f in run.feeds]
        except BackendError as err:  # recorded, like a failed candidate in a run
            run.runtimes[name] = {"error": f"{getattr(err, 'reason', type(err).__name__)}: {str(err)[-600:]}"}
            continue
        run.runtimes[name] = {
            "compile_s": round(compile_s, 2),
            "load_s": round(load_s, 2),
            "bytes": artifact.model_path.stat().st_size,
            "options": artifact.options,
            "validation": validation_figures(run.reference, cand, runner.output_names, precision),
        }
        run.callers[name] = partial(runner_call, runner)


def run_case(case: ModelCase, args: argparse.Namespace, work: Path, threads: int) -> dict[str, Any]:
    def runtimes(run: CaseRun) -> None:
        add_run_artifacts(run, ORT)
        add_built(run, EDGE)

    report = measure_case(case, args, work, threads, runtimes, reference_batch=1)
    report["best"] = best_validated(report)
    report["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    for backend in ("executorch", "litert"):
        fp32, int8 = (report["runtimes"].get(f"{backend}-{p}", {}).get("bytes") for p in ("fp32", "int8"))
        if fp32 and int8:
            report[f"{backend}_int8_bytes_ratio"] = round(int8 / fp32, 3)
    return report


if __name__ == "__main__":
    defaults = [
        "--models",
        "resnet50,mobilenet_v2_real,minilm_real",
        "--batch-sizes",
        "1",
        "--no-torch-compile",
    ]
    raise SystemExit(main(defaults + sys.argv[1:], case_runner=run_case))
