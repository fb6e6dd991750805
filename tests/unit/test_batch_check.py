"""The inputs and the verdict at batch sizes other than the reference's (kompile.compile_jobs.batch_check).
The runners here are stand-ins for an ONNX source's reference runner and an artifact's runner."""

from __future__ import annotations

from typing import Any

import numpy as np

from kompile.api.spec import InputSpec
from kompile.compile_jobs.batch_check import BatchCheck
from kompile.compile_jobs.dims_check import LONGER_GROWTH
from kompile.compile_jobs.run_results import RunResults
from kompile.compile_jobs.validate import default_thresholds

SIGNATURE = [
    InputSpec.model_validate(
        {
            "name": "x",
            "shape": [-1, 3],
            "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}],
        }
    ),
    InputSpec.model_validate({"name": "scale", "shape": [3]}),
]


class Doubles:
    """Stand-in runner: twice its input, scaled; `wrong_after_row` rows on are zeroed."""

    def __init__(self, wrong_after_row: int | None = None) -> None:
        self.wrong_after_row, self.calls = wrong_after_row, 0

    def run(self, feed: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
        self.calls += 1
        out = 2 * feed["x"] * feed["scale"]
        if self.wrong_after_row is not None:
            out[self.wrong_after_row :] = 0
        return [out]


def _check(samples: int = 3) -> tuple[BatchCheck, Doubles]:
    feeds = [
        {"x": np.full((1, 3), i + 1, np.float32), "scale": np.array([1, 2, 3], np.float32)}
        for i in range(samples)
    ]
    source = Doubles()
    reference = RunResults("onnx:m", ["y"], [source.run(f) for f in feeds], feeds)
    source.calls = 0

    def reference_of(inputs: list[dict[str, Any]]) -> RunResults:
        return RunResults("onnx:m", ["y"], [source.run(f) for f in inputs], inputs)

    return BatchCheck(SIGNATURE, reference, reference_of), source


def test_the_feed_stacks_the_reference_samples_and_cycles_them() -> None:
    check, _ = _check()
    feed = check.feed(4)
    assert feed["x"][:, 0].tolist() == [1, 2, 3, 1]  # samples 0, 1, 2, then 0 again
    assert feed["scale"].tolist() == [1, 2, 3]  # no batch dim: as every sample has it
    assert check.feed(2)["x"][:, 0].tolist() == [1, 2]


def test_only_batches_other_than_the_references_need_a_check() -> None:
    check, _ = _check()
    assert check.checked_batch == 1
    assert not check.needs(1) and check.needs(4)
    fixed = [InputSpec.model_validate({"name": "x", "shape": [2, 3]})]
    static = BatchCheck(fixed, check.reference, check.reference_of)
    assert static.checked_batch is None and not static.needs(4)


def test_a_miss_at_a_batch_names_it_and_the_reference_is_computed_once() -> None:
    check, source = _check()
    thresholds = default_thresholds("fp32")
    assert check.failures(4, Doubles(), thresholds) == []
    failures = check.failures(4, Doubles(wrong_after_row=1), thresholds)
    assert failures and all(f.startswith("at batch 4: ") for f in failures), failures
    assert source.calls == 1  # the source ran once at batch 4, for both artifacts


class Refuses:
    """Stand-in runner that fails on any input."""

    def run(self, feed: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
        raise RuntimeError("shape [4, 3] not supported\nmore detail")


def test_an_artifact_failing_at_a_batch_misses_and_the_source_failing_raises() -> None:
    import pytest

    check, _ = _check()
    (failure,) = check.failures(4, Refuses(), default_thresholds("fp32"))
    assert failure == "at batch 4: failed on the reference inputs: shape [4, 3] not supported"

    def source_refuses(inputs: list[dict[str, Any]]) -> RunResults:
        raise ValueError("the source model failed on inputs shaped [4, 3]")

    broken = BatchCheck(SIGNATURE, check.reference, source_refuses)
    with pytest.raises(ValueError, match="the source model failed"):  # the source's, not the artifact's
        broken.failures(4, Doubles(), default_thresholds("fp32"))


def test_the_batch_max_is_checked_unless_timed_or_past_the_growth_bound() -> None:
    check, _ = _check()
    assert check.largest([1]) == 8  # the declared max, timed nowhere
    assert check.largest([1, 8]) is None  # the benchmark holds it there
    wide = [
        InputSpec.model_validate(
            {
                **SIGNATURE[0].to_wire(),
                "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 256}],
            }
        ),
        SIGNATURE[1],
    ]
    assert BatchCheck(wide, check.reference, check.reference_of).largest([1]) == LONGER_GROWTH


def test_a_source_failing_at_the_batch_max_refuses_the_spec() -> None:
    import pytest

    from kompile.compile_jobs.inputs import InputMismatch

    check, _ = _check()

    def one_row(inputs: list[dict[str, Any]]) -> RunResults:
        if inputs[0]["x"].shape[0] > 1:
            raise InputMismatch(
                "the source model m failed on inputs shaped [8, 3]: view(1, -1); check spec.inputs"
            )
        return check.reference_of(inputs)

    with pytest.raises(InputMismatch) as err:
        BatchCheck(SIGNATURE, check.reference, one_row).prepare(8)
    assert str(err.value) == (
        "spec.inputs declares batch up to 8, but the source model fails there: the source model m failed on "
        "inputs shaped [8, 3]: view(1, -1); lower that max in spec.inputs[].dynamicDims (or `--dim "
        "NAME=MIN:OPT:MAX`) to the largest size the model holds"
    )


def test_an_input_holding_the_batch_on_another_axis_is_stacked_along_it() -> None:
    """An RNN's state ([layers, batch, hidden]) carries the batch on axis 1: stacked along axis 0 it
    grew the layers, and the source refused the batch max (the LSTM's initial_h shape)."""
    from tests.unit.test_inputs_and_layout import STATE_SIG

    feeds = [
        {
            "tokens": np.full((1, 5), i, np.int64),
            "h0": np.full((2, 1, 4), 10 + i, np.float32),
            "scale": np.ones(4, np.float32),
        }
        for i in range(3)
    ]
    reference = RunResults("onnx:m", ["y"], [[f["h0"]] for f in feeds], feeds)
    feed = BatchCheck(STATE_SIG, reference, lambda inputs: reference).feed(4)
    assert feed["tokens"].shape == (4, 5) and feed["h0"].shape == (2, 4, 4)
    assert feed["h0"][0, :, 0].tolist() == [10, 11, 12, 10]  # each sample's state beside its tokens
    assert feed["tokens"][:, 0].tolist() == [0, 1, 2, 0] and feed["scale"].shape == (4,)
