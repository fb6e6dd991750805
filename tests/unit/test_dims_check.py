"""The inputs and the verdict at shorter sizes of the non-batch dynamic dims
(kompile.compile_jobs.dims_check). The runners here are stand-ins for the source's reference runner
and an artifact's runner."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kompile.api.spec import InputSpec
from kompile.compile_jobs.dims_check import (
    LONGER_GROWTH,
    DimsCheck,
    least_sizes,
    longer_sizes,
    shorter_sizes,
)
from kompile.compile_jobs.export import ExportError
from kompile.compile_jobs.inputs import InputMismatch, resize
from kompile.compile_jobs.run_results import RunResults
from kompile.compile_jobs.validate import default_thresholds

BATCH = {"axis": 0, "name": "batch", "min": 1, "opt": 2, "max": 8}
SIGNATURE = [
    InputSpec.model_validate(
        {
            "name": "ids",
            "dtype": "int64",
            "shape": [-1, -1],
            "dynamicDims": [BATCH, {"axis": 1, "name": "seq", "min": 3, "opt": 16, "max": 64}],
        }
    ),
    InputSpec.model_validate(
        {
            "name": "attention_mask",
            "dtype": "int64",
            "shape": [-1, -1],
            "dynamicDims": [BATCH, {"axis": 1, "name": "seq", "min": 3, "opt": 16, "max": 64}],
        }
    ),
]


def _feed(i: int) -> dict[str, Any]:
    mask = np.ones((2, 16), np.int64)
    mask[1, 10:] = 0  # right-padded, as a tokenizer pads
    return {"ids": np.arange(32, dtype=np.int64).reshape(2, 16) + i, "attention_mask": mask}


class Sums:
    """Stand-in runner: each row's sum of its unmasked ids; `wrong_below` lengths give zeros."""

    def __init__(self, wrong_below: int | None = None) -> None:
        self.wrong_below, self.calls = wrong_below, 0

    def run(self, feed: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
        self.calls += 1
        out = (feed["ids"] * feed["attention_mask"]).sum(1, keepdims=True).astype(np.float32)
        if self.wrong_below is not None and feed["ids"].shape[1] < self.wrong_below:
            out = -out
        return [out]


def _check() -> tuple[DimsCheck, Sums]:
    feeds = [_feed(i) for i in range(3)]
    source = Sums()
    reference = RunResults("eager:m", ["y"], [source.run(f) for f in feeds], feeds)
    source.calls = 0

    def reference_of(inputs: list[dict[str, Any]]) -> RunResults:
        return RunResults("eager:m", ["y"], [source.run(f) for f in inputs], inputs)

    return DimsCheck(SIGNATURE, reference, reference_of), source


def test_each_non_batch_dim_is_checked_at_half_its_opt_but_not_below_its_min() -> None:
    assert shorter_sizes(SIGNATURE, _feed(0)) == {"seq": 8}  # the batch is batch_check's
    short = {"ids": np.zeros((1, 4), np.int64), "attention_mask": np.ones((1, 4), np.int64)}
    assert shorter_sizes(SIGNATURE, short) == {"seq": 3}
    at_min = {"ids": np.zeros((1, 3), np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    assert shorter_sizes(SIGNATURE, at_min) == {}  # no room below: nothing to check


def test_the_cut_keeps_the_leading_tokens_of_every_input_sharing_the_dim() -> None:
    feed = _feed(0)
    short = resize(feed, SIGNATURE, {"seq": 8})
    assert short["ids"].shape == (2, 8) and short["attention_mask"].shape == (2, 8)
    np.testing.assert_array_equal(short["ids"], feed["ids"][:, :8])
    assert short["attention_mask"].sum(1).min() > 0  # a right-padded row keeps tokens to attend to


def test_a_miss_names_the_sizes_and_the_reference_is_computed_once() -> None:
    check, source = _check()
    thresholds = default_thresholds("fp32")
    assert check.failures(Sums(), thresholds) == []
    failures = check.failures(Sums(wrong_below=16), thresholds)
    assert failures and {f.split(":")[0] for f in failures} == {"at seq 3", "at seq 8"}, failures
    assert check.checked == ["seq 3", "seq 8", "seq 64"]
    assert source.calls == 1 + 3 + 1  # once at seq 3, per sample at 8, once at 64, for both artifacts


class Refuses:
    """Stand-in runner that fails on any input."""

    def run(self, feed: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
        raise RuntimeError("the input 'ids' got [2, 8], expected [2, 16]\nmore detail")


def test_an_artifact_failing_there_misses_and_a_source_failing_at_half_opt_skips_the_check() -> None:
    check, _ = _check()
    assert check.failures(Refuses(), default_thresholds("fp32")) == [
        "at seq 3: failed on the reference inputs cut to that size: "
        "the input 'ids' got [2, 8], expected [2, 16]",
        "at seq 8: failed on the reference inputs cut to that size: "
        "the input 'ids' got [2, 8], expected [2, 16]",
        "at seq 64: failed on the reference inputs repeated to that size: "
        "the input 'ids' got [2, 8], expected [2, 16]",
    ]

    def source_refuses(inputs: list[dict[str, Any]]) -> RunResults:
        if inputs[0]["ids"].shape[1] == 8:
            raise InputMismatch("the source model m failed on inputs shaped [2, 8]; check spec.inputs")
        return RunResults("eager:m", ["y"], [Sums().run(f) for f in inputs], inputs)

    narrow = DimsCheck(SIGNATURE, check.reference, source_refuses)
    assert narrow.failures(Sums(), default_thresholds("fp32")) == []  # held at its min and max only
    assert narrow.unchecked == ["seq 8: the source model m failed on inputs shaped [2, 8]"]
    assert narrow.checked == ["seq 3", "seq 64"]

    def eager_refuses(inputs: list[dict[str, Any]]) -> RunResults:
        if inputs[0]["ids"].shape[1] == 8:
            raise ExportError("M failed on inputs shaped {'ids': [2, 8]}: kernel size can't be greater")
        return RunResults("eager:m", ["y"], [Sums().run(f) for f in inputs], inputs)

    assert (
        DimsCheck(SIGNATURE, check.reference, eager_refuses).failures(Sums(), default_thresholds("fp32"))
        == []
    )


def _masked(name: str, dtype: str, mask: np.ndarray[Any, Any]) -> tuple[list[InputSpec], dict[str, Any]]:
    seq = {"axis": 1, "name": "seq", "min": 2, "opt": 6, "max": 8}
    signature = [
        InputSpec.model_validate({"name": n, "dtype": d, "shape": [-1, -1], "dynamicDims": [BATCH, seq]})
        for n, d in (("ids", "int64"), (name, dtype))
    ]
    return signature, {"ids": np.arange(12, dtype=np.int64).reshape(2, 6), name: mask}


def test_a_left_padded_batch_keeps_its_last_tokens_whatever_the_mask_marks() -> None:
    ones = np.array([[0, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1]])
    neg = np.finfo(np.float32).min
    for name, dtype, mask in (
        ("attention_mask", "int64", ones),
        ("attention_mask", "bool", ones.astype(bool)),
        ("attention_mask", "float32", np.where(ones == 1, 0.0, neg).astype(np.float32)),  # additive
        ("src_key_padding_mask", "bool", ones == 0),  # True marks the padding
    ):
        signature, feed = _masked(name, dtype, mask)
        short = resize(feed, signature, {"seq": 3})
        np.testing.assert_array_equal(short["ids"], feed["ids"][:, 3:], err_msg=f"{name} {dtype}")
        np.testing.assert_array_equal(short[name], mask[:, 3:], err_msg=f"{name} {dtype}")


def test_a_right_padded_or_unpadded_batch_keeps_its_first_tokens() -> None:
    right = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    neg = np.finfo(np.float32).min
    for name, dtype, mask in (
        ("attention_mask", "int64", right),
        ("attention_mask", "float32", np.where(right == 1, 0.0, neg).astype(np.float32)),
        ("key_padding_mask", "bool", right == 0),
        ("attention_mask", "int64", np.ones((2, 6), np.int64)),
    ):
        signature, feed = _masked(name, dtype, mask)
        np.testing.assert_array_equal(resize(feed, signature, {"seq": 3})["ids"], feed["ids"][:, :3])


def test_a_source_giving_nan_at_the_shorter_size_skips_the_check() -> None:
    check, _ = _check()

    def empty_rows(inputs: list[dict[str, Any]]) -> RunResults:
        return RunResults("eager:m", ["y"], [[np.full((2, 1), np.nan, np.float32)] for _ in inputs], inputs)

    nan = DimsCheck(SIGNATURE, check.reference, empty_rows)
    assert nan.failures(Sums(), default_thresholds("fp32")) == []  # no artifact can match NaN
    assert [why[:6] for why in nan.unchecked] == ["seq 3:", "seq 8:", "seq 64"] and nan.checked == []
    assert all("NaN or Inf" in why for why in nan.unchecked)


def test_each_non_batch_dim_is_also_checked_at_its_max_within_the_growth_bound() -> None:
    assert longer_sizes(SIGNATURE, _feed(0)) == {"seq": 64}  # 4x the 16 it holds
    at_max = {"ids": np.zeros((1, 64), np.int64), "attention_mask": np.ones((1, 64), np.int64)}
    assert longer_sizes(SIGNATURE, at_max) == {}  # no room above
    short = {"ids": np.zeros((1, 1), np.int64), "attention_mask": np.ones((1, 1), np.int64)}
    assert longer_sizes(SIGNATURE, short) == {"seq": LONGER_GROWTH}  # 64x: stops at the bound


def test_the_longer_inputs_repeat_each_row_along_the_dim() -> None:
    feed = _feed(0)
    long = resize(feed, SIGNATURE, {"seq": 40})
    assert long["ids"].shape == (2, 40) and long["attention_mask"].shape == (2, 40)
    np.testing.assert_array_equal(long["ids"][:, :16], feed["ids"])  # the row first, as it was
    np.testing.assert_array_equal(long["ids"][:, 16:32], feed["ids"])
    np.testing.assert_array_equal(long["attention_mask"][:, 32:], feed["attention_mask"][:, :8])
    left = np.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    signature, masked = _masked("attention_mask", "int64", np.pad(left, ((0, 0), (2, 0))))
    # a row padded on the left ends as it did: its last token stays last
    np.testing.assert_array_equal(
        resize(masked, signature, {"seq": 8})["attention_mask"][:, -6:], masked["attention_mask"]
    )


def test_a_source_failing_at_a_declared_max_refuses_the_spec_before_any_compile() -> None:
    check, _ = _check()

    def positions_up_to_32(inputs: list[dict[str, Any]]) -> RunResults:
        if inputs[0]["ids"].shape[1] > 32:
            raise ExportError(
                "M failed on inputs shaped {'ids': [2, 64]}: index out of range in self; the dynamic "
                "dims were seq=64: a model that needs another size takes it with `--dim seq=...`"
            )
        return RunResults("eager:m", ["y"], [Sums().run(f) for f in inputs], inputs)

    narrow = DimsCheck(SIGNATURE, check.reference, positions_up_to_32)
    with pytest.raises(InputMismatch) as err:
        narrow.prepare()
    assert str(err.value) == (
        "spec.inputs declares seq up to 64, but the source model fails there: M failed on inputs "
        "shaped {'ids': [2, 64]}: index out of range in self; lower that max in "
        "spec.inputs[].dynamicDims (or `--dim NAME=MIN:OPT:MAX`) to the largest size the model holds"
    )


def test_an_artifact_wrong_only_at_the_max_misses_there() -> None:
    check, _ = _check()
    thresholds = default_thresholds("fp32")

    class WrongAbove(Sums):
        def run(self, feed: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
            (out,) = super().run(feed)
            return [-out if feed["ids"].shape[1] > 32 else out]

    (failure, *_) = check.failures(WrongAbove(), thresholds)
    assert failure.startswith("at seq 64: "), failure
    assert check.checked == ["seq 3", "seq 8", "seq 64"]


def test_each_non_batch_dim_is_checked_at_its_min_where_half_opt_is_above_it() -> None:
    assert least_sizes(SIGNATURE, _feed(0)) == {"seq": 3}
    near = {"ids": np.zeros((1, 5), np.int64), "attention_mask": np.ones((1, 5), np.int64)}
    assert least_sizes(SIGNATURE, near) == {}  # half of 5 is below 3: the shorter check is at the min


def test_a_source_failing_at_a_declared_min_refuses_the_spec() -> None:
    check, _ = _check()

    def kernel_of_4(inputs: list[dict[str, Any]]) -> RunResults:
        if inputs[0]["ids"].shape[1] < 4:
            raise ExportError("M failed on inputs shaped {'ids': [2, 3]}: kernel size can't be greater")
        return RunResults("eager:m", ["y"], [Sums().run(f) for f in inputs], inputs)

    with pytest.raises(InputMismatch) as err:
        DimsCheck(SIGNATURE, check.reference, kernel_of_4).prepare()
    assert str(err.value) == (
        "spec.inputs declares seq down to 3, but the source model fails there: M failed on inputs "
        "shaped {'ids': [2, 3]}: kernel size can't be greater; raise that min in "
        "spec.inputs[].dynamicDims (or `--dim NAME=MIN:OPT:MAX`) to the smallest size the model holds"
    )


IMAGE = [
    InputSpec.model_validate(
        {
            "name": "x",
            "shape": [-1, 3, -1, -1],
            "dynamicDims": [
                {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32},
                {"axis": 2, "name": "height", "min": 32, "opt": 224, "max": 512},
                {"axis": 3, "name": "width", "min": 32, "opt": 224, "max": 4096},
            ],
        }
    )
]


def test_a_range_declared_in_steps_is_held_at_sizes_on_those_steps() -> None:
    """Found by running PaddleOCR's DB text detector (rapidocr-onnxruntime's ONNX file), its range
    guessed 32..512 around 224: half of 224 is 112, which the model itself refuses (it needs
    multiples of 32: 'Attempting to broadcast an axis by a dimension other than 1. 7 by 8'), so
    the shorter size was never checked. The step is the greatest common divisor of min, opt and
    max (1 for a sequence declared 1..512 around 128)."""
    feed = {"x": np.zeros((1, 3, 224, 224), np.float32)}
    assert shorter_sizes(IMAGE, feed) == {"height": 96, "width": 96}
    longer = longer_sizes(IMAGE, feed)
    assert all(size % 32 == 0 and size > 224 for size in longer.values()), longer
    assert shorter_sizes(SIGNATURE, _feed(0)) == {"seq": 8}  # 3..64 around 16: a step of 1
