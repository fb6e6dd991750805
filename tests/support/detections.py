"""What an artifact of NudeNet's detector still finds, counted at one score threshold with the
gate's YOLO decoding (kompile.compile_jobs.detections): the test of NudeNet's int8
(tests/pipeline/test_detector_int8.py) and its benchmark (benchmarks/detector_int8.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kompile.compile_jobs.detections import decode, unmatched

Array = np.ndarray[Any, Any]


def nudenet_manifest(
    name: str, dataset: Path, target: dict[str, Any], iterations: int, warmup: int = 1, task: str = "auto"
) -> dict[str, Any]:
    """A CompiledModel of NudeNet's detector (batch 1-4) validated on `dataset` as `task`, with one
    target."""
    from tests.support.pretrained_files import nudenet_detector

    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": name},
        "spec": {
            "source": {"uri": str(nudenet_detector())},
            "inputs": [
                {
                    "name": "images",
                    "shape": [-1, 3, 320, 320],
                    "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4}],
                }
            ],
            "targets": [target],
            "validation": {"dataset": str(dataset), "task": task},
            "benchmark": {"batchSizes": [1], "warmup": warmup, "iterations": iterations},
        },
    }


def matched(source: Array, artifact: Array, threshold: float = 0.25) -> tuple[int, int, int]:
    """Over a batch of outputs [images, 4 + classes, anchors], at one score threshold (no borderline
    band, as a deployment reads them): how many objects the source finds, how many of those the
    artifact finds too (same class, IoU at least 0.5), and how many more it finds."""
    total = kept = extra = 0
    for ref_out, got_out in zip(source, artifact, strict=True):
        ref, got = decode(ref_out, threshold), decode(got_out, threshold)
        count, missed = unmatched(ref, got, threshold)
        total, kept, extra = total + count, kept + count - missed, extra + unmatched(got, ref, threshold)[1]
    return total, kept, extra


def outputs(model: Path, photos: Array, options: dict[str, str] | None = None) -> Array:
    """A detector's output on each photo, [photos, 4 + classes, anchors]: an ONNX file by ONNX
    Runtime, an OpenVINO IR (.xml) by OpenVINO with the runtime properties the artifact's
    `options` record (`runtime.INFERENCE_PRECISION_HINT`: without it, OpenVINO runs bf16 on a CPU
    with AVX-512 BF16, not what was validated)."""
    if model.suffix == ".xml":
        import openvino as ov

        recorded = (options or {}).items()
        runtime = {k.removeprefix("runtime."): v for k, v in recorded if k.startswith("runtime.")}
        compiled = ov.Core().compile_model(str(model), "CPU", runtime)
        return np.concatenate([np.asarray(compiled(p[None])[0]) for p in photos])
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"images": p[None]})[0] for p in photos])
