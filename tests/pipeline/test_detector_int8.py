"""A real detector under int8: NudeNet's YOLOv8n (its own ONNX file, real weights) on photos of people.

Its one output concatenates box coordinates in pixels (up to ~570) with class probabilities (0-1).
ONNX Runtime's static int8 gave that concatenation one scale and the probabilities came out 0 or
its step, 1.24: 0-2 of the source's 10 detections left here, yet cosine over the output stayed 0.999
(int8's limit is 0.99) and the gate had passed it. The gate now sees the lost part, and the keep-sensitive
remedy keeps the output's float tail (the decoding after the last convolutions) out of int8."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from tests.support.pretrained_files import nudenet_detector, people_photos

Array = np.ndarray[Any, Any]


def detections(output: Array, threshold: float = 0.25, iou: float = 0.45) -> list[tuple[int, Array]]:
    """YOLOv8's decoding of one image's [4 + classes, anchors]: (class, xyxy box) above the score
    threshold, greedy non-maximum suppression within a class."""
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


def outputs(model: Path, photos: Array) -> Array:
    """The model's output on each photo, [photos, 4 + classes, anchors]."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"images": photo[None]})[0] for photo in photos])


def found(model: Path, photos: Array) -> tuple[int, int]:
    """Of the source's detections on the photos, (how many, how many the model finds too)."""
    total = matched = 0
    for source, artifact in zip(outputs(nudenet_detector(), photos), outputs(model, photos), strict=True):
        ref, got = detections(source), detections(artifact)
        total += len(ref)
        matched += sum(any(c == k and overlap(b, g) > 0.5 for k, g in got) for c, b in ref)
    return total, matched


def test_int8_that_lost_the_class_probabilities_is_refused_and_the_float_tail_keeps_them(
    kompile_run, write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    photos = people_photos()
    dataset = tmp_path / "people.npz"
    np.savez(dataset, images=photos)
    static = {"backend": "onnxruntime", "precision": "int8", "quantization": "static"}
    doc = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "nudenet"},
        "spec": {
            "source": {"uri": str(nudenet_detector())},
            "inputs": [
                {
                    "name": "images",
                    "shape": [-1, 3, 320, 320],
                    "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4}],
                }
            ],
            "targets": [
                {
                    "name": "cpu",
                    "candidates": [
                        static,
                        {**static, "name": "float-tail", "options": {"keepFloat": "sensitive"}},
                    ],
                }
            ],
            "validation": {"dataset": str(dataset)},
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 6},
        },
    }
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = {c["name"]: c for c in t["candidates"]}
    plain, tail = cands["onnxruntime-int8"], cands["float-tail"]
    # Measured here: cosine 0.9995, the probabilities held at 0 (or at 0 and 1.24: "2 values").
    assert plain["reason"] == "ValidationFailed" and plain["minCosine"] >= 0.99
    assert "lost part of it: along axis 1" in plain["message"], plain["message"]
    assert tail["phase"] == "Succeeded" and tail["selected"], tail.get("message")
    assert int(tail["options"]["floatNodes"]) > 2  # the first and last layers and the decoding

    def artifact(candidate: dict[str, Any]) -> Path:
        digest = candidate["artifactDigest"].removeprefix("sha256:")[:12]
        (model,) = (tmp_path / ".kompile" / "artifacts" / "nudenet").glob(f"*-{digest}/nudenet/1/model.onnx")
        return model

    total, kept = found(artifact(tail), photos)
    assert total >= 5  # the source finds faces and more on these photos (10 when measured)
    # Measured: 8 of 10 calibrated on these 6 photos, 9 of 10 with scikit-learn's 2 photos added
    # (OpenVINO's int8: 9 of 10). The gate compares outputs, not detections: a lost box or two
    # passes it where cosine holds.
    assert kept >= 0.7 * total, (kept, total)
    # The refused artifact's probabilities share one int8 step with the boxes' pixels (1.24 here):
    # each is 0 or that step, on any CPU. Which of the two, and so how many objects it still finds,
    # depends on the CPU's int8 arithmetic: 2 of 10 here; CI's CPU once rounded a peak up in every
    # class that scored, and the gate, checking for flat slices only, had passed it.
    assert len(np.unique(outputs(artifact(plain), photos)[:, 4:])) <= 2
