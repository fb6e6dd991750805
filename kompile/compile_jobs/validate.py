"""Compare a compiled artifact's outputs with the eager source model's: the verdict and its figures.

Pure numpy: a reference run and a candidate run can happen on different machines and be compared
here from saved arrays (Polygraphy's split between running and comparing).

Thresholds depend on precision. A 1e-5 element bound fails every fp16 build, and rounding error
grows with the values summed, so the element limit is per unit of each output's scale (max(1, its
largest |value|)) and loosens with precision; int8 element errors follow each tensor's calibrated
range, so int8 leans on task-level checks alone: cosine similarity of each sample's output and, for
class scores, top-k agreement. NaN or Inf always fails, and so does a part of an output the artifact
lost (a slice along axis 1 or the last axis that moves in the source and not in the artifact), which
cosine over the whole output misses when that part's values are small beside the rest's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from kompile.api.spec import Tolerances
from kompile.api.status import DetectionCheck, OutputCheck, TaskAccuracy, Thresholds, ValidationResult
from kompile.api.vocabulary import TaskKind as Task
from kompile.compile_jobs import detections

Array = np.ndarray[Any, Any]

# Relative error divides by |reference| + eps. A fixed tiny eps turns every element near zero into a
# huge relative error that says nothing, so eps is scaled to the output's mean magnitude.
REL_EPS_SCALE = 1e-3
REL_EPS_FLOOR = 1e-12
FP32_SCALED_ERROR = 1e-3
"""fp32's element limit per unit of scale; also how close to zero a value is zero to the gate
where a precision has no element limit (int8)."""

_DEFAULTS: dict[str, Thresholds] = {
    # The element limit is per unit of each output's scale, max(1, its largest |value|): rounding
    # error grows with the values summed, so an absolute limit passed small outputs and refused large
    # ones. Measured on MobileNetV2's ImageNet logits (up to 17.7) on real photos: bf16 moved them by
    # 0.54-1.03 and fp16 by 0.09-0.17 at the same top-1, where 0.2 and 0.05 absolute refused both;
    # all-MiniLM's token embeddings (up to 5.6) moved 0.21 at bf16, cosine 0.99997.
    # fp32 graph rewrites (fusions, reordered reductions) moved ResNet-50 logits by 7e-5 and BERT-base
    # hidden states by 4e-6 at most; 1e-3 per unit still catches bugs.
    # With labelled data the task accuracy drop is gated too, in points: fp32 rewrites may flip a
    # near-tie, lower precisions a few more.
    # A detector's detections (task detection) at fp32 must all agree: its rewrites move scores by
    # under 1e-4, far inside the borderline band (kompile.compile_jobs.detections).
    "fp32": Thresholds(
        max_scaled_error=FP32_SCALED_ERROR,
        min_cosine=0.9999,
        min_top_k_agreement=1.0,
        top_k=1,
        max_accuracy_drop=0.1,
        min_detection_agreement=1.0,
    ),
    "fp16": Thresholds(
        max_scaled_error=5e-2,
        min_cosine=0.999,
        min_top_k_agreement=0.99,
        top_k=5,
        max_accuracy_drop=0.5,
        min_detection_agreement=0.98,
    ),
    "bf16": Thresholds(
        max_scaled_error=2e-1,
        min_cosine=0.995,
        min_top_k_agreement=0.99,
        top_k=5,
        max_accuracy_drop=0.5,
        min_detection_agreement=0.98,
    ),
    # int8: element error scales with each tensor's range and its calibration (ResNet-50 logits: 3.1
    # at cosine 0.9997), so no element limit by default; cosine and top-k judge it.
    "int8": Thresholds(
        min_cosine=0.99, min_top_k_agreement=0.9, top_k=5, max_accuracy_drop=1.0, min_detection_agreement=0.95
    ),
}
_DETECTION_FIELDS = ("min_detection_agreement", "detection_score", "detection_margin", "detection_head")


def default_thresholds(precision: str) -> Thresholds:
    """Default thresholds for a precision (fp32, fp16, bf16, int8)."""
    try:
        return _DEFAULTS[precision].model_copy()
    except KeyError:
        raise ValueError(
            f"no validation defaults for precision {precision!r}; use one of {sorted(_DEFAULTS)}"
        ) from None


def gate_precision(precision: str, source_quantized: bool) -> str:
    """The precision whose limits hold an artifact. A source quantized already runs int8 operators
    in every artifact built from it, and each runtime rounds them its own way (OpenVINO's per-call
    zero point of 127 where ONNX Runtime's is 128: one step on every value), so its artifacts are
    held to int8's limits whatever the target's precision."""
    return "int8" if source_quantized else precision


def resolve_thresholds(precision: str, *overrides: Tolerances | None) -> Thresholds:
    """Precision defaults with each override applied in turn (later wins; unset fields keep defaults)."""
    merged = default_thresholds(precision).model_dump()
    for override in overrides:
        if override is None:
            continue
        given = {k: v for k, v in override.model_dump().items() if v is not None}
        if "max_abs_error" in given and "max_scaled_error" not in given:
            merged["max_scaled_error"] = None  # an absolute limit asked for: the one element limit
        merged.update(given)
    return Thresholds(**merged)


def compare(
    reference: Sequence[Sequence[Array]],
    candidate: Sequence[Sequence[Array]],
    output_names: Sequence[str],
    thresholds: Thresholds,
    task: Task = "auto",
    labels: Array | None = None,
    held_out: Collection[int] = (),
) -> ValidationResult:
    """Hold the candidate's outputs to the reference's, per output, over every sample.

    `reference[i][j]` is output j of sample i (each sample may itself be a batch: cosine and top-k
    are taken per row of the leading axis). With `labels` (one class per row, in sample order) the
    task accuracy of both is computed and its drop gated too. `held_out`: the samples static int8
    left out of its calibration, said as such where a failure's worst sample is one of them.
    """
    failures: list[str] = []
    if len(reference) != len(candidate):
        failures.append(f"sample count differs: reference {len(reference)}, candidate {len(candidate)}")
    thresholds = for_task(thresholds, task)
    head, no_head = (
        detections.head_output(reference, output_names, thresholds.detection_head or "yolov8")
        if task == "detection"
        else (None, None)
    )
    checks: list[OutputCheck] = []
    for j, name in enumerate(output_names):
        pairs, problems = _pairs(reference, candidate, j, name)
        failures.extend(problems)
        if problems:
            checks.append(_broken(name, pairs))
            continue
        if _categorical(reference, j):
            check = _measure_categorical(name, pairs)
        else:
            check = _measure(name, pairs, thresholds, _is_class_score(pairs[0][0], task))
        if j == head:
            check.detections = _detections(pairs, thresholds)
        checks.append(check)
        failures.extend(_missed(check, thresholds, held_out))
    if no_head:
        failures.append(f"task detection: {no_head}")
    accuracy = None
    if labels is not None:
        accuracy, problem = task_accuracy(reference, candidate, output_names, labels)
        failures.extend([problem] if problem else _missed_accuracy(accuracy, thresholds))
    return ValidationResult(
        passed=not failures,
        samples=len(reference),
        outputs=checks,
        thresholds=thresholds,
        failures=failures,
        task_accuracy=accuracy,
    )


def for_task(thresholds: Thresholds, task: Task) -> Thresholds:
    """The thresholds that judge `task`: a detector's with their defaults filled in, any other's
    without the detection ones, which judge nothing there."""
    if task != "detection":
        return thresholds.model_copy(update=dict.fromkeys(_DETECTION_FIELDS))
    # Thresholds built without the precision defaults (a saved verdict, a test) judge at fp32's.
    defaults = {
        "min_detection_agreement": 1.0,
        "detection_score": detections.SCORE_THRESHOLD,
        "detection_margin": detections.MARGIN,
        "detection_head": "yolov8",
    }
    given = {k: getattr(thresholds, k) for k in _DETECTION_FIELDS}
    return thresholds.model_copy(update={k: d if given[k] is None else given[k] for k, d in defaults.items()})


def headroom(result: ValidationResult) -> float:
    """How far inside the gate a verdict lies, as a share of each limit's room: 1 where the artifact
    equals the source, 0 at the nearest limit, below 0 past it; -1 for a failure with no room to
    measure (NaN, a lost part of an output). NNCF accuracy control tunes on it, so it judges what the
    gate judges (under task detection, the detections; cosine alone kept a detector's plain int8)."""
    t = result.thresholds
    rooms: list[float] = []
    for check in result.outputs:
        if not check.finite:
            return -1.0
        if check.agreement is not None:  # integer values: equal or not
            limit = 1.0 if t.min_top_k_agreement is None else t.min_top_k_agreement
            rooms.append(_room(check.agreement, limit))
            continue
        rooms.append(_room(check.cosine, t.min_cosine))
        if check.top_k_agreement is not None and t.min_top_k_agreement is not None:
            rooms.append(_room(check.top_k_agreement, t.min_top_k_agreement))
        if check.detections is not None and t.min_detection_agreement is not None:
            rooms.append(_room(check.detections.agreement, t.min_detection_agreement))
        scaled = None if t.max_scaled_error is None else t.max_scaled_error * (check.scale or 1.0)
        limits = (
            (check.max_abs_error, t.max_abs_error),
            (check.max_abs_error, scaled),
            (check.max_rel_error, t.max_rel_error),
        )
        rooms.extend(1.0 - error / limit for error, limit in limits if limit)
    room = min(rooms, default=1.0)
    return room if result.passed or room < 0 else -1.0


def _room(value: float, limit: float) -> float:
    """(value - limit) / (1 - limit) for a measure whose best is 1; a limit of 1 leaves no room to
    share: 1 at it, -1 below."""
    if limit >= 1.0:
        return 1.0 if value >= limit else -1.0
    return (value - limit) / (1.0 - limit)


def _detections(pairs: list[tuple[Array, Array]], t: Thresholds) -> DetectionCheck:
    """The detections of a YOLO head output, the artifact's held to the source's."""
    assert t.detection_score is not None and t.detection_margin is not None
    got = detections.agreement(
        [r for r, _ in pairs],
        [c for _, c in pairs],
        t.detection_score,
        t.detection_margin,
        t.detection_head or "yolov8",
    )
    return DetectionCheck(required=got.required, found=got.found, extra=got.extra, agreement=got.share)


def _score_rows(samples: Sequence[Sequence[Array]], j: int) -> Array:
    """Output j's rows of class scores, in sample order: [rows, classes]; an empty array where
    its samples disagree in class count (an artifact's misshapen output)."""
    rows = [np.asarray(s[j], dtype=np.float64) for s in samples]
    if any(r.ndim == 0 for r in rows) or len({r.shape[-1] for r in rows}) > 1:
        return np.empty((0, 0))
    return np.concatenate([r.reshape(-1, r.shape[-1]) for r in rows])


def _predictions(samples: Sequence[Sequence[Array]], j: int) -> Array:
    """argmax of output j, one per row, in sample order."""
    predictions: Array = np.argmax(_score_rows(samples, j), axis=-1)
    return predictions


def _labelled_output(
    reference: Sequence[Sequence[Array]], output_names: Sequence[str], labels: Array
) -> tuple[int, int] | None:
    """The output read as the labels' class scores, its index and class count. Of the outputs that
    hold one row of scores per label and a class for every label, the one whose argmax the source's
    predictions match the labels on most often (the first of equals): a model with several heads
    (MTCNN's ONet: box offsets [N, 4], landmarks [N, 10], face probabilities [N, 2]) answers the
    labels with one of them, and its first need not be it. Where none has a class for every label,
    the first that fits the rows (labels_problem says what is wrong with the labels)."""
    fitting: list[tuple[int, int]] = []
    for j in range(len(output_names)):
        shapes = {np.asarray(s[j]).shape for s in reference if j < len(s)}
        if len(shapes) != 1:
            continue
        shape = shapes.pop()
        rows_per_sample = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        if shape and shape[-1] >= 2 and rows_per_sample * len(reference) == labels.size:
            fitting.append((j, int(shape[-1])))
    covering = [(j, c) for j, c in fitting if labels.size and labels.min() >= 0 and labels.max() < c]
    if not covering:
        return fitting[0] if fitting else None
    return max(covering, key=lambda found: float(np.mean(_predictions(reference, found[0]) == labels)))


def labels_problem(
    reference: Sequence[Sequence[Array]], output_names: Sequence[str], labels: Array
) -> str | None:
    """Why `labels` cannot score the source's outputs: no output of class scores fits them, or
    they name classes the output does not have (1-based labels, a 1001-class dataset on a
    1000-class model), which would be counted as misses and make the accuracy figures wrong."""
    labels = np.asarray(labels).reshape(-1)
    found = _labelled_output(reference, output_names, labels)
    if found is None:
        return (
            f"no output holds one row of class scores per label ({labels.size} labels): labels need a "
            "classifier output of shape [samples, classes]; drop spec.validation.labelsKey otherwise"
        )
    j, classes = found
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        return (
            f"the labels go from {low} to {high}, and output {output_names[j]!r} has {classes} classes: "
            f"labels are class indices from 0 to {classes - 1} (1-based labels need 1 subtracted)"
        )
    return None


def task_accuracy(
    reference: Sequence[Sequence[Array]],
    candidate: Sequence[Sequence[Array]],
    output_names: Sequence[str],
    labels: Array,
) -> tuple[TaskAccuracy | None, str | None]:
    """Accuracy of the source and of the artifact on `labels`, read from the output that answers
    them (_labelled_output), a near-tie read as the source's answer; or the reason none can be read."""
    labels = np.asarray(labels).reshape(-1)
    found = _labelled_output(reference, output_names, labels)
    if found is None:
        return None, labels_problem(reference, output_names, labels)
    j, name = found[0], output_names[found[0]]
    ref_rows, cand_rows = _score_rows(reference, j), _score_rows(candidate, j)
    if cand_rows.shape != ref_rows.shape:
        return None, f"output {name!r}: the artifact's predictions do not match the labels in number"
    ref = np.argmax(ref_rows, axis=-1)
    # A near-tie the artifact breaks the other way is the source's answer (as in top-k agreement).
    tie = tie_resolution(max(1.0, float(np.abs(ref_rows).max(initial=0.0))))
    cand = np.where(_top_k_agree(ref_rows, cand_rows, 1, tie), ref, np.argmax(cand_rows, axis=-1))
    ref_acc = float(np.mean(ref == labels)) * 100
    acc = float(np.mean(cand == labels)) * 100
    return TaskAccuracy(
        output=name, labelled=int(labels.size), reference=ref_acc, accuracy=acc, drop=ref_acc - acc
    ), None


def _missed_accuracy(acc: TaskAccuracy | None, t: Thresholds) -> list[str]:
    if acc is None or t.max_accuracy_drop is None or acc.drop <= t.max_accuracy_drop + 1e-9:
        return []
    return [
        f"output {acc.output!r}: accuracy {acc.accuracy:.2f}% vs the source's {acc.reference:.2f}% "
        f"on {acc.labelled} labels, a drop of {acc.drop:.2f} points > limit {t.max_accuracy_drop:g}"
    ]


def _pairs(
    reference: Sequence[Sequence[Array]], candidate: Sequence[Sequence[Array]], j: int, name: str
) -> tuple[list[tuple[Array, Array]], list[str]]:
    """The (reference, candidate) arrays of output j, and any structural problem found."""
    pairs: list[tuple[Array, Array]] = []
    problems: list[str] = []
    # Samples whose shapes differ the same way, told once (a detector's box count off in each image).
    misshapen: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for i, (ref_sample, cand_sample) in enumerate(zip(reference, candidate, strict=False)):
        if j >= len(cand_sample) or j >= len(ref_sample):
            problems.append(
                f"output {name!r} missing in sample {i}: reference has {len(ref_sample)} outputs, "
                f"candidate {len(cand_sample)}"
            )
            continue
        ref = np.asarray(ref_sample[j])
        cand = np.asarray(cand_sample[j])
        if ref.shape != cand.shape:
            misshapen.setdefault((cand.shape, ref.shape), []).append(i)
            continue
        pairs.append((ref.astype(np.float64), cand.astype(np.float64)))
    for (cand_shape, ref_shape), samples in misshapen.items():
        problems.append(
            f"output {name!r} {_samples(samples)}: shape {list(cand_shape)} does not match the source "
            f"model's {list(ref_shape)}"
        )
    if not pairs and not problems:
        problems.append(f"output {name!r}: no samples to compare")
    return pairs, problems


def listed(indices: Sequence[int | str]) -> str:
    """Sample indices for a message: the first 8, then "..."."""
    return ", ".join(str(i) for i in indices[:8]) + (", ..." if len(indices) > 8 else "")


def _spans(indices: Sequence[int]) -> str:
    """Ascending indices as runs: "4-21", "0, 2, 5-7" (the first 8 runs)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return listed([f"{a}-{b}" if b > a else str(a) for a, b in runs])


def _samples(indices: list[int]) -> str:
    """ "sample 3", "samples 0-3" or "samples 0, 2" (indices ascending)."""
    if len(indices) == 1:
        return f"sample {indices[0]}"
    if indices[-1] - indices[0] == len(indices) - 1:
        return f"samples {indices[0]}-{indices[-1]}"
    return "samples " + listed(indices)


def _broken(name: str, pairs: list[tuple[Array, Array]]) -> OutputCheck:
    """Figures for an output that could not be compared: every number at its worst."""
    finite = all(bool(np.isfinite(c).all()) for _, c in pairs)
    return OutputCheck(
        name=name, max_abs_error=float("inf"), max_rel_error=float("inf"), cosine=-1.0, finite=finite
    )


def _is_class_score(ref: Array, task: Task) -> bool:
    if task == "classification":
        return ref.ndim >= 1 and ref.shape[-1] >= 2
    if task in ("none", "detection"):
        return False
    return ref.ndim == 2 and ref.shape[1] >= 2


def _categorical(reference: Sequence[Sequence[Array]], j: int) -> bool:
    """An integer or boolean output of the source (a predicted label, a mask): its values are
    answers, equal or not. As floats, label 7 for the source's 3 has cosine 1.0."""
    first = next((np.asarray(s[j]) for s in reference if j < len(s)), None)
    return first is not None and (np.issubdtype(first.dtype, np.integer) or first.dtype == np.bool_)


def _measure_categorical(name: str, pairs: list[tuple[Array, Array]]) -> OutputCheck:
    equal = np.concatenate([(c == r).reshape(-1) for r, c in pairs])
    diff = max((float(np.abs(c - r).max(initial=0.0)) for r, c in pairs), default=0.0)
    cosines = [x for r, c in pairs for x in row_cosines(r, c)]
    return OutputCheck(
        name=name,
        max_abs_error=diff,
        max_rel_error=0.0 if diff == 0.0 else float("inf"),
        cosine=min(cosines) if cosines else 1.0,
        agreement=float(equal.mean()) if equal.size else 1.0,
        finite=all(bool(np.isfinite(c).all()) for _, c in pairs),
    )


def _measure(
    name: str, pairs: list[tuple[Array, Array]], thresholds: Thresholds, classify: bool
) -> OutputCheck:
    finite = all(bool(np.isfinite(c).all()) for _, c in pairs)
    if not finite:
        return OutputCheck(
            name=name,
            max_abs_error=float("nan"),
            max_rel_error=float("nan"),
            cosine=float("nan"),
            finite=False,
        )
    max_abs = 0.0
    max_rel = 0.0
    sizes = [np.abs(ref) for ref, _ in pairs]
    scale = max([1.0, *(float(size.max(initial=0.0)) for size in sizes)])
    zero = _resolution(thresholds, scale)
    cosines: list[float] = []
    worst: tuple[float, int] | None = None
    agree: list[bool] = []
    lost: str | None = None
    for i, ((ref, cand), size) in enumerate(zip(pairs, sizes, strict=True)):
        lost = lost or lost_slices(ref, cand, FP32_SCALED_ERROR * scale)
        diff = np.abs(cand - ref)
        max_abs = max(max_abs, float(diff.max(initial=0.0)))
        eps = max(REL_EPS_FLOOR, REL_EPS_SCALE * float(size.mean())) if ref.size else REL_EPS_FLOOR
        max_rel = max(max_rel, float((diff / (size + eps)).max(initial=0.0)))
        rows = row_cosines(ref, cand, zero)
        cosines.extend(rows)
        if rows and (worst is None or min(rows) < worst[0]):
            worst = (min(rows), i)
        if classify:
            k = effective_top_k(thresholds.top_k, cand)
            agree.extend(_top_k_agree(ref, cand, k, tie_resolution(scale)).tolist())
    return OutputCheck(
        name=name,
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        scale=scale,
        cosine=min(cosines) if cosines else 1.0,
        worst_sample=worst[1] if worst else None,
        top_k_agreement=float(np.mean(agree)) if agree else None,
        top_k=effective_top_k(thresholds.top_k, pairs[0][1]) if agree else None,
        lost_slices=lost,
        finite=True,
    )


LOST_SHARE = 0.1
"""A slice is lost when the artifact's values move by under this share of the source's."""
DISTRIBUTION_FLOOR = 0.1
"""Along a distribution's axis, a class is judged only where the source gives it this much of the
mass somewhere: one that never gets a tenth is no answer anywhere (a text recognizer's 6625-way
softmax, whose classes at 0.001 an int8 output step of 1/255 rounds to 0)."""
DISTRIBUTION_SUM_TOLERANCE = 1e-3
COARSE_SHARE = 0.25
"""Or when it holds them at two values, wrong somewhere by this share of the source's movement
(NudeNet's int8 probabilities at 0 and 1.24: wrong by 0.53-1.3 of it; 1e-5 of it where fp16 rounds a
saturated sigmoid map to 0 and 1)."""


def lost_slices(ref: Array, cand: Array, moves: float) -> str | None:
    """The first slice along axis 1 (else the last axis) of one sample's output (axis 0 is the
    batch) that the artifact lost, as a line for the message; None where there is none. A slice the
    source moves (max - min) by more than `moves` is lost where the artifact moves it by under
    LOST_SHARE of that, or holds it at two values wrong by COARSE_SHARE of that somewhere (an int8
    step as wide as the slice: it can say only on or off). Cosine over a whole row weighs each part
    by its size: a detector's [batch, 4 + classes, anchors] output kept cosine 0.999 under an int8
    that held its class probabilities at 0, or at 0 and 1.24, its step (one scale shared with box
    coordinates up to 316 px; at 0 and 1.24 where a class scored above 0.62)."""
    if ref.ndim < 3 or ref.size == 0:
        # A slice of a [batch, features] row is one value: nothing moves within it. An empty one (a
        # detector's [1, 0, 6]: nothing found) has nothing to lose.
        return None
    for axis in sorted({1, ref.ndim - 1}):
        others = tuple(a for a in range(1, ref.ndim) if a != axis)
        ref_moves, cand_moves = np.ptp(ref, axis=others), np.ptp(cand, axis=others)
        judged = ref_moves > (max(moves, DISTRIBUTION_FLOOR) if _distributions(ref, axis) else moves)
        flat = judged & (cand_moves < LOST_SHARE * ref_moves)
        if flat.any():
            most = float(cand_moves[flat].max())
            return f"{_which(flat, axis, ref_moves)} and by at most {most:.3g} in the artifact"
        error = np.abs(cand - ref).max(axis=others)
        coarse = (
            judged
            & _two_values(cand, others)
            & ~_two_values(ref, others)
            & (error >= COARSE_SHARE * ref_moves)
        )
        if coarse.any():
            first = tuple(int(i[0]) for i in np.nonzero(coarse))
            at = np.moveaxis(cand, axis, 1)[first[0], first[1]]
            low, high = float(at.min()), float(at.max())
            values = f"takes only 2 values in the artifact ({low:.3g} and {high:.3g})"
            return f"{_which(coarse, axis, ref_moves)} and {values}"
    return None


def _which(gone: Array, axis: int, ref_moves: Array) -> str:
    """'along axis 1, slice 5 moves by up to 0.8 in the source' for the slices marked gone."""
    at = sorted({int(i) for i in np.nonzero(gone)[1]})
    which = f"slice {at[0]} moves" if len(at) == 1 else f"slices {_spans(at)} move"
    return f"along axis {axis}, {which} by up to {float(ref_moves[gone].max()):.3g} in the source"


def _distributions(a: Array, axis: int) -> bool:
    """Whether every position holds a probability distribution along `axis` (a softmax over
    classes): its slices are classes, not parts of different sizes."""
    sums = a.sum(axis=axis, dtype=np.float64)
    return bool((a >= 0).all() and np.abs(sums - 1.0).max(initial=0.0) <= DISTRIBUTION_SUM_TOLERANCE)


def _two_values(a: Array, others: tuple[int, ...]) -> Array:
    """Per sample and slice: whether every value is the slice's min or its max."""
    low, high = a.min(axis=others, keepdims=True), a.max(axis=others, keepdims=True)
    return np.asarray(((a == low) | (a == high)).all(axis=others))


def _rows(a: Array) -> Array:
    """One row per sample: the leading axis is the batch when there is more than one axis. Sized
    from the shape, not -1: a detector's [0, 4] boxes (nothing found) are zero rows of 4."""
    return a.reshape(a.shape[0], int(np.prod(a.shape[1:]))) if a.ndim >= 2 else a.reshape(1, -1)


def _resolution(t: Thresholds, scale: float) -> float:
    """How close to zero an output's values are the same as zero to the gate: its element limit
    (the tighter where two apply); without one (int8), fp32's, 1e-3 per unit of scale."""
    scaled = None if t.max_scaled_error is None else t.max_scaled_error * scale
    limits = [x for x in (t.max_abs_error, scaled) if x is not None]
    return min(limits) if limits else FP32_SCALED_ERROR * scale


def row_cosines(ref: Array, cand: Array, zero: float = 0.0) -> list[float]:
    """Cosine similarity per sample row (the leading axis when there is more than one). A row
    where both lie within `zero` of zero has no direction to compare (the 3e-8 left in an empty
    probability map against the artifact's exact zeros): 1.0, the element limit holds it."""
    r, c = _rows(ref), _rows(cand)
    out: list[float] = []
    for rr, cc in zip(r, c, strict=True):
        nr, nc = float(np.linalg.norm(rr)), float(np.linalg.norm(cc))
        near_zero = float(np.abs(rr).max(initial=0.0)) <= zero and float(np.abs(cc).max(initial=0.0)) <= zero
        if (nr == 0.0 and nc == 0.0) or near_zero:
            out.append(1.0)  # both all-zero, or zero to the gate: identical
        elif nr == 0.0 or nc == 0.0:
            out.append(0.0)
        else:
            out.append(float(np.dot(rr, cc) / (nr * nc)))
    return out


def effective_top_k(k: int, scores: Array) -> int:
    """k capped at the number of classes minus one: a top-k that holds every class never fails."""
    return max(1, min(k, int(scores.shape[-1]) - 1))


def _top_k_agree(ref: Array, cand: Array, k: int, tie: float) -> Array:
    """Per row of scores: whether the reference's top-1 class is among the candidate's top-k
    classes, or scores within `tie` of the k-th of them (a near-tie, which argmax breaks by position).

    Set equality of the top-k is brittle on near-ties deep in the list; asking that the source's
    answer survives in the artifact's top-k is what a classifier's user checks.
    """
    r = ref.reshape(-1, ref.shape[-1])
    c = cand.reshape(-1, cand.shape[-1])
    top1 = np.argmax(r, axis=-1)
    kth = -np.sort(-c, axis=-1)[:, k - 1]
    agrees: Array = np.take_along_axis(c, top1[:, None], axis=-1)[:, 0] >= kth - tie
    return agrees


def tie_resolution(scale: float) -> float:
    """Scores closer than this are a tie: fp32's resolution (1e-3 per unit of the output's scale),
    which the fp32 element limit already lets either way. A sigmoid head saturates to 1.0 in
    float32, so two classes can tie exactly in the source and an exact artifact break the tie the
    other way."""
    return FP32_SCALED_ERROR * scale


def _at(check: OutputCheck, held_out: Collection[int]) -> str:
    """Where the worst cosine was: ' at sample 7 (held out of calibration)'."""
    if check.worst_sample is None:
        return ""
    unseen = " (held out of calibration)" if check.worst_sample in held_out else ""
    return f" at sample {check.worst_sample}{unseen}"


def _missed(check: OutputCheck, t: Thresholds, held_out: Collection[int] = ()) -> list[str]:
    """One line per missed threshold: measured vs limit."""
    name = check.name
    if not check.finite:
        return [f"output {name!r}: the artifact produced NaN or Inf"]
    out: list[str] = []
    if check.agreement is not None:  # integer or boolean values: equal or not, nothing else
        limit = 1.0 if t.min_top_k_agreement is None else t.min_top_k_agreement
        if check.agreement < limit:
            out.append(
                f"output {name!r}: {check.agreement:.3f} of its values equal the source's < limit {limit:.3f}"
            )
        return out
    if t.max_abs_error is not None and check.max_abs_error > t.max_abs_error:
        out.append(f"output {name!r}: max abs error {check.max_abs_error:.3g} > limit {t.max_abs_error:.3g}")
    scale = check.scale or 1.0
    if t.max_scaled_error is not None and check.max_abs_error > t.max_scaled_error * scale:
        bound = f"limit {t.max_scaled_error:.3g}"
        if scale > 1.0:
            bound += f" x {scale:.3g} (its largest |value|) = {t.max_scaled_error * scale:.3g}"
        out.append(f"output {name!r}: max abs error {check.max_abs_error:.3g} > {bound}")
    if t.max_rel_error is not None and check.max_rel_error > t.max_rel_error:
        out.append(f"output {name!r}: max rel error {check.max_rel_error:.3g} > limit {t.max_rel_error:.3g}")
    if check.cosine < t.min_cosine:
        out.append(
            f"output {name!r}: cosine {check.cosine:.6f} < limit {t.min_cosine:.6f}{_at(check, held_out)}"
        )
    if check.lost_slices:
        out.append(
            f"output {name!r}: the artifact lost part of it: {check.lost_slices} (values much "
            "smaller than the rest of the output, which cosine does not see)"
        )
    agreement = check.top_k_agreement
    if agreement is not None and t.min_top_k_agreement is not None and agreement < t.min_top_k_agreement:
        out.append(
            f"output {name!r}: top-{check.top_k or t.top_k} agreement {agreement:.3f} "
            f"< limit {t.min_top_k_agreement:.3f}"
        )
    found = check.detections
    if found and t.min_detection_agreement is not None and found.agreement < t.min_detection_agreement:
        assert t.detection_score is not None and t.detection_margin is not None
        low, high = detections.band(t.detection_score, t.detection_margin)
        out.append(
            f"output {name!r}: detection agreement {found.agreement:.3f} < limit "
            f"{t.min_detection_agreement:.3f}: the artifact finds {found.found} of the source's "
            f"{found.required} detections scored above {high:.2f} (at any score above {low:.2f}) and "
            f"adds {found.extra}"
        )
    return out
