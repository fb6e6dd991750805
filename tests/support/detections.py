"""YOLOv8's decoding of a detector's output, to count what an artifact still finds: the test of
NudeNet's int8 (tests/pipeline/test_detector_int8.py) and its benchmark (benchmarks/detector_int8.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


def nudenet_manifest(
    name: str, dataset: Path, target: dict[str, Any], iterations: int, warmup: int = 1
) -> dict[str, Any]:
    """A CompiledModel of NudeNet's detector (batch 1-4) validated on `dataset`, with one target."""
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
            "validation": {"dataset": str(dataset)},
            "benchmark": {"batchSizes": [1], "warmup": warmup, "iterations": iterations},
        },
    }


def detections(output: Array, threshold: float = 0.25, iou: float = 0.45) -> list[tuple[int, Array]]:
    """One image's [4 + classes, anchors] decoded: (class, xyxy box) above the score threshold,
    greedy non-maximum suppression within a class."""
    boxes, scores = output[:4].T, output[4:].T
    xyxy = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], axis=1)
    best, cls = scores.max(axis=1), scores.argmax(axis=1)
    kept: list[tuple[int, Array]] = []
    for i in np.argsort(-best):
        if best[i] < threshold:
            break
        if all(c != cls[i] or overlap(b, xyxy[i]) <= iou for c, b in kept):
            kept.append((int(cls[i]), xyxy[i]))
    return kept


def overlap(a: Array, b: Array) -> float:
    """Intersection over union of two xyxy boxes."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return float(w * h / union) if union > 0 else 0.0


def matched(source: Array, artifact: Array) -> tuple[int, int, int]:
    """Over a batch of outputs [images, 4 + classes, anchors]: how many objects the source finds,
    how many of those the artifact finds too (same class, IoU > 0.5), and how many more it finds."""
    total = kept = extra = 0
    for ref_out, got_out in zip(source, artifact, strict=True):
        ref, got = detections(ref_out), detections(got_out)
        hits = sum(any(c == k and overlap(b, g) > 0.5 for k, g in got) for c, b in ref)
        total, kept = total + len(ref), kept + hits
        extra += sum(not any(c == k and overlap(b, g) > 0.5 for k, b in ref) for c, g in got)
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
