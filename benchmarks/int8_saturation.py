"""ONNX Runtime int8 with 8-bit and 7-bit weights on this CPU: accuracy and speed; prints JSON.

On x86 without VNNI, ONNX Runtime's int8 kernels multiply u8 activations by s8 weights with
vpmaddubsw, which adds each pair of products in int16 and saturates where 8-bit weights meet large
activations: the artifact then computes something other than the quantized model. `reduceRange`
keeps weights to 7 bits, which cannot saturate there. For each model and weight width this prints:

- `worst_cosine`: the artifact's output against the fp32 model's, on real inputs (what the gate sees);
- `quantized_math_worst_cosine` (static): the same file run without graph optimizations, each QDQ
  pair as float math (what the quantized model means, whatever the CPU);
- `kernels_vs_math_worst_cosine`: the two against each other: below 1 by rounding on every CPU, far
  below where the kernels saturate;
- p50 latency (batch 1) with p90/p99, interleaved with fp32 in the same rounds by the pipeline's
  own timer (a pause before each timed call, so no session's spinning pool steals the cores);
- `kompile_auto`: the width kompile's `reduceRange: auto` picks on this CPU.

Static int8 (QDQ, per-channel, the pipeline's own quantize_static) for the CNNs: MobileNetV2 with its
ImageNet weights on crops of real photos (examples/models/pretrained.py), ResNet-50 with random weights
(a speed reference). Dynamic int8 for all-MiniLM-L6-v2 with its real weights on real sentences.

    python benchmarks/int8_saturation.py --iterations 40 --out /tmp/int8-saturation.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "examples")]

from cpu_artifacts import emit_json, machine  # noqa: E402

from kompile.api.catalog.onnxruntime import OnnxRuntimeOptions  # noqa: E402
from kompile.compile_jobs import hardware  # noqa: E402
from kompile.compile_jobs.backends.onnxruntime import (  # noqa: E402
    dynamic_reduce_range,
    quantize_dynamic,
    quantize_static,
    static_reduce_range,
)
from kompile.compile_jobs.benchmark import time_interleaved  # noqa: E402
from kompile.compile_jobs.timing import PAUSE_S, SETTLE_CALLS  # noqa: E402

Feeds = dict[str, np.ndarray]


def _mobilenet_v2(work: Path) -> tuple[Any, list[Feeds], str]:
    from models.pretrained import mobilenet_v2_imagenet, photos_dataset

    photos = np.load(photos_dataset(work / "photos.npz"))["image"]
    return mobilenet_v2_imagenet(), [{"image": p[None]} for p in photos], "static"


def _resnet50(work: Path) -> tuple[Any, list[Feeds], str]:
    import torch
    import torchvision
    from models.pretrained import photos_dataset

    torch.manual_seed(0)
    photos = np.load(photos_dataset(work / "photos.npz"))["image"]
    return torchvision.models.resnet50(weights=None).eval(), [{"image": p[None]} for p in photos], "static"


def _minilm(work: Path) -> tuple[Any, list[Feeds], str]:
    from models.pretrained import minilm_l6, minilm_l6_dataset

    tokens = np.load(minilm_l6_dataset(work / "sentences.npz"))
    feeds = [{k: tokens[k][i : i + 1] for k in tokens.files} for i in range(len(tokens["input_ids"]))]
    return minilm_l6(), feeds, "dynamic"


CASES: dict[str, Callable[[Path], tuple[Any, list[Feeds], str]]] = {
    "mobilenet_v2": _mobilenet_v2,
    "resnet50": _resnet50,
    "minilm": _minilm,
}


def _export(model: Any, feeds: list[Feeds], path: Path) -> Path:
    import torch

    example = tuple(torch.from_numpy(v) for v in feeds[0].values())
    torch.onnx.export(model, example, str(path), input_names=list(feeds[0]), dynamo=False)
    return path


def _session(path: Path, optimized: bool, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    level = ort.GraphOptimizationLevel
    so.graph_optimization_level = level.ORT_ENABLE_ALL if optimized else level.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _outputs(session: Any, feeds: list[Feeds]) -> list[np.ndarray]:
    return [session.run(None, f)[0].ravel().astype(np.float64) for f in feeds]


def _worst(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return round(
        min(float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b, strict=True)), 4
    )


def _top1(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(np.mean([x.argmax() == y.argmax() for x, y in zip(a, b, strict=True)]))


def _quantize(src: Path, feeds: list[Feeds], mode: str, reduce_range: str, work: Path) -> tuple[Path, str]:
    """The pipeline's own quantizer; the file and the width it used."""
    opts = OnnxRuntimeOptions.model_validate({"reduceRange": reduce_range})
    record: dict[str, str] = {}
    if mode == "dynamic":
        out = quantize_dynamic(src, work / f"dynamic-{reduce_range}.onnx", opts, record, external=False)
    else:
        folder = work / f"static-{reduce_range}"
        folder.mkdir()
        request = SimpleNamespace(calibration=feeds, calibration_at_sizes=feeds, sized_inputs=[])
        out = quantize_static(src, list(feeds[0]), folder, request, opts, record, external=False)  # type: ignore[arg-type]
    return out, record["reduceRange"]


class _OpenVino:
    """An OpenVINO compiled model behind the ONNX Runtime session's `run` the timer calls."""

    def __init__(self, model: Any, threads: int) -> None:
        import openvino as ov

        config = {
            "INFERENCE_PRECISION_HINT": "f32",
            "INFERENCE_NUM_THREADS": str(threads),
            "PERFORMANCE_HINT": "LATENCY",
        }
        self.compiled = ov.Core().compile_model(model, "CPU", config)

    def run(self, _names: Any, feed: Feeds) -> list[np.ndarray]:
        return [np.asarray(v) for v in self.compiled(feed).values()]


def _openvino(src: Path, feeds: list[Feeds], threads: int) -> dict[str, _OpenVino]:
    """OpenVINO fp32, kompile's int8 (its backend's own NNCF call: overflow fix on the first layer)
    and the same NNCF call with the fix off, which shows what the fix keeps on this CPU."""
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    from kompile.api.catalog.openvino import OpenVinoOptions
    from kompile.compile_jobs.backends.openvino import nncf_on_stderr, quantize

    request = SimpleNamespace(calibration=feeds, calibration_at_sizes=feeds, sized_inputs=[])
    record: dict[str, str] = {}
    with nncf_on_stderr():  # its progress bars go to stdout, where the JSON goes
        kompile_int8 = quantize(ov.convert_model(str(src)), request, OpenVinoOptions(), record)  # type: ignore[arg-type]
        no_fix = nncf.quantize(
            ov.convert_model(str(src)),
            nncf.Dataset(feeds),
            preset=nncf.QuantizationPreset.PERFORMANCE,
            subset_size=len(feeds),
            advanced_parameters=AdvancedQuantizationParameters(overflow_fix=OverflowFix.DISABLE),
        )
    return {
        "openvino-fp32": _OpenVino(ov.convert_model(str(src)), threads),
        f"openvino-int8 (overflow fix: {record['overflowFix']}, kompile's)": _OpenVino(kompile_int8, threads),
        "openvino-int8 (overflow fix: off)": _OpenVino(no_fix, threads),
    }


def _time(sessions: dict[str, Any], feed: Feeds, iterations: int, warmup: int) -> dict[str, dict[str, Any]]:
    """The pipeline's own timer: interleaved rounds in rotating order, so load drifts hit every
    variant alike, with a pause before each timed call and one settling call (timing.PAUSE_S,
    SETTLE_CALLS): each session keeps its own spinning thread pool, and without the pause the
    previous session's spinning threads take the 2 cores from the one being timed (an earlier
    version of this script timed back to back and read MobileNetV2's 7-bit int8 as 1.34x slower
    than the 8-bit one; the kernels' own times were equal)."""
    fns = {name: (lambda s=session: s.run(None, feed)) for name, session in sessions.items()}
    stats = time_interleaved(
        fns, 1, warmup, iterations, pause_s=PAUSE_S, settle=SETTLE_CALLS, until_idle=True
    )
    return {
        name: {"p50_ms": round(st.p50_ms, 3), "p90_ms": round(st.p90_ms, 3), "p99_ms": round(st.p99_ms, 3)}
        for name, st in stats.items()
    }


def bench(
    name: str, work: Path, iterations: int, warmup: int, threads: int, openvino: bool = True
) -> dict[str, Any]:
    model, feeds, mode = CASES[name](work)
    src = _export(model, feeds, work / f"{name}.onnx")
    fp32 = _session(src, True, threads)
    reference = _outputs(fp32, feeds)
    sessions = {"fp32": fp32}
    variants: dict[str, Any] = {}
    for width, flag in (("8-bit", "false"), ("7-bit", "true")):
        path, used = _quantize(src, feeds, mode, flag, work)
        assert used == flag, (used, flag)
        kernels = _session(path, True, threads)
        got = _outputs(kernels, feeds)
        variants[width] = {"worst_cosine": _worst(reference, got)}
        if mode == "static":  # dynamic int8's integer ops run the same kernels either way
            math = _outputs(_session(path, False, threads), feeds)
            variants[width].update(
                quantized_math_worst_cosine=_worst(reference, math),
                kernels_vs_math_worst_cosine=_worst(got, math),
            )
        if name != "minilm":
            variants[width]["top1_agreement"] = _top1(reference, got)
        sessions[width] = kernels
    if mode == "static" and openvino:
        for label, ov_session in _openvino(src, feeds, threads).items():
            variants[label] = {}
            if "int8" in label:  # fp32 is only timed
                got = _outputs(ov_session, feeds)
                variants[label].update(
                    worst_cosine=_worst(reference, got), top1_agreement=_top1(reference, got)
                )
            sessions[label] = ov_session
    for key, figures in _time(sessions, feeds[0], iterations, warmup).items():
        variants.setdefault(key, {}).update(figures)
    reduce_range = static_reduce_range if mode == "static" else dynamic_reduce_range
    auto = "7-bit" if reduce_range(OnnxRuntimeOptions()) else "8-bit"
    return {
        "model": name,
        "quantization": mode,
        "inputs": len(feeds),
        "kompile_auto": auto,
        "variants": variants,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default=",".join(CASES), help=f"comma-separated: {','.join(CASES)}")
    p.add_argument("--iterations", type=int, default=40, help="timed rounds (each variant once a round)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-openvino", action="store_true", help="ONNX Runtime's variants only")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    report: dict[str, Any] = {
        "machine": machine(args.threads),
        "int8_pairs_saturate": hardware.int8_pairs_saturate(),
        "iterations": args.iterations,
        "models": [],
    }
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            report["models"].append(
                bench(name, Path(tmp), args.iterations, args.warmup, args.threads, not args.no_openvino)
            )
    emit_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
