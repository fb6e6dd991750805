"""spec.validation.task detection: YOLO heads decoded, detections matched with a borderline band."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kompile.api.status import ValidationResult
from kompile.compile_jobs import detections, validate

Array = np.ndarray[Any, Any]
CLASSES = 3
ANCHORS = 40


def head(*boxes: tuple[float, float, float, float, int, float]) -> Array:
    """One image's [1, 4 + classes, anchors] output holding the given (cx, cy, w, h, class, score)
    boxes at the first anchors, every other anchor scored 0.01."""
    out = np.full((1, 4 + CLASSES, ANCHORS), 0.01, dtype=np.float32)
    out[0, :4] = 10.0
    for i, (cx, cy, w, h, cls, score) in enumerate(boxes):
        out[0, :4, i] = (cx, cy, w, h)
        out[0, 4 + cls, i] = score
    return out


FACE = (50.0, 50.0, 20.0, 20.0, 0)
HAND = (150.0, 80.0, 30.0, 10.0, 1)


def agree(source: Array, artifact: Array, threshold: float = 0.25) -> detections.Agreement:
    return detections.agreement([source], [artifact], threshold, 0.05)


def test_layouts_are_read_either_way_round_and_other_shapes_are_named() -> None:
    assert detections.head_layout((1, 84, 2100)) == "channels"
    assert detections.head_layout((1, 2100, 84)) == "anchors"
    assert detections.head_layout((1, 1000)) is None
    assert detections.head_layout((1, 4, 100)) is None  # boxes with no class
    problem = detections.layout_problem("logits", np.zeros((1, 1000), np.float32))
    assert problem and "'logits' of shape [1, 1000] is no YOLO detection head" in problem
    raw = head((*FACE, 0.9))
    raw[0, 4:] -= 5.0  # logits, not sigmoid scores
    problem = detections.layout_problem("output0", raw)
    assert problem and "not within [0, 1]" in problem


def test_nms_keeps_the_best_of_overlapping_boxes_of_one_class_and_both_of_two_classes() -> None:
    out = head((*FACE, 0.9), (52.0, 50.0, 20.0, 20.0, 0, 0.8), (50.0, 50.0, 20.0, 20.0, 1, 0.7))
    boxes, scores, classes = detections.decode(out[0], 0.2)
    assert scores.tolist() == pytest.approx([0.9, 0.7])
    assert classes.tolist() == [0, 1]
    assert boxes[0].tolist() == pytest.approx([40.0, 40.0, 60.0, 60.0])


def test_a_confident_object_must_be_found_at_any_score_above_the_band() -> None:
    source = head((*FACE, 0.8), (*HAND, 0.6))
    assert agree(source, head((*FACE, 0.22), (*HAND, 0.6))).share == 1.0  # 0.22 > 0.20
    lost = agree(source, head((*FACE, 0.18), (*HAND, 0.6)))
    assert (lost.required, lost.found, lost.extra, lost.share) == (2, 1, 0, 0.5)


def test_borderline_scores_are_neither_required_nor_extra() -> None:
    source = head((*FACE, 0.27), (*HAND, 0.9))  # 0.27 within 0.25 +- 0.05
    got = agree(source, head((*HAND, 0.9)))
    assert (got.required, got.found, got.extra) == (1, 1, 0)
    added = agree(head((*HAND, 0.9)), head((*FACE, 0.29), (*HAND, 0.9)))
    assert added.extra == 0 and added.share == 1.0


def test_an_added_or_moved_or_reclassed_object_is_extra() -> None:
    source = head((*HAND, 0.9))
    added = agree(source, head((*FACE, 0.5), (*HAND, 0.9)))
    assert (added.required, added.found, added.extra) == (1, 1, 1) and added.share == 0.5
    moved = agree(source, head((180.0, 80.0, 30.0, 10.0, 1, 0.9)))  # IoU 0 with the source's
    assert (moved.found, moved.extra) == (0, 1)
    reclassed = agree(source, head((150.0, 80.0, 30.0, 10.0, 2, 0.9)))
    assert (reclassed.found, reclassed.extra) == (0, 1)


def test_nothing_to_find_and_nothing_added_agrees() -> None:
    assert agree(head(), head()).share == 1.0


def test_transposed_heads_and_batches_of_images_are_judged_per_image() -> None:
    source = np.concatenate([head((*FACE, 0.9)), head((*HAND, 0.9))]).transpose(0, 2, 1)
    artifact = np.concatenate([head((*FACE, 0.9)), head()]).transpose(0, 2, 1)
    got = agree(source, artifact)
    assert (got.required, got.found, got.extra) == (2, 1, 0)


def verdict(source: Array, artifact: Array, precision: str = "int8", **tolerances: float) -> ValidationResult:
    from kompile.api.spec_targets import Tolerances

    thresholds = validate.resolve_thresholds(precision, Tolerances(**tolerances) if tolerances else None)
    return validate.compare([[source]], [[artifact]], ["output0"], thresholds, "detection")


def test_the_gate_refuses_a_lost_object_where_cosine_passes_it() -> None:
    objects = [(*FACE, 0.8)] + [(20.0 * i, 100.0, 8.0, 8.0, 1, 0.9) for i in range(1, 10)]
    source = head(*objects)
    artifact = head((*FACE, 0.1), *objects[1:])
    result = verdict(source, artifact)
    assert result.outputs[0].cosine > 0.99  # what the gate had judged alone
    assert result.failures == [
        "output 'output0': detection agreement 0.900 < limit 0.950: the artifact finds 9 of the "
        "source's 10 detections scored above 0.30 (at any score above 0.20) and adds 0"
    ]
    check = result.outputs[0].detections
    assert check is not None and (check.required, check.found, check.extra) == (10, 9, 0)
    assert result.thresholds.min_detection_agreement == 0.95  # int8's default
    # A user who accepts one loss in ten says so.
    assert verdict(source, artifact, minDetectionAgreement=0.9).passed


def test_fp32_needs_every_object_and_the_threshold_is_the_users() -> None:
    source = head((*FACE, 0.6), (*HAND, 0.9))
    artifact = head((*FACE, 0.45), (*HAND, 0.9))
    assert verdict(source, artifact, "fp32", minCosine=0.5, maxScaledError=1.0).passed
    at_half = verdict(source, artifact, "fp32", minCosine=0.5, maxScaledError=1.0, detectionScore=0.5)
    assert not at_half.passed and at_half.thresholds.detection_score == 0.5
    assert at_half.thresholds.min_detection_agreement == 1.0


def test_other_tasks_carry_no_detection_thresholds() -> None:
    out = np.ones((1, 10), np.float32)
    result = validate.compare([[out]], [[out]], ["y"], validate.default_thresholds("int8"), "auto")
    assert result.passed and result.outputs[0].detections is None
    dumped = result.thresholds.model_dump(by_alias=True, exclude_none=True)
    assert not {"minDetectionAgreement", "detectionScore", "detectionMargin"} & set(dumped)


def test_a_detection_task_without_a_yolo_head_fails_saying_why() -> None:
    out = np.ones((1, 10), np.float32)
    result = validate.compare([[out]], [[out]], ["y"], validate.default_thresholds("fp32"), "detection")
    assert not result.passed
    assert result.failures == [
        "task detection: output 'y' of shape [1, 10] is no YOLO detection head: task detection reads "
        "[batch, 4 + classes, anchors] (or [batch, anchors, 4 + classes]) as "
        "spec.validation.detectionHead yolov8; set spec.validation.task to auto for other outputs"
    ]


def test_a_verdict_with_detections_round_trips_in_status() -> None:
    result = verdict(head((*FACE, 0.8)), head((*FACE, 0.8)))
    doc = result.model_dump(by_alias=True, exclude_none=True)
    assert doc["outputs"][0]["detections"] == {"required": 1, "found": 1, "extra": 0, "agreement": 1.0}
    assert doc["thresholds"]["detectionScore"] == 0.25 and doc["thresholds"]["detectionMargin"] == 0.05
    assert ValidationResult.model_validate(doc) == result


def test_kompile_compare_judges_detections_when_told(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kompile.cli import EXIT_TARGET_FAILED, app
    from kompile.compile_jobs.run_results import RunResults

    objects = [(*FACE, 0.8)] + [(20.0 * i, 100.0, 8.0, 8.0, 1, 0.9) for i in range(1, 10)]
    feeds = [{"images": np.zeros((1, 3, 8, 8), np.float32)}]
    source = RunResults("eager:yolo", ["output0"], [[head(*objects)]], feeds)
    lost = RunResults("openvino-int8", ["output0"], [[head((*FACE, 0.1), *objects[1:])]], feeds)
    a, b = source.save(tmp_path / "reference.npz"), lost.save(tmp_path / "outputs.npz")
    runner = CliRunner()
    told = runner.invoke(app, ["compare", str(a), str(b), "--precision", "int8", "--task", "detection"])
    assert told.exit_code == EXIT_TARGET_FAILED, told.output
    text = " ".join(told.output.split())
    assert "detections: 9 of 10 found, 0 added, agreement 0.900" in text, text
    assert "detection agreement 0.900 < limit 0.950" in text, text
    untold = runner.invoke(app, ["compare", str(a), str(b), "--precision", "int8"])
    assert untold.exit_code == 0, untold.output  # cosine alone passes it


def test_headroom_under_task_detection_is_spent_by_a_lost_object_where_cosine_keeps_it() -> None:
    """NNCF accuracy control tunes on validate.headroom: a detector's lost object spends the
    detections' room (agreement 0.9 against int8's 0.95) though cosine leaves most of its own."""
    objects = [(*FACE, 0.8)] + [(20.0 * i, 100.0, 8.0, 8.0, 1, 0.9) for i in range(1, 10)]
    source = head(*objects)
    lost = verdict(source, head((*FACE, 0.1), *objects[1:]))
    assert lost.outputs[0].cosine > 0.99
    assert validate.headroom(lost) == pytest.approx((0.9 - 0.95) / 0.05)
    assert validate.headroom(verdict(source, source)) == pytest.approx(1.0)


def v5_head(*boxes: tuple[float, float, float, float, int, float, float]) -> Array:
    """One image's YOLOv5-style [1, anchors, 5 + classes] output holding the given (cx, cy, w, h,
    class, objectness, class probability) boxes at the first anchors; every other anchor has
    objectness 0.01 and each class's probability 1/3."""
    out = np.full((1, ANCHORS, 5 + CLASSES), 1 / CLASSES, dtype=np.float32)
    out[0, :, :4] = 10.0
    out[0, :, 4] = 0.01
    for i, (cx, cy, w, h, cls, objectness, probability) in enumerate(boxes):
        out[0, i, :4] = (cx, cy, w, h)
        out[0, i, 4] = objectness
        out[0, i, 5:] = 0.05  # YOLOv5's class probabilities are sigmoids each: no sum to 1
        out[0, i, 5 + cls] = probability
    return out


def test_a_yolov5_head_scores_each_class_by_objectness_times_its_probability() -> None:
    """YOLOv5 and v7 put an objectness column after the box: a class scores objectness x its
    probability. Read as a YOLOv8 head (no objectness), objectness would be class 0, and each
    background anchor's conditional probability (here 1/3) a detection."""
    thresholds = validate.resolve_thresholds("int8").model_copy(update={"detection_head": "yolov5"})
    face = v5_head((*FACE, 0.9, 0.8))  # scores 0.72
    faint = v5_head((*FACE, 0.9, 0.3))  # scores 0.27: borderline, neither required nor extra
    assert detections.agreement([face], [face], 0.25, 0.05, "yolov5") == detections.Agreement(1, 1, 0)
    assert detections.agreement([face], [v5_head()], 0.25, 0.05, "yolov5") == detections.Agreement(1, 0, 0)
    assert detections.agreement([face], [faint], 0.25, 0.05, "yolov5") == detections.Agreement(1, 1, 0)
    lost = validate.compare([[face]], [[v5_head((*FACE, 0.1, 0.8))]], ["output0"], thresholds, "detection")
    assert lost.thresholds.detection_head == "yolov5"
    assert lost.failures == [
        "output 'output0': detection agreement 0.000 < limit 0.950: the artifact finds 0 of the "
        "source's 1 detections scored above 0.30 (at any score above 0.20) and adds 0"
    ]
    misread = detections.agreement([face], [face], 0.25, 0.05)  # as yolov8: 1 + 8 background
    assert misread.required > 1
    # Five columns cannot hold a box, objectness and a class.
    assert detections.head_layout((1, 8400, 5), "yolov5") is None
    assert detections.head_layout((1, 8400, 5)) == "anchors"


def test_kompile_compare_reads_a_yolov5_head_when_told(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kompile.cli import EXIT_TARGET_FAILED, app
    from kompile.compile_jobs.run_results import RunResults

    feeds = [{"images": np.zeros((1, 3, 8, 8), np.float32)}]
    source = RunResults("eager:yolov5", ["output0"], [[v5_head((*FACE, 0.9, 0.8))]], feeds)
    lost = RunResults("openvino-int8", ["output0"], [[v5_head((*FACE, 0.1, 0.8))]], feeds)
    a, b = source.save(tmp_path / "reference.npz"), lost.save(tmp_path / "outputs.npz")
    runner = CliRunner()
    args = ["compare", str(a), str(b), "--precision", "int8", "--task", "detection"]
    told = runner.invoke(app, [*args, "--detection-head", "yolov5"])
    assert told.exit_code == EXIT_TARGET_FAILED, told.output
    assert "detections: 0 of 1 found, 0 added" in " ".join(told.output.split()), told.output
    wrong = runner.invoke(app, [*args, "--detection-head", "yolov7"])
    assert wrong.exit_code != 0 and "use yolov8 or yolov5" in wrong.output, wrong.output


def test_a_small_inputs_head_with_fewer_anchors_than_channels_is_read_by_its_values() -> None:
    """[1, 7, 6]: 4 + 3 classes over 6 anchors (a small input). By shape alone it reads as
    transposed, boxes as scores; its values say which way round it is."""
    small = head((*FACE, 0.9), (*HAND, 0.8))[:, :, :6]
    assert small.shape == (1, 7, 6) and detections.head_layout(small.shape) == "anchors"
    assert detections.read_layout(small) == "channels"
    assert detections.layout_problem("output0", small) is None
    assert agree(small, small) == detections.Agreement(2, 2, 0)
    assert detections.read_layout(small.transpose(0, 2, 1)) == "anchors"
    # Where neither way round holds scores in [0, 1], the shape's reading is named.
    logits = small.copy()
    logits[0, 4:] += 5.0
    problem = detections.layout_problem("output0", logits)
    assert problem and "not within [0, 1]" in problem
