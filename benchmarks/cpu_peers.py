"""kompile's selected CPU artifact against the peers a user would pick instead, in one interleaved
run per model and batch size; prints JSON.

Peers, each with the settings a user gets by default: eager PyTorch, torch.compile, plain OpenVINO
(f32, bf16 where the CPU has it, NNCF int8 with default settings), plain ONNX Runtime (its default
optimization level, `quantize_dynamic` int8 with defaults). kompile: what `kompile run` selects for
a target with `precision: auto` (backend auto: a CPU class's ladder int8 -> bf16 -> fp32 with the
int8 remedies), run through the real pipeline on the same reference inputs; the report keeps every
candidate of the climb, the rung that passed and the tournament's wall time. Every runtime is
validated against eager with kompile's thresholds for its precision.

Models: the random-weight speed references (resnet50, bert_base) and real pretrained weights on
real data (minilm_real: all-MiniLM-L6-v2 on real sentences; mobilenet_v2_real: MobileNetV2 with its
ImageNet weights on real photos), where int8 is hard.

    python benchmarks/cpu_peers.py --models resnet50,bert_base,minilm_real,mobilenet_v2_real \
        --batch-sizes 1,8 --out /tmp/peers.json
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
    CASES,
    ROOT,
    SEQ,
    CaseRun,
    ModelCase,
    measure_case,
    runner_call,
    validation_figures,
)

from kompile.compile_jobs.backends.base import Feeds
from kompile.compile_jobs.backends.openvino import nncf_on_stderr
from kompile.compile_jobs.hardware import has_fast_bf16

Array = np.ndarray[Any, Any]
KOMPILE_PREFIX = "kompile/"


class PlainRunner:
    """A peer runtime called the way its own docs show, outputs as numpy arrays."""

    def __init__(self, fn: Any, names: list[str]) -> None:
        self.fn, self.names = fn, names

    def run(self, feeds: Feeds) -> list[Array]:
        return [np.asarray(o) for o in self.fn({n: feeds[n] for n in self.names})]


def plain_openvino(
    onnx_path: Path, feeds: list[Feeds], threads: int, int8: bool = True
) -> dict[str, tuple[PlainRunner, str]]:
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
    if not int8:
        return out
    with nncf_on_stderr():  # stdout carries this script's JSON
        quantized = nncf.quantize(model, nncf.Dataset(feeds, lambda f: {n: f[n] for n in names}))
    compiled = core.compile_model(quantized, "CPU", base)
    out["openvino-int8-nncf"] = (PlainRunner(_ov_call(compiled), names), "int8")
    return out


def _ov_call(compiled: Any) -> Any:
    request = compiled.create_infer_request()
    return lambda inputs: [np.array(v) for v in request.infer(inputs).values()]


def plain_onnxruntime(
    onnx_path: Path, work: Path, threads: int, int8: bool = True
) -> dict[str, tuple[PlainRunner, str]]:
    """ONNX Runtime with default session options and quantize_dynamic's defaults."""
    import onnxruntime as ort
    from onnxruntime.quantization import quantize_dynamic

    files: list[tuple[str, Path, str]] = [("onnxruntime", onnx_path, "fp32")]
    if int8:
        dynamic = work / "plain-ort-int8.onnx"
        quantize_dynamic(str(onnx_path), str(dynamic))
        files.append(("onnxruntime-int8-dynamic", dynamic, "int8"))
    out: dict[str, tuple[PlainRunner, str]] = {}
    for name, path, precision in files:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        out[name] = (PlainRunner(partial(session.run, None), names), precision)
    return out


def _rows(arrays: dict[str, Array]) -> Any:
    """Feeds of `batch` rows drawn from real data (rows repeat when the data has fewer)."""

    def make(rng: np.random.Generator, batch: int) -> Feeds:
        first = next(iter(arrays.values()))
        pick = rng.choice(len(first), size=batch, replace=batch > len(first))
        return {n: a[pick] for n, a in arrays.items()}

    return make


def _real_sentences() -> dict[str, Array]:
    with np.load(ROOT / "examples" / "minilm-sentences.npz") as data:  # 8 sentences, length 32
        return {n: data[n] for n in ("input_ids", "attention_mask")}


def _real_photos() -> dict[str, Array]:
    import tempfile

    from models.pretrained import photos_dataset  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp, np.load(photos_dataset(Path(tmp) / "p.npz", "input")) as data:
        return {"input": data["input"]}


def _lazy(load: Any) -> Any:
    cache: dict[str, Any] = {}

    def make(rng: np.random.Generator, batch: int) -> Feeds:
        if "make" not in cache:
            cache["make"] = _rows(load())
        feeds: Feeds = cache["make"](rng, batch)
        return feeds

    return make


_TOKEN_AXES = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "last_hidden_state")}
CASES["minilm_real"] = ModelCase(
    "minilm_real",
    "models.pretrained:minilm_l6",
    ["input_ids", "attention_mask"],
    "last_hidden_state",
    _lazy(_real_sentences),
    _TOKEN_AXES,
)
CASES["mobilenet_v2_real"] = ModelCase(
    "mobilenet_v2_real",
    "models.pretrained:mobilenet_v2_imagenet",
    ["input"],
    "logits",
    _lazy(_real_photos),
    {"input": {0: "batch"}, "logits": {0: "batch"}},
)


# The manifest's inputs for each case (the pipeline exports with these names and ranges).
def _dims(*axes: tuple[int, str, int, int, int]) -> list[dict[str, Any]]:
    return [{"axis": a, "name": n, "min": lo, "opt": opt, "max": hi} for a, n, lo, opt, hi in axes]


_BATCH = (0, "batch", 1, 1, 64)
_IMAGE = [{"name": "input", "shape": [-1, 3, 224, 224], "dynamicDims": _dims(_BATCH)}]
_TOKENS = [
    {
        "name": n,
        "dtype": "int64",
        "shape": [-1, -1],
        "low": lo,
        "high": hi,
        "dynamicDims": _dims(_BATCH, (1, "seq", 1, SEQ, 512)),
    }
    for n, lo, hi in (("input_ids", 0, 30522), ("attention_mask", 1, 2))
]
SIGNATURES = {"resnet50": _IMAGE, "bert_base": _TOKENS, "minilm_real": _TOKENS, "mobilenet_v2_real": _IMAGE}


def kompile_tournament(
    case: ModelCase, feeds: list[Feeds], work: Path, threads: int
) -> tuple[Any, dict[str, Any]]:
    """`kompile run` of a precision-auto target on these reference inputs: the selected artifact's
    runner, and the climb (each candidate's verdict, the winner, the wall time)."""
    from kompile.api.resource import parse_manifest
    from kompile.compile_jobs.pipeline import LogReporter, PipelineOptions, run_pipeline

    work.mkdir(parents=True, exist_ok=True)
    dataset = work / f"{case.name}-reference.npz"
    np.savez(dataset, **{n: np.concatenate([f[n] for f in feeds]) for n in case.inputs})
    doc = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": case.name.replace("_", "-")},
        "spec": {
            "source": {"uri": f"python://{case.factory}"},
            "inputs": SIGNATURES[case.name],
            "targets": [{"name": "cpu", "precision": "auto"}],
            "validation": {"dataset": str(dataset)},
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 6, "threads": threads},
        },
    }
    cm = parse_manifest(doc)
    opts = PipelineOptions(
        base_dir=ROOT / "examples", work_dir=work / "kompile", artifact_root=work / "kompile" / "artifacts"
    )
    start = time.perf_counter()
    result = run_pipeline(cm, opts, LogReporter(lambda m: print(m, file=sys.stderr)))
    wall = time.perf_counter() - start
    (t,) = result.status.targets
    climb = {
        "wall_s": round(wall, 1),
        "phase": t.phase,
        "winner": t.selection.winner if t.selection else None,
        "rung": t.precision if t.phase == "Succeeded" else None,
        "not_tried": t.not_offered,
        "candidates": [
            {
                "name": c.name,
                "precision": c.precision,
                "phase": c.phase,
                "reason": c.reason,
                "min_cosine": None if c.min_cosine is None else round(c.min_cosine, 5),
                "compile_s": c.compile_seconds,
            }
            for c in t.candidates
        ],
    }
    runner = result.built[0].runner if result.built else None
    return runner, climb


def kompile_artifacts(
    case: ModelCase, feeds: list[Feeds], work: Path, threads: int, report: dict[str, Any]
) -> dict[str, tuple[Any, str]]:
    """kompile's selection for a precision-auto target, as one runtime of the interleaved run."""
    runner, climb = kompile_tournament(case, feeds, work, threads)
    report["kompile_tournament"] = climb
    if runner is None:
        return {}
    return {f"{KOMPILE_PREFIX}{climb['winner']}": (runner, climb["rung"])}


def add_peers(run: CaseRun) -> None:
    """Every peer and kompile's selection, each validated against eager with kompile's thresholds."""
    case, work, threads, feeds = run.case, run.work, run.threads, run.feeds
    groups = [
        lambda: plain_openvino(run.onnx_path, feeds, threads),
        lambda: plain_onnxruntime(run.onnx_path, work, threads),
        lambda: kompile_artifacts(case, feeds, work / case.name, threads, run.report),
    ]
    for group in groups:
        start = time.perf_counter()
        for name, (runner, precision) in group().items():
            cand = [runner.run(f) for f in feeds]
            run.runtimes[name] = {
                "precision": precision,
                "validation": validation_figures(run.reference, cand, [case.output], precision),
            }
            run.callers[name] = partial(runner_call, runner)
        for name in run.runtimes:
            run.runtimes[name].setdefault("build_s_group", round(time.perf_counter() - start, 1))


def run_case(case: ModelCase, args: argparse.Namespace, work: Path, threads: int) -> dict[str, Any]:
    report = measure_case(case, args, work, threads, add_peers)
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
            # The bar for a real transformer: 1.8x plain ONNX Runtime fp32.
            "kompile_vs_onnxruntime_fp32": round(stats["onnxruntime"]["p50_ms"] / stats[pick]["p50_ms"], 3)
            if pick and "onnxruntime" in stats
            else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    import cpu_artifacts

    return cpu_artifacts.main(argv, case_runner=run_case)


if __name__ == "__main__":
    raise SystemExit(main())
