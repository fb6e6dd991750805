"""The gate of `spec.validation.task: detection`: does the artifact find the objects the source finds?

Cosine over a detector's raw output cannot say: NudeNet's YOLOv8n as OpenVINO's int8 (cosine 0.9993
over the output) lost 2 of the source's 10 objects on six photos, added 2, and passed. So each sample's raw
output is decoded as a YOLO head, non-maximum suppression within each class, and the detections of
both are matched: same class, IoU at least 0.5. Two heads (spec.validation.detectionHead): `yolov8`,
Ultralytics' anchor-free exports (YOLOv8, v9, v11: [batch, 4 + classes, anchors] or its transpose,
boxes as centre x, y, width, height, class scores in [0, 1]); `yolov5`, an objectness column after
the box (YOLOv5, YOLOv7, a decoded YOLOX: [batch, anchors, 5 + classes] or its transpose), each
class's score objectness x its probability.

A detection whose score sits near the score threshold flips with any rounding, so the threshold has
a margin each side (hysteresis): the source's detections scored above threshold + margin must be
found, at any score above threshold - margin; the artifact's above threshold + margin must be the
source's, at any score above threshold - margin. The agreement is found / (required + extra): 1.0
when every confident object is found and none is added. Measured on NudeNet (6 photos, threshold
0.25): fp32 artifacts moved scores by under 1e-4, ONNX Runtime int8 with its float tail by up to
0.09, OpenVINO's int8 by up to 0.19 (0.35 to 0.19, 0.16 to 0.35): a margin of 0.05 passes the first
two and refuses the third, which at 0.25 loses 2 of the 10 objects and adds 2.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kompile.api.vocabulary import DetectionHead

Array = np.ndarray[Any, Any]
YOLOV5: DetectionHead = "yolov5"
"""The head with an objectness column."""

MATCH_IOU = 0.5
"""Two detections are one object when their classes agree and their boxes overlap this much."""
NMS_IOU = 0.45
"""Ultralytics' default: within a class, a box overlapping a higher-scored one this much is dropped."""
SCORE_THRESHOLD = 0.25
"""Ultralytics' default confidence threshold, the gate's where spec.validation.tolerances sets none."""
MARGIN = 0.05
"""Scores within this of the threshold are borderline: not required, and not counted as extra."""
_BOX = 4
"""The box's centre x, y, width and height come first in every head."""
MAX_CANDIDATES = 3000
"""At most this many boxes above the low threshold go into NMS per image (Ultralytics: 30000),
so an artifact that scores every anchor high costs seconds, not minutes, to refuse."""


@dataclass(frozen=True)
class Agreement:
    """How one output's detections compare over every sample."""

    required: int
    """The source's detections scored above threshold + margin."""
    found: int
    """Of those, how many the artifact finds too."""
    extra: int
    """The artifact's detections above threshold + margin that the source does not make."""

    @property
    def share(self) -> float:
        """found / (required + extra); 1.0 when there is nothing to find and nothing is added."""
        judged = self.required + self.extra
        return self.found / judged if judged else 1.0


def head_layout(shape: Sequence[int], kind: DetectionHead = "yolov8") -> str | None:
    """How a sample's output holds a YOLO head by its shape alone: 'channels' ([batch, 4 + classes,
    anchors]; yolov5: 5 + classes), 'anchors' ([batch, anchors, 4 + classes]), or None where the
    shape is no YOLO head. Anchors outnumber the channels at the sizes a detector is served at
    (2100 at 320x320 against 84 for COCO's 80 classes); read_layout settles the smaller sizes."""
    layouts = _layouts(shape, kind)
    return layouts[0] if layouts else None


def _layouts(shape: Sequence[int], kind: DetectionHead) -> list[str]:
    """The layouts the shape allows, the likelier first: the longer axis holds the anchors, and the
    other way round is read only where both axes could hold the channels (a small input's head)."""
    if len(shape) != 3:
        return []
    _, a, b = shape
    least = _BOX + 1 + (kind == YOLOV5)  # the box, an objectness column, one class at least
    likelier, channels, other = ("channels", a, "anchors") if b > a else ("anchors", b, "channels")
    if channels < least:
        return []
    return [likelier, other] if min(a, b) >= least else [likelier]


def read_layout(sample: Array, kind: DetectionHead = "yolov8") -> str | None:
    """The layout of one sample's head, read from its values where its shape allows both: the one
    whose scores lie in [0, 1]. At 32x32 NudeNet's head is [1, 22, 21] (21 anchors): by shape alone
    its box coordinates (up to 48) were read as scores."""
    layouts = _layouts(sample.shape, kind)
    fits = [layout for layout in layouts if _score_range(_channels(sample, layout)) is None]
    return next(iter(fits or layouts), None)


def _score_range(head: Array) -> tuple[float, float] | None:
    """The scores' range where it leaves [0, 1] (logits, or box coordinates read as scores)."""
    scores = head[:, _BOX:]
    low, high = float(scores.min(initial=0.0)), float(scores.max(initial=0.0))
    return (low, high) if low < -1e-3 or high > 1 + 1e-3 else None


def layout_problem(name: str, sample: Array, kind: DetectionHead = "yolov8") -> str | None:
    """Why output `name` (one sample of the source's) cannot be judged as a `kind` YOLO head, or None."""
    shape = tuple(int(d) for d in sample.shape)
    layout = read_layout(sample, kind)
    if layout is None:
        parts = "5 + classes" if kind == YOLOV5 else "4 + classes"
        return (
            f"output {name!r} of shape {list(shape)} is no YOLO detection head: task detection reads "
            f"[batch, {parts}, anchors] (or [batch, anchors, {parts}]) as spec.validation.detectionHead "
            f"{kind}; set spec.validation.task to auto for other outputs"
        )
    if out_of_range := _score_range(_channels(sample, layout)):
        low, high = out_of_range
        return (
            f"output {name!r}: its class scores run from {low:.3g} to {high:.3g}, not within [0, 1]: "
            "task detection reads sigmoid scores (an Ultralytics export); set spec.validation.task "
            "to auto for raw logits"
        )
    return None


def _channels(sample: Array, layout: str) -> Array:
    """[batch, 4 + classes, anchors], whichever way the output holds it."""
    arr = np.asarray(sample, dtype=np.float32)
    return arr if layout == "channels" else arr.transpose(0, 2, 1)


def decode(head: Array, low: float, kind: DetectionHead = "yolov8") -> tuple[Array, Array, Array]:
    """One image's [4 + classes, anchors] (yolov5: [5 + classes, anchors]) decoded: xyxy boxes,
    scores and classes of the detections scored above `low` that survive non-maximum suppression
    within their class, best first."""
    scores = head[_BOX + 1 :] * head[_BOX] if kind == YOLOV5 else head[_BOX:]
    best, cls = scores.max(axis=0), scores.argmax(axis=0)
    keep = np.flatnonzero(best > low)
    keep = keep[np.argsort(-best[keep], kind="stable")][:MAX_CANDIDATES]
    cx, cy, w, h = head[:4, keep]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    chosen: list[int] = []
    for i in range(len(keep)):
        same = [j for j in chosen if cls[keep[j]] == cls[keep[i]]]
        if not same or ious(boxes[i], boxes[same]).max() <= NMS_IOU:
            chosen.append(i)
    return boxes[chosen], best[keep[chosen]], cls[keep[chosen]]


def ious(box: Array, others: Array) -> Array:
    """Intersection over union of one xyxy box with each of `others` ([n, 4])."""
    w = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = w * h
    area = (box[2] - box[0]) * (box[3] - box[1])
    union = area + (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def unmatched(
    confident: tuple[Array, Array, Array], anywhere: tuple[Array, Array, Array], high: float
) -> tuple[int, int]:
    """Of `confident`'s detections scored above `high`: how many there are, and how many have no
    detection of their class in `anywhere` overlapping them by MATCH_IOU."""
    boxes, scores, classes = confident
    other_boxes, _, other_classes = anywhere
    count = missed = 0
    for box, score, cls in zip(boxes, scores, classes, strict=True):
        if score <= high:
            continue
        count += 1
        same = other_boxes[other_classes == cls]
        if not len(same) or ious(box, same).max() < MATCH_IOU:
            missed += 1
    return count, missed


def band(threshold: float, margin: float = MARGIN) -> tuple[float, float]:
    """The borderline scores around `threshold`: (low, high), the margin at most half the threshold
    so that low stays above 0."""
    margin = min(margin, threshold / 2)
    return threshold - margin, threshold + margin


def head_output(
    reference: Sequence[Sequence[Array]], names: Sequence[str], kind: DetectionHead = "yolov8"
) -> tuple[int | None, str | None]:
    """The source's first output that reads as a `kind` YOLO head (its index), or why none does (the
    first output's problem)."""
    problems = []
    for j, name in enumerate(names):
        problem = layout_problem(name, np.asarray(reference[0][j]), kind) if reference else "no samples"
        if problem is None:
            return j, None
        problems.append(problem)
    return None, problems[0] if problems else "the model has no outputs"


def agreement(
    source: Sequence[Array],
    artifact: Sequence[Array],
    threshold: float,
    margin: float = MARGIN,
    kind: DetectionHead = "yolov8",
) -> Agreement:
    """The artifact's detections held to the source's over every sample (each sample's output as
    the source's layout holds it, a batch of images), at score `threshold` with `margin` each side."""
    low, high = band(threshold, margin)
    required = found = extra = 0
    for ref, got in zip(source, artifact, strict=True):
        layout = read_layout(np.asarray(ref), kind) or "channels"
        for ref_head, got_head in zip(_channels(ref, layout), _channels(got, layout), strict=True):
            theirs, ours = decode(ref_head, low, kind), decode(got_head, low, kind)
            count, missed = unmatched(theirs, ours, high)
            required, found = required + count, found + count - missed
            extra += unmatched(ours, theirs, high)[1]
    return Agreement(required=required, found=found, extra=extra)


def ultralytics_detector(model: Path) -> str | None:
    """What `model` (an ONNX file) is where it is an Ultralytics detection export whose head task
    detection reads, else None. Ultralytics writes its author, task and class names into the file's
    metadata; the one output must hold 4 + those classes along axis 1 (end-to-end exports such as
    YOLOv10's, [batch, 300, 6] after their own NMS, are not a head to decode)."""
    from kompile.compile_jobs.source_files import SourceError, read_onnx_graph

    try:
        proto = read_onnx_graph(model)
    except (OSError, SourceError):
        return None
    meta = {p.key: p.value for p in proto.metadata_props}
    if meta.get("author") != "Ultralytics" or meta.get("task") != "detect":
        return None
    try:
        names = ast.literal_eval(meta.get("names", ""))  # a Python dict literal: {0: 'person', ...}
    except (ValueError, SyntaxError):
        return None
    outputs = proto.graph.output
    if not isinstance(names, dict) or len(outputs) != 1:
        return None
    dims = outputs[0].type.tensor_type.shape.dim
    if len(dims) != 3 or dims[1].dim_value != _BOX + len(names):
        return None
    version = f" {meta['version']}" if "version" in meta else ""
    return (
        f"an Ultralytics{version} detection export: output {outputs[0].name!r} is [batch, 4 + "
        f"{len(names)} classes, anchors]"
    )
