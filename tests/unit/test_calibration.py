"""Which reference samples int8 calibrates on (kompile.compile_jobs.calibration): every fourth is
held out, so that the gate judges int8 on inputs calibration never saw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kompile.api.spec import Target
from kompile.compile_jobs.backends.base import CompileRequest
from kompile.compile_jobs.build import compile_request
from kompile.compile_jobs.calibration import calibrating, held_out
from kompile.compile_jobs.dims_check import DimsCheck
from kompile.compile_jobs.run_results import RunResults
from tests.unit.test_dims_check import SIGNATURE, Sums, _feed


@pytest.mark.parametrize(
    ("samples", "out"),
    [(0, []), (1, []), (2, [1]), (3, [2]), (4, [3]), (6, [3]), (8, [3, 7]), (16, [3, 7, 11, 15])],
)
def test_every_fourth_sample_is_held_out_and_one_of_two_or_three(samples: int, out: list[int]) -> None:
    assert held_out(samples) == out
    assert sorted(calibrating(samples) + out) == list(range(samples))


def _request(feeds: list[dict[str, Any]], sized: list[dict[str, Any]] | None = None) -> CompileRequest:
    source = Sums()
    reference = RunResults("eager:m", ["y"], [source.run(f) for f in feeds], feeds)
    target = Target(name="cpu", backend="onnxruntime", precision="int8", quantization="static")
    return compile_request(
        target,
        out_dir=Path("/nonexistent"),
        signature=SIGNATURE,
        reference=reference,
        sized_inputs=sized or (),
    )


def test_calibration_leaves_the_held_out_samples_and_their_outputs_out() -> None:
    feeds = [_feed(i) for i in range(5)]
    request = _request(feeds)
    assert request.held_out_samples == [3]
    assert [int(f["ids"][0, 0]) for f in request.calibration] == [0, 1, 2, 4]
    # Outputs stay paired with their inputs (NNCF's accuracy control reads both by index).
    expected = [Sums().run(f)[0] for f in request.calibration]
    assert all(np.array_equal(o[0], e) for o, e in zip(request.calibration_outputs, expected, strict=True))


def test_a_held_out_sample_stays_unseen_at_the_other_sizes_too() -> None:
    feeds = [_feed(i) for i in range(4)]
    source = Sums()
    reference = RunResults("eager:m", ["y"], [source.run(f) for f in feeds], feeds)

    def reference_of(inputs: list[dict[str, Any]]) -> RunResults:
        return RunResults("eager:m", ["y"], [source.run(f) for f in inputs], inputs)

    dims = DimsCheck(SIGNATURE, reference, reference_of)
    dims.prepare()
    # seq 3 and seq 64 are made from sample 0 alone; seq 8 from every sample, less sample 3.
    starts = sorted(int(f["ids"][0, 0]) for f in dims.inputs)
    assert starts == [0, 0, 0, 1, 2], starts
    request = _request(feeds, dims.inputs)
    assert len(request.calibration_at_sizes) == 3 + 5
    assert all(int(f["ids"][0, 0]) != 3 for f in request.calibration_at_sizes)


def test_one_sample_calibrates_and_nothing_is_held_out() -> None:
    request = _request([_feed(0)])
    assert request.held_out_samples == [] and len(request.calibration) == 1
