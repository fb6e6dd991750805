"""ONNX Runtime on transformers whose attention is SDPA (transformers' default), as users bring them;
prints JSON.

Two ways such a model reaches kompile, each against the peers a user would pick instead, all timed
in one interleaved run per batch size and validated against eager on padded batches:
- the user's own ONNX file, exported as users now do (`torch.onnx.export(..., dynamo=True)`):
  plain ONNX Runtime and plain OpenVINO (f32) on that file, and kompile's onnxruntime fp32 artifact
  of it (`kompile-onnx-file`: attention fused through onnxscript's rules, option sdpaFusion);
- the module itself (a python:// source): kompile traces it with eager attention
  (kompile.compile_jobs.export.eager_attention) and builds its onnxruntime fp32 artifact
  (`kompile-module`), beside the module traced as it is (`kompile-module-sdpa-traced`: what kompile
  built before).
Eager PyTorch and torch.compile time the module as the user runs it.

    python benchmarks/sdpa_fusion.py --models minilm_real_sdpa,bert_base_sdpa --batch-sizes 1,8 \\
        --out /tmp/sdpa.json
"""

from __future__ import annotations

import contextlib
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_artifacts
from cpu_artifacts import CASES, SEQ, CaseRun, ModelCase, add_artifacts, export, measure_case
from cpu_peers import PlainRunner, plain_onnxruntime, plain_openvino, runner_call

from kompile.compile_jobs.backends.base import Feeds
from kompile.compile_jobs.export import eager_attention

Array = np.ndarray[Any, Any]
DEFAULT_MODELS = "minilm_real_sdpa,bert_base_sdpa"


def padded_tokens(vocab: int, rng: np.random.Generator, batch: int) -> Feeds:
    """Token ids below `vocab`, right padding of varying length on all but the first row."""
    mask = np.ones((batch, SEQ), dtype=np.int64)
    for row in range(1, batch):
        mask[row, int(rng.integers(SEQ // 2, SEQ)) :] = 0
    return {"input_ids": rng.integers(0, vocab, (batch, SEQ)).astype(np.int64), "attention_mask": mask}


_AXES = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "last_hidden_state")}
_TOKENS = ["input_ids", "attention_mask"]
for _name, _factory, _vocab in (
    ("minilm_real_sdpa", "models.pretrained:minilm_l6_sdpa", 30522),
    ("bert_base_sdpa", "models.transformer:bert_base_sdpa", 30522),
    ("bert_tiny_sdpa", "models.transformer:bert_tiny_sdpa", 1000),  # seconds: the test's case
):
    CASES[_name] = ModelCase(
        _name, _factory, _TOKENS, "last_hidden_state", partial(padded_tokens, _vocab), _AXES, dynamo=True
    )


def fp32_peers(run: CaseRun) -> dict[str, PlainRunner]:
    """Plain ONNX Runtime and plain OpenVINO on the user's file, fp32 (their int8 is not this run's
    question)."""
    ort = plain_onnxruntime(run.onnx_path, run.work, run.threads, int8=False)
    ov = plain_openvino(run.onnx_path, run.feeds, run.threads, int8=False)
    return {name: runner for name, (runner, precision) in {**ort, **ov}.items() if precision == "fp32"}


def add_runtimes(run: CaseRun) -> None:
    case, work = run.case, run.work / run.case.name
    for name, runner in fp32_peers(run).items():
        cand = [runner.run(f) for f in run.feeds]
        run.runtimes[name] = {
            "validation": cpu_artifacts.validation_figures(run.reference, cand, [case.output], "fp32")
        }
        run.callers[name] = partial(runner_call, runner)
    art = partial(add_artifacts, out=work, threads=run.threads, feeds=run.feeds, reference=run.reference)
    art([("kompile-onnx-file", "fp32", None, {})], run.onnx_path, runtimes=run.runtimes, callers=run.callers)
    traced = ModelCase(**{**vars(case), "dynamo": False})
    for name, switch in (("kompile-module", True), ("kompile-module-sdpa-traced", False)):
        path = work / f"{name}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        start = time.perf_counter()
        with eager_attention(run.model, notes.append) if switch else contextlib.nullcontext():
            export(traced, run.model, path)
        art([(name, "fp32", None, {})], path, runtimes=run.runtimes, callers=run.callers)
        run.runtimes[name]["export_s"] = round(time.perf_counter() - start, 2)
        run.runtimes[name]["traced_with_eager_attention"] = bool(notes)


def fusion_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Per batch size: each kompile artifact's time against plain ONNX Runtime's on the same file."""
    out: dict[str, Any] = {}
    for batch, stats in report["latency"].items():
        plain = stats["onnxruntime"]["p50_ms"]
        out[batch] = {
            name: round(plain / stats[name]["p50_ms"], 3)
            for name in ("kompile-onnx-file", "kompile-module", "kompile-module-sdpa-traced")
        }
    return {"plain_onnxruntime_p50_over_kompile_p50": out}


def run_case(case: ModelCase, args: Any, work: Path, threads: int) -> dict[str, Any]:
    report = measure_case(case, args, work, threads, add_runtimes)
    report["verdict"] = fusion_verdict(report)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--models" or a.startswith("--models=") for a in argv):
        argv = ["--models", DEFAULT_MODELS, *argv]
    return cpu_artifacts.main(argv, case_runner=run_case)


if __name__ == "__main__":
    raise SystemExit(main())
