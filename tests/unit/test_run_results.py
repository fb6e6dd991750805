"""Saved run results (reference.npz, outputs.npz) read back by `kompile compare`: a file that is
not one says what it is instead and what compare takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kompile.compile_jobs.run_results import RunResults, RunResultsError


def test_results_round_trip(tmp_path: Path) -> None:
    saved = RunResults("eager:m", ["y"], [[np.ones((1, 2), np.float32)]], [{"x": np.zeros((1, 3))}])
    back = RunResults.load(saved.save(tmp_path / "reference.npz"))
    assert back.output_names == ["y"] and np.array_equal(back.outputs[0][0], saved.outputs[0][0])


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("apiVersion: kompile.dev/v1alpha1\n", "not an .npz archive"),
        ("npz-without-meta", "written by something other than kompile run"),
    ],
    ids=["yaml", "other-npz"],
)
def test_a_file_that_is_not_saved_results_says_what_compare_takes(
    tmp_path: Path, content: str, said: str
) -> None:
    path = tmp_path / "given"
    if content == "npz-without-meta":
        with path.open("wb") as f:
            np.savez(f, weights=np.ones(3))
    else:
        path.write_text(content)
    with pytest.raises(RunResultsError) as caught:
        RunResults.load(path)
    message = str(caught.value)
    assert said in message and "reference.npz" in message, message
    assert "pickle" not in message, message  # numpy's advice for a file of another kind
    assert message.count("not kompile run results") == 1, message
