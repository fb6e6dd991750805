"""Validation: precision defaults, overrides, and the verdict's figures and failure lines."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kompile.api.spec import Tolerances
from kompile.compile_jobs.validate import compare, default_thresholds, headroom, resolve_thresholds

Array = np.ndarray[Any, Any]


def _rng_outputs(shape: tuple[int, ...], samples: int = 3, seed: int = 0) -> list[list[Array]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(shape).astype(np.float32)] for _ in range(samples)]


def _shifted(outputs: list[list[Array]], delta: float) -> list[list[Array]]:
    return [[a + np.float32(delta) for a in sample] for sample in outputs]


def test_defaults_loosen_with_precision() -> None:
    fp32, fp16, bf16, int8 = (default_thresholds(p) for p in ("fp32", "fp16", "bf16", "int8"))
    assert fp32.max_scaled_error is not None and fp16.max_scaled_error is not None
    assert bf16.max_scaled_error is not None
    assert 1e-5 < fp32.max_scaled_error < fp16.max_scaled_error < bf16.max_scaled_error
    assert fp32.min_cosine > fp16.min_cosine > int8.min_cosine >= 0.99
    assert int8.max_abs_error is None and int8.max_scaled_error is None
    assert all(t.max_abs_error is None for t in (fp32, fp16, bf16))  # absolute only where asked for
    assert int8.min_top_k_agreement is not None
    assert default_thresholds("bf16").min_cosine <= fp16.min_cosine


def test_unknown_precision_is_named() -> None:
    with pytest.raises(ValueError, match="fp8"):
        default_thresholds("fp8")


def test_later_overrides_win_and_unset_fields_keep_defaults() -> None:
    spec_wide = Tolerances(max_abs_error=0.5, min_cosine=0.9)
    target = Tolerances(min_cosine=0.95)
    t = resolve_thresholds("fp32", None, spec_wide, target)
    assert t.max_abs_error == 0.5
    assert t.min_cosine == 0.95
    assert t.top_k == default_thresholds("fp32").top_k


def test_defaults_are_not_shared_state() -> None:
    t = default_thresholds("fp32")
    t.min_cosine = 0.1
    assert default_thresholds("fp32").min_cosine == 0.9999


def test_identical_outputs_pass_with_figures() -> None:
    ref = _rng_outputs((2, 16))
    result = compare(ref, ref, ["y"], default_thresholds("fp32"), task="none")
    assert result.passed, result.failures
    assert result.samples == 3
    check = result.outputs[0]
    assert check.max_abs_error == 0.0 and check.cosine == pytest.approx(1.0)
    assert check.finite and check.top_k_agreement is None


def test_fp32_small_drift_passes_large_fails_with_measured_and_limit() -> None:
    ref = _rng_outputs((1, 64))
    assert compare(ref, _shifted(ref, 1e-4), ["y"], default_thresholds("fp32"), task="none").passed
    result = compare(ref, _shifted(ref, 1e-2), ["y"], default_thresholds("fp32"), task="none")
    assert not result.passed
    line = next(f for f in result.failures if "max abs error" in f)
    assert "'y'" in line and "0.01" in line and "limit 0.001" in line


def test_nan_or_inf_always_fails() -> None:
    ref = _rng_outputs((1, 8))
    bad = [[a.copy() for a in s] for s in ref]
    bad[1][0][0, 3] = np.nan
    loose = resolve_thresholds("int8", Tolerances(min_cosine=-1.0))
    result = compare(ref, bad, ["y"], loose, task="none")
    assert not result.passed
    assert result.outputs[0].finite is False
    assert any("NaN or Inf" in f for f in result.failures)
    bad[1][0][0, 3] = np.inf
    assert not compare(ref, bad, ["y"], loose, task="none").passed


def test_shape_mismatch_fails_clearly() -> None:
    ref = _rng_outputs((2, 8), samples=1)
    cand = [[np.zeros((2, 9), dtype=np.float32)]]
    result = compare(ref, cand, ["logits"], default_thresholds("fp32"))
    assert not result.passed
    assert any("shape [2, 9]" in f and "[2, 8]" in f and "'logits'" in f for f in result.failures)


def test_missing_output_and_sample_count_fail() -> None:
    ref = [[np.ones((1, 4)), np.ones((1, 4))]]
    result = compare(ref, [[np.ones((1, 4))]], ["a", "b"], default_thresholds("fp32"))
    assert not result.passed and any("'b' missing" in f for f in result.failures)
    result = compare(ref + ref, ref, ["a", "b"], default_thresholds("fp32"))
    assert any("sample count" in f for f in result.failures)


def test_cosine_is_the_worst_sample() -> None:
    ref = [[np.array([[1.0, 0.0], [0.0, 1.0]])]]
    cand = [[np.array([[1.0, 0.0], [1.0, 1.0]])]]  # second row is 45 degrees off
    result = compare(ref, cand, ["y"], default_thresholds("int8"), task="none")
    assert result.outputs[0].cosine == pytest.approx(np.cos(np.pi / 4))
    assert any("cosine" in f for f in result.failures)


def test_a_cosine_failure_names_its_worst_sample_and_whether_calibration_saw_it() -> None:
    ref = [[np.array([[1.0, 0.0]])] for _ in range(4)]
    # Sample 1 a little off, sample 3 45 degrees off.
    cand = [[np.array([[1.0, off]])] for off in (0.0, 0.2, 0.0, 1.0)]
    int8 = default_thresholds("int8")
    result = compare(ref, cand, ["y"], int8, task="none", held_out=[3])
    assert result.outputs[0].worst_sample == 3
    assert result.failures == [
        "output 'y': cosine 0.707107 < limit 0.990000 at sample 3 (held out of calibration)"
    ], result.failures
    seen = compare(ref, cand, ["y"], int8, task="none")
    assert seen.failures == ["output 'y': cosine 0.707107 < limit 0.990000 at sample 3"], seen.failures


def test_top_k_agreement_on_auto_detected_class_scores() -> None:
    ref = [[np.array([[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 1.0, 0.0]])]]
    # Row 0: source's best class (1) drops to second place: still within top-2.
    # Row 1: source's best class (0) drops to last place.
    cand = [[np.array([[0.0, 4.0, 4.5, 2.0], [0.0, 1.0, 2.0, 3.0]])]]
    t = resolve_thresholds("int8", Tolerances(top_k=2, min_cosine=-1.0, min_top_k_agreement=0.75))
    result = compare(ref, cand, ["logits"], t, task="auto")
    assert result.outputs[0].top_k_agreement == pytest.approx(0.5)
    assert any("top-2 agreement 0.500 < limit 0.750" in f for f in result.failures)


def test_a_near_tie_the_artifact_breaks_the_other_way_is_not_a_disagreement() -> None:
    """Found by reading: fp32 holds [N, C] outputs to top-1 agreement 1.0, and argmax breaks an
    exact tie by position. A sigmoid head saturates to 1.0 in float32, so two classes tie in the
    source; an exact artifact one float32 step lower on the first flipped the answer and was refused
    with a max abs error of 6e-8. Scores within fp32's resolution of each other (1e-3 per unit of the
    output's scale) are a tie: either answer agrees. A real flip still fails."""
    one_below = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    ref = [[np.array([[1.0, 1.0, 0.2], [0.1, 0.9, 0.3]])]]
    tied = [[np.array([[one_below, 1.0, 0.2], [0.1, 0.9, 0.3]])]]
    exact = compare(ref, tied, ["probs"], default_thresholds("fp32"))
    assert exact.passed and exact.outputs[0].top_k_agreement == 1.0, exact.failures
    flipped = [[np.array([[0.99, 1.0, 0.2], [0.1, 0.9, 0.3]])]]
    t = resolve_thresholds("fp32", Tolerances(max_abs_error=0.1))
    result = compare(ref, flipped, ["probs"], t)
    assert result.outputs[0].top_k_agreement == 0.5
    assert "output 'probs': top-1 agreement 0.500 < limit 1.000" in result.failures, result.failures


def test_a_near_tie_is_read_as_the_sources_answer_in_the_task_accuracy() -> None:
    """The same tie under labels: one flip in 200 samples is 0.5 points, fp32 allows 0.1."""
    one_below = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    labels = np.zeros(200, dtype=np.int64)
    ref = [[np.array([[1.0, 1.0, 0.2]])] for _ in labels]
    cand = [[np.array([[one_below, 1.0, 0.2]])], *ref[1:]]
    verdict = compare(ref, cand, ["probs"], default_thresholds("fp32"), labels=labels)
    assert verdict.passed, verdict.failures
    acc = verdict.task_accuracy
    assert acc is not None and (acc.reference, acc.accuracy, acc.drop) == (100.0, 100.0, 0.0), acc
    # Beyond fp32's resolution the flip counts.
    moved = [[np.array([[0.9, 1.0, 0.2]])], *ref[1:]]
    t = resolve_thresholds("fp32", Tolerances(max_abs_error=0.2))
    refused = compare(ref, moved, ["probs"], t, labels=labels, task="none")
    assert refused.task_accuracy is not None and refused.task_accuracy.drop == pytest.approx(0.5)
    assert any("a drop of 0.50 points > limit 0.1" in f for f in refused.failures), refused.failures
    # An artifact whose class count differs in one sample is told, not read.
    misshapen = [[np.array([[1.0, 1.0]])], *ref[1:]]
    told = compare(ref, misshapen, ["probs"], default_thresholds("fp32"), labels=labels)
    assert told.task_accuracy is None
    assert "output 'probs': the artifact's predictions do not match the labels in number" in told.failures


def test_task_decides_whether_top_k_is_measured() -> None:
    hidden = _rng_outputs((1, 4, 8))  # 3-D hidden states: not class scores under auto
    assert compare(hidden, hidden, ["h"], default_thresholds("fp32")).outputs[0].top_k_agreement is None
    forced = compare(hidden, hidden, ["h"], default_thresholds("fp32"), task="classification")
    assert forced.outputs[0].top_k_agreement == 1.0
    logits = _rng_outputs((2, 10))
    assert (
        compare(logits, logits, ["y"], default_thresholds("fp32"), task="none").outputs[0].top_k_agreement
        is None
    )


def test_relative_error_is_not_blown_up_by_zeros() -> None:
    ref = [[np.array([[0.0, 10.0, -10.0]])]]
    cand = [[np.array([[1e-6, 10.0, -10.0]])]]
    check = compare(ref, cand, ["y"], default_thresholds("fp32"), task="none").outputs[0]
    assert check.max_rel_error < 1e-3


def test_top_k_never_reaches_the_number_of_classes() -> None:
    """With 2 classes a top-5 check holds every class: it could never fail. k is capped at the
    number of classes minus one, so a binary classifier whose answer flips fails."""
    ref = [[np.array([[2.0, 1.0], [2.0, 1.0], [2.0, 1.0], [2.0, 1.0]], np.float32)]]
    flipped = [[np.array([[1.0, 2.0], [2.0, 1.0], [2.0, 1.0], [2.0, 1.0]], np.float32)]]
    t = resolve_thresholds("fp16", Tolerances(max_abs_error=10.0, min_cosine=-1.0))
    assert t.top_k == 5
    result = compare(ref, flipped, ["logits"], t, task="classification")
    assert result.outputs[0].top_k_agreement == 0.75
    assert not result.passed and any("top-1 agreement" in f for f in result.failures), result.failures


def _scores(predictions: list[int], classes: int = 4) -> list[list[Array]]:
    """One sample per prediction: a [1, classes] score row peaked at it."""
    out = []
    for p in predictions:
        row = np.full((1, classes), 0.1, dtype=np.float32)
        row[0, p] = 0.9
        out.append([row])
    return out


def test_labels_gate_the_accuracy_drop_in_points() -> None:
    labels = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    reference = _scores([0, 1, 2, 3, 0, 1, 2, 3, 0, 2])  # 9 of 10 right: 90%
    candidate = _scores([0, 1, 2, 3, 0, 1, 2, 3, 1, 2])  # 8 of 10: 80%
    loose = resolve_thresholds("int8", Tolerances(min_cosine=-1, min_top_k_agreement=0))
    verdict = compare(reference, candidate, ["logits"], loose, labels=labels)
    acc = verdict.task_accuracy
    assert acc is not None and acc.output == "logits" and acc.labelled == 10
    assert (acc.reference, acc.accuracy) == pytest.approx((90.0, 80.0)) and acc.drop == pytest.approx(10.0)
    assert not verdict.passed
    assert verdict.failures == [
        "output 'logits': accuracy 80.00% vs the source's 90.00% on 10 labels, a drop of 10.00 points "
        "> limit 1"
    ]
    allowed = resolve_thresholds(
        "int8", Tolerances(min_cosine=-1, min_top_k_agreement=0, max_accuracy_drop=10)
    )
    assert compare(reference, candidate, ["logits"], allowed, labels=labels).passed
    # The same outputs as the source: no drop, and every other check as before.
    same = compare(reference, reference, ["logits"], default_thresholds("fp32"), labels=labels)
    assert same.passed and same.task_accuracy is not None and same.task_accuracy.drop == 0


def test_labels_outside_the_classes_are_the_datasets_to_fix() -> None:
    """1-based labels (or a 1001-class dataset on a 1000-class model) were counted as misses: the
    source's accuracy read low, the gate compared two wrong figures, and nothing said why."""
    from kompile.compile_jobs.validate import labels_problem

    reference = _scores([0, 1, 2, 3])
    assert labels_problem(reference, ["logits"], np.array([0, 1, 2, 3])) is None
    said = labels_problem(reference, ["logits"], np.array([1, 2, 3, 4]))
    assert said is not None and "from 1 to 4" in said and "4 classes" in said and "0 to 3" in said, said
    said = labels_problem(reference, ["logits"], np.array([1, 2]))
    assert said is not None and "no output holds one row of class scores per label (2 labels)" in said


def _heads(predictions: list[int]) -> list[list[Array]]:
    """A face net's three heads per sample, as MTCNN's ONet returns them: box offsets [1, 4],
    landmarks [1, 10] (regressions whose argmax means nothing) and face probabilities [1, 2]."""
    rng = np.random.default_rng(0)
    return [
        [rng.normal(size=(1, 4)).astype(np.float32), rng.normal(size=(1, 10)).astype(np.float32), probs[0]]
        for probs in _scores(predictions, classes=2)
    ]


def test_labels_are_read_from_the_head_that_predicts_them() -> None:
    """Found by running MTCNN's ONet (facenet-pytorch's weights) on LFW faces and non-faces with
    labels: the first output with a row per label was read, its box offsets, whose argmax met the
    labels 11% of the time where its face probabilities met them 100%; the gate then judged each
    artifact's drift in box offsets as an accuracy drop."""
    labels = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    reference = _heads(list(labels))
    # The artifact's box offsets drift (their argmax moves); its face probabilities hold.
    candidate = [[box[:, ::-1].copy(), marks, probs] for box, marks, probs in reference]
    names = ["boxes", "landmarks", "probs"]
    verdict = compare(reference, candidate, names, default_thresholds("int8"), labels=labels)
    acc = verdict.task_accuracy
    assert acc is not None and acc.output == "probs", acc
    assert (acc.reference, acc.accuracy, acc.drop) == (100.0, 100.0, 0.0)
    assert not any("accuracy" in f for f in verdict.failures), verdict.failures
    # A head without a class for every label is not read: labels 0..4 fit landmarks' 10 columns only.
    wide = np.array([4, 3, 1, 0, 2, 0, 1, 4])
    read = compare(reference, reference, names, default_thresholds("fp32"), labels=wide).task_accuracy
    assert read is not None and read.output == "landmarks", read


def test_accuracy_drop_defaults_by_precision() -> None:
    drops = [default_thresholds(p).max_accuracy_drop for p in ("fp32", "bf16", "fp16", "int8")]
    assert drops == [0.1, 0.5, 0.5, 1.0]


def test_labels_need_a_class_score_output_of_their_length() -> None:
    reference = _rng_outputs((1, 16), samples=3)
    verdict = compare(reference, reference, ["hidden"], default_thresholds("fp32"), labels=np.array([1, 2]))
    assert not verdict.passed and verdict.task_accuracy is None
    assert "no output holds one row of class scores per label (2 labels)" in verdict.failures[0]
    # A batched sample holds one row per label.
    batched = [[np.eye(4, dtype=np.float32)]]
    ok = compare(batched, batched, ["logits"], default_thresholds("fp32"), labels=np.arange(4))
    assert ok.passed and ok.task_accuracy is not None and ok.task_accuracy.reference == 100.0


def test_integer_and_boolean_outputs_are_held_to_exact_agreement() -> None:
    """A predicted label (argmax, int64) or a mask (bool) was compared as floats: label 7 for the
    source's 3 has cosine 1.0 (two positive scalars), and int8 sets no element bound, so an
    artifact that changed every prediction passed."""
    labels = [[np.array([3], dtype=np.int64)] for _ in range(4)]
    changed = [[np.array([7.0], dtype=np.float32)] for _ in range(4)]  # as a runner returns them
    int8 = default_thresholds("int8")
    verdict = compare(labels, changed, ["label"], int8)
    assert not verdict.passed, verdict
    assert verdict.outputs[0].agreement == 0.0
    assert verdict.failures == ["output 'label': 0.000 of its values equal the source's < limit 0.900"]
    same = compare(labels, [[a.astype(np.float32) for a in s] for s in labels], ["label"], int8)
    assert same.passed and same.outputs[0].agreement == 1.0
    # A summary's worst error and cosine are the float outputs': a flipped label is no "error 4".
    scores = [[np.array([[0.1, 0.9]], np.float32)] for _ in range(4)]
    ref = [s + r for s, r in zip(scores, labels, strict=True)]
    both = compare(ref, [s + c for s, c in zip(scores, changed, strict=True)], ["scores", "label"], int8)
    assert both.worst_float_figures() == (0.0, pytest.approx(1.0))
    # A mask: one element in ten may change at int8 (its top-k limit, 0.9), not two.
    mask = np.arange(10) % 2 == 0
    ref = [[mask[None, :]]]
    one, two = mask.copy(), mask.copy()
    one[0] = not one[0]
    two[:2] = ~two[:2]
    assert compare(ref, [[one[None, :]]], ["mask"], int8).passed
    missed = compare(ref, [[two[None, :]]], ["mask"], int8)
    assert not missed.passed and missed.outputs[0].top_k_agreement is None  # no top-k of booleans


def test_the_eager_reference_keeps_integer_outputs_integer() -> None:
    import torch

    from kompile.api.spec import InputSpec
    from kompile.compile_jobs.export import eager_outputs

    class Argmax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return x, x.argmax(-1), x > 0

    spec = InputSpec(name="x", shape=[1, 4])
    (outs,) = eager_outputs(Argmax(), [{"x": np.ones((1, 4), np.float32)}], [spec])
    assert [o.dtype for o in outs] == [np.float32, np.int64, np.bool_]


def test_the_gate_fails_an_artifact_that_ignores_the_attention_mask() -> None:
    """What a trace specialised on an all-ones mask gives (transformers drops an all-ones mask on
    some attention paths): the generated feeds pad, so the gate sees the difference."""
    import torch
    from transformers import BertConfig, BertModel

    from kompile.api.spec import InputSpec
    from kompile.compile_jobs.inputs import generate_feeds

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    bert = BertModel(config, add_pooling_layer=False).eval()
    dims = [{"axis": 0, "name": "batch", "min": 1, "opt": 2, "max": 8}]
    signature = [
        InputSpec.model_validate(
            {"name": n, "dtype": "int64", "shape": [-1, 24], "low": lo, "high": hi, "dynamicDims": dims}
        )
        for n, lo, hi in (("input_ids", 0, 100), ("attention_mask", 1, 2))
    ]
    feeds = generate_feeds(signature, 3, seed=0)

    def run(mask_of: Any) -> list[list[Array]]:
        with torch.no_grad():
            return [
                [
                    bert(
                        input_ids=torch.from_numpy(f["input_ids"]), attention_mask=mask_of(f)
                    ).last_hidden_state.numpy()
                ]
                for f in feeds
            ]

    reference = run(lambda f: torch.from_numpy(f["attention_mask"]))
    maskless = run(lambda f: torch.ones_like(torch.from_numpy(f["attention_mask"])))
    assert compare(reference, reference, ["hidden"], default_thresholds("fp32")).passed
    verdict = compare(reference, maskless, ["hidden"], default_thresholds("fp32"))
    assert not verdict.passed and "max abs error" in verdict.failures[0], verdict.failures


def test_outputs_with_no_rows_compare_as_equal_and_a_changed_count_fails() -> None:
    """A detector returns [detections, 4] boxes, and an image with nothing above its score threshold
    gives zero rows: reshaping (0, 4) to rows crashed the gate ("cannot reshape array of size 0")."""
    empty = [np.zeros((0, 4), np.float32), np.zeros((0,), np.float32), np.zeros((0,), np.int64)]
    found = [np.ones((2, 4), np.float32), np.array([0.9, 0.5], np.float32), np.array([1, 3], np.int64)]
    ref = [empty, found]
    names = ["boxes", "scores", "labels"]
    verdict = compare(ref, [[a.copy() for a in s] for s in ref], names, default_thresholds("fp32"))
    assert verdict.passed, verdict.failures
    assert [c.cosine for c in verdict.outputs] == pytest.approx([1.0, 1.0, 1.0])
    # One more detection in the artifact is a different answer, said as such.
    more = [np.ones((1, 4), np.float32), np.array([0.2], np.float32), np.array([2], np.int64)]
    missed = compare(ref, [more, found], names, default_thresholds("fp32"))
    assert not missed.passed
    assert "output 'boxes' sample 0: shape [1, 4] does not match the source model's [0, 4]" in missed.failures
    # Told once for the samples that differ alike, not once per sample.
    off = compare([empty] * 4, [more] * 3 + [empty], names, default_thresholds("fp32"))
    assert "output 'scores' samples 0-2: shape [1] does not match the source model's [0]" in off.failures
    assert len(off.failures) == 3


def _logits(peak: float, samples: int = 4, classes: int = 1000, seed: int = 0) -> list[list[Array]]:
    """Class scores the size of a real ImageNet classifier's: rows of spread values, one at `peak`."""
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal((1, classes)).astype(np.float32) * (peak / 6) for _ in range(samples)]
    for r in rows:
        r[0, 0] = peak
    return [[r] for r in rows]


def _rounded_to(outputs: list[list[Array]], relative: float, seed: int = 1) -> list[list[Array]]:
    """What a lower-precision build does to each output: every value moved a little and the worst
    by `relative` of the output's largest value (rounding error grows with the magnitudes summed)."""
    rng = np.random.default_rng(seed)
    peak = max(float(np.abs(a).max()) for s in outputs for a in s)
    moved = [
        [a + (rng.uniform(-1, 1, a.shape) * relative * peak / 4).astype(a.dtype) for a in s] for s in outputs
    ]
    moved[0][0].flat[1] = outputs[0][0].flat[1] + relative * peak
    return moved


@pytest.mark.parametrize(
    ("precision", "peak", "relative"), [("bf16", 17.7, 0.04), ("fp16", 17.7, 0.01), ("fp32", 2500.0, 1e-6)]
)
def test_rounding_that_grows_with_the_output_passes(precision: str, peak: float, relative: float) -> None:
    """Measured on torchvision's MobileNetV2 with its ImageNet weights on real photos (logits up
    to 17.7): OpenVINO bf16 moved them by 0.54 (3% of the largest), inductor fp16 by 0.091, at
    cosine 0.9978 and 0.99996, the same top-1; the absolute limits (0.2, 0.05) refused both. At
    fp32 a regressor's output in its own units (a price near 2,500) moves by a few ulps, 2.5e-3,
    which 1e-3 absolute refused."""
    ref = _logits(peak=peak)
    result = compare(ref, _rounded_to(ref, relative), ["logits"], default_thresholds(precision))
    check = result.outputs[0]
    assert check.max_abs_error > relative * peak * 0.9  # the error is as large as said
    assert check.max_abs_error > default_thresholds(precision).max_scaled_error  # type: ignore[operator]
    assert result.passed, result.failures
    assert check.scale == pytest.approx(peak)


def test_an_error_large_for_its_output_still_fails_and_says_its_scale() -> None:
    ref = _logits(peak=17.7)
    broken = [[a.copy() for a in s] for s in ref]
    broken[2][0][0, 7] += 0.3 * 17.7  # one score off by 30% of the largest: a wrong kernel, not rounding
    t = resolve_thresholds("bf16", Tolerances(min_cosine=-1.0, min_top_k_agreement=0.0))
    result = compare(ref, broken, ["logits"], t)
    assert not result.passed
    (line,) = result.failures
    assert line == "output 'logits': max abs error 5.31 > limit 0.2 x 17.7 (its largest |value|) = 3.54"


def test_outputs_within_one_keep_the_absolute_limit() -> None:
    ref = [[np.linspace(-1, 1, 64, dtype=np.float32)[None]]]
    moved = [[ref[0][0].copy()]]
    moved[0][0][0, 5] += 0.25
    result = compare(ref, moved, ["y"], default_thresholds("bf16"), task="none")
    assert result.outputs[0].scale == 1.0
    assert result.failures == ["output 'y': max abs error 0.25 > limit 0.2"]


def test_an_explicit_max_abs_error_is_absolute_and_replaces_the_scaled_default() -> None:
    big = _rng_outputs((1, 64))
    big = [[a * 100 for a in s] for s in big]  # values up to ~300
    # Scaled, fp32's default allows 1e-3 per unit: 0.05 passes on an output of ~300.
    assert compare(big, _shifted(big, 0.05), ["y"], default_thresholds("fp32"), task="none").passed
    strict = resolve_thresholds("fp32", Tolerances(max_abs_error=0.01))
    assert strict.max_scaled_error is None
    result = compare(big, _shifted(big, 0.05), ["y"], strict, task="none")
    assert result.failures == ["output 'y': max abs error 0.05 > limit 0.01"]
    # Set to loosen, on an output within 1: the scaled default (1e-3 there) no longer refuses it.
    small = _rng_outputs((1, 64))
    small = [[a / 10 for a in s] for s in small]
    loose = resolve_thresholds("fp32", Tolerances(max_abs_error=0.01, min_cosine=0.99))
    assert compare(small, _shifted(small, 5e-3), ["y"], loose, task="none").passed
    both = resolve_thresholds("fp32", Tolerances(max_abs_error=0.01, max_scaled_error=1e-4))
    assert both.max_abs_error == 0.01 and both.max_scaled_error == 1e-4


def _empty_map(value: float) -> list[list[Array]]:
    """A probability map with nothing in it ([1, 1, 32, 32]), one tiny value left, as PaddleOCR's
    DB text detector gives on a 32x32 crop of noise."""
    a = np.zeros((1, 1, 32, 32), np.float32)
    a[0, 0, 3, 5] = value
    return [[a]]


def test_rows_within_the_element_limit_of_zero_hold_no_direction_to_compare() -> None:
    """Found by running PaddleOCR's detector (rapidocr-onnxruntime's ONNX file) at its 32x32 min:
    the source's map held one value of 3e-8, ONNX Runtime's fp32 artifact all zeros, and the gate
    refused it at 'cosine 0.000000 < limit 0.999900' (OpenVINO's: 0.72): the direction of a row
    within 3e-8 of zero is rounding, which the element limit already holds."""
    ref = _empty_map(2.98e-8)
    for precision in ("fp32", "bf16", "int8"):
        for cand in (_empty_map(0.0), [[np.roll(ref[0][0], 1)]]):
            result = compare(ref, cand, ["map"], default_thresholds(precision), task="none")
            assert result.passed, (precision, result.failures)
            assert result.outputs[0].cosine == 1.0


def test_a_row_the_artifact_moves_off_zero_still_fails() -> None:
    ref = _empty_map(0.0)
    result = compare(ref, _empty_map(0.3), ["map"], default_thresholds("fp32"), task="none")
    assert result.failures == [
        "output 'map': max abs error 0.3 > limit 0.001",
        "output 'map': cosine 0.000000 < limit 0.999900 at sample 0",
    ], result.failures
    # int8 has no element limit: a row off zero by more than fp32's resolution is a direction.
    result = compare(ref, _empty_map(0.3), ["map"], default_thresholds("int8"), task="none")
    assert result.failures == ["output 'map': cosine 0.000000 < limit 0.990000 at sample 0"], result.failures


def _detections(scores: float, seed: int = 0) -> Array:
    """A YOLOv8-style output [1, 4 + 3 classes, 200 anchors]: box coordinates in pixels (up to 320)
    beside class probabilities, one anchor scoring `scores`, the rest near zero."""
    rng = np.random.default_rng(seed)
    out = np.concatenate([rng.uniform(0, 320, (4, 200)), rng.uniform(0, 0.02, (3, 200))])
    out[5, 17] = scores
    return out[None].astype(np.float32)


def test_class_probabilities_an_artifact_lost_beside_box_pixels_fail_int8() -> None:
    """Found by running NudeNet's YOLOv8n (tests/pipeline/test_detector_int8.py): ONNX Runtime's int8
    held every class probability at 0 (one scale shared with the boxes' pixels) and kept cosine 0.999,
    int8's limit being 0.99; it had passed."""
    ref = [[_detections(0.8, seed)] for seed in range(3)]
    lost = [[np.concatenate([r[0][:, :4] + 0.5, np.zeros_like(r[0][:, 4:])], axis=1)] for r in ref]
    res = compare(ref, lost, ["output0"], default_thresholds("int8"))
    assert res.outputs[0].cosine > 0.999  # what had passed it
    assert not res.passed
    (line,) = res.failures
    # Only class 1's probabilities move beyond fp32's resolution of the output (1e-3 x 320).
    assert "lost part of it: along axis 1, slice 5 moves by up to 0.8" in line
    assert res.outputs[0].lost_slices is not None and "at most 0" in res.outputs[0].lost_slices


def test_class_probabilities_an_artifact_holds_at_two_levels_fail_int8() -> None:
    """The same ONNX Runtime int8 of NudeNet's detector, its concatenated output in steps of 1.24
    (boxes up to 316 px), on the astronaut photo alone: the one class that scored reached 0.81, so
    one anchor rounded up to 1.24, the slice still moved, and the flat-slice check passed it. A
    slice the source grades from 0 to 0.8 that the artifact can only say 0 or 1.24 of is lost too."""
    step = np.float32(1.2421061)
    ref = [[_detections(0.8, seed)] for seed in range(3)]
    coarse = [[np.concatenate([r[0][:, :4], np.round(r[0][:, 4:] / step) * step], axis=1)] for r in ref]
    res = compare(ref, coarse, ["output0"], default_thresholds("int8"))
    assert res.outputs[0].cosine > 0.999
    assert not res.passed
    (line,) = res.failures
    assert "lost part of it: along axis 1, slice 5 moves by up to 0.8 in the source" in line, line
    assert "takes only 2 values in the artifact (0 and 1.24)" in line, line


def test_a_saturated_map_an_artifact_rounds_to_two_levels_passes() -> None:
    """fp16 rounds a sigmoid map's 1e-9 and 0.99999 to 0 and 1: two values, as the source's nearly
    are, and off by 1e-5 at most. Two levels are lost only where they are wrong by a share of the
    slice's movement."""
    rng = np.random.default_rng(3)
    ref = [[np.where(rng.random((1, 2, 16, 16)) > 0.5, 1 - 1e-5, 1e-9).astype(np.float32)]]
    ref[0][0] *= 1 + rng.uniform(0, 1e-6, ref[0][0].shape).astype(np.float32)
    rounded = [[np.round(ref[0][0]).astype(np.float32)]]
    res = compare(ref, rounded, ["mask"], default_thresholds("fp16"), task="none")
    assert res.passed, res.failures


def test_an_int8_artifact_that_keeps_the_probabilities_roughly_passes() -> None:
    ref = [[_detections(0.8, seed)] for seed in range(3)]
    rng = np.random.default_rng(7)
    noisy = []
    for (out,) in ref:  # boxes off by a pixel or so, probabilities in steps of 0.02
        boxes = out[:, :4] + rng.normal(0, 1.0, out[:, :4].shape).astype(np.float32)
        noisy.append([np.concatenate([boxes, np.round(out[:, 4:] * 50) / 50], axis=1)])
    res = compare(ref, noisy, ["output0"], default_thresholds("int8"))
    assert res.passed, res.failures
    assert res.outputs[0].lost_slices is None


def test_parts_that_never_move_beyond_fp32_resolution_are_not_judged_lost() -> None:
    """fp16 flushing a detector's background probabilities (1e-9) to zero loses nothing a user sees:
    they move by less than fp32's resolution of the output (1e-3 x 320)."""
    ref = [[_detections(1e-9)]]
    ref[0][0][:, 4:] = 1e-9
    flushed = [[np.concatenate([ref[0][0][:, :4], np.zeros_like(ref[0][0][:, 4:])], axis=1)]]
    res = compare(ref, flushed, ["output0"], default_thresholds("fp16"))
    assert res.passed, res.failures


def test_classes_a_softmax_never_gives_a_tenth_are_not_parts_to_lose() -> None:
    """A text recognizer's [batch, steps, classes] softmax (PP-OCRv4's, 6625 characters): a class
    that peaks at 0.001 of the mass is no answer anywhere, and an int8 output step (1/255) rounds it
    to 0. Before, the gate called it a lost slice of the output (OpenVINO's int8, "slice 1105 moves
    by up to 0.001"). Along a distribution's axis only a class given a tenth somewhere is judged."""
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 1, (1, 10, 50)).astype(np.float32)
    logits[0, np.arange(10), rng.integers(0, 50, 10)] += 9  # one confident character per step
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ref = [[probs]]
    int8 = [[np.round(probs * 255) / 255]]
    res = compare(ref, int8, ["softmax"], default_thresholds("int8"))
    assert res.outputs[0].cosine > 0.99999
    assert res.passed, res.failures
    # A contender the artifact drops is still lost: one step's runner-up at 0.4 held at 0.
    ref[0][0][0, 3] = 0.0
    ref[0][0][0, 3, :2] = (0.6, 0.4)
    dropped = [[ref[0][0].copy()]]
    dropped[0][0][0, :, 1] = 0.0
    dropped[0][0][0, 3, :3] = (0.9, 0.0, 0.1)
    res = compare(ref, dropped, ["softmax"], default_thresholds("int8"))
    assert any("along axis 2, slice 1 moves by up to 0.4" in f for f in res.failures), res.failures


def test_a_feature_map_channel_the_artifact_flattened_fails_even_fp32() -> None:
    ref = _rng_outputs((1, 8, 6, 6), samples=2)
    flat = [[a.copy() for a in s] for s in ref]
    for s in flat:
        s[0][:, 3] = s[0][:, 3].mean()
    res = compare(ref, flat, ["features"], default_thresholds("fp32"))
    assert any("along axis 1, slice 3 moves" in f for f in res.failures), res.failures


def test_an_empty_output_has_no_slices_to_lose() -> None:
    """A detector's [1, 0, 6] (nothing found): max - min of no values would raise."""
    empty = [[np.zeros((1, 0, 6), dtype=np.float32)]]
    res = compare(empty, [[np.zeros((1, 0, 6), dtype=np.float32)]], ["boxes"], default_thresholds("int8"))
    assert res.passed, res.failures


def test_headroom_is_the_share_of_the_gates_room_left_at_the_nearest_limit() -> None:
    """What NNCF accuracy control tunes on: 1 for the source's own outputs, 0 at a limit, below 0
    past it, and -1 for a failure no room measures."""
    int8 = default_thresholds("int8")  # cosine 0.99: a room of 0.01
    ref = [[np.array([[1.0, 0.0]])]]

    def room(off: float) -> float:
        return headroom(compare(ref, [[np.array([[1.0, off]])]], ["y"], int8, task="none"))

    assert room(0.0) == pytest.approx(1.0)
    cosine = 1 / np.sqrt(1 + 0.05**2)  # 0.99875: an eighth of the room spent
    assert room(0.05) == pytest.approx((cosine - 0.99) / 0.01)
    assert room(0.2) < 0  # cosine 0.981, past the limit
    nan = compare(ref, [[np.array([[np.nan, 0.0]])]], ["y"], int8, task="none")
    assert headroom(nan) == -1.0
    # Integer outputs: the share of values equal, against int8's 0.9; at fp32 all must be, no room.
    ids, off = [[np.array([[1, 2, 3]])]], [[np.array([[1, 2, 4]])]]
    assert headroom(compare(ids, ids, ["ids"], int8)) == 1.0
    assert headroom(compare(ids, off, ["ids"], int8)) == pytest.approx((2 / 3 - 0.9) / 0.1)
    assert headroom(compare(ids, off, ["ids"], default_thresholds("fp32"))) == -1.0
