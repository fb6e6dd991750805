"""A python:// factory or module that raises is the user's code failing, said as such with where
(file:line) and what to change, exit 2. It was "kompile failed unexpectedly ... This is a bug in
kompile" for a factory whose weights file was missing or whose state_dict did not fit, and for a
module that failed at import with anything but an ImportError."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from kompile.compile_jobs.sources import SourceError, _load_python

FACTORIES = """
import torch


def needs_weights():
    model = torch.nn.Linear(4, 2)
    model.load_state_dict(torch.load("weights/missing.pt"))
    return model


def wrong_keys():
    model = torch.nn.Linear(4, 2)
    model.load_state_dict({"weight": torch.zeros(3, 3)})
    return model
"""


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    saved = list(sys.path)
    yield
    sys.path[:] = saved
    for name in [m for m in sys.modules if m in ("userfactories", "brokenmodule")]:
        del sys.modules[name]


def _error(uri: str, folder: Path) -> str:
    with pytest.raises(SourceError) as info:
        _load_python(uri, folder)
    return str(info.value)


def test_a_missing_weights_file_says_where_relative_paths_resolve(tmp_path: Path) -> None:
    (tmp_path / "userfactories.py").write_text(FACTORIES)
    message = _error("python://userfactories:needs_weights", tmp_path)
    assert "needs_weights() raised FileNotFoundError" in message, message
    assert "weights/missing.pt" in message and "userfactories.py:7" in message, message
    assert "Path(__file__).parent" in message and str(Path.cwd()) in message, message


def test_a_state_dict_that_does_not_fit_is_the_factory_failing(tmp_path: Path) -> None:
    (tmp_path / "userfactories.py").write_text(FACTORIES)
    message = _error("python://userfactories:wrong_keys", tmp_path)
    assert "wrong_keys() raised RuntimeError: Error(s) in loading state_dict for Linear" in message
    assert "userfactories.py:13" in message, message


def test_a_module_failing_at_import_is_named(tmp_path: Path) -> None:
    (tmp_path / "brokenmodule.py").write_text("import torch\nVALUE = undefined_name\n")
    message = _error("python://brokenmodule:make", tmp_path)
    assert "cannot import 'brokenmodule'" in message and "NameError" in message, message
    assert "brokenmodule.py:2" in message, message


class _IndexesPastTheEnd(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = [x]
        return heads[1]


def _reference_error(model: torch.nn.Module) -> str:
    """The reference run's error for `model` on one input x of shape [1, 4]."""
    from kompile.api.spec import InputSpec
    from kompile.compile_jobs.export import ExportError, eager_outputs
    from kompile.compile_jobs.source_module import adapt

    spec = [InputSpec(name="x", shape=[1, 4])]
    module = adapt(model, spec, [torch.zeros(1, 4)])
    with pytest.raises(ExportError) as info:
        eager_outputs(module, [{"x": np.zeros((1, 4), np.float32)}], spec)
    return str(info.value)


def test_a_forward_that_raises_is_the_models_error_with_its_line() -> None:
    """An IndexError in forward() escaped both the input adapter and the reference run."""
    message = _reference_error(_IndexesPastTheEnd())
    assert "IndexError: list index out of range" in message, message
    assert "test_python_source_errors.py:" in message, message


class _ReadsAnotherKey(torch.nn.Module):
    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["pixels"] * 2


def test_a_dict_forward_missing_a_key_says_how_forward_was_called() -> None:
    message = _reference_error(_ReadsAnotherKey())
    assert "KeyError: 'pixels'" in message and "test_python_source_errors.py:" in message, message
    assert "forward(batch) was called with spec.inputs x as one dict keyed by name" in message, message


def test_a_single_input_named_otherwise_than_forwards_parameter_is_no_hint() -> None:
    """nn.Sequential's forward(input) gets spec.inputs x all the same: naming it would mislead."""
    message = _reference_error(torch.nn.Sequential(torch.nn.Linear(3, 2)))
    assert "was called with" not in message, message


def test_a_float64_module_is_told_to_become_float32() -> None:
    """It was told to "set dtype: float64" on its inputs, a dtype the CRD refuses."""
    message = _reference_error(torch.nn.Linear(4, 2).double())
    assert "weights are float64, which kompile does not compile" in message, message
    assert ".float()" in message and "dtype: float64" not in message, message


class _TakesAny(torch.nn.Module):
    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return tensors[0][5]


def test_a_forward_taking_any_number_of_tensors_gets_no_call_hint() -> None:
    """forward(*tensors) (a .pt2 called as exported) takes what it is given: "forward() was called
    with spec.inputs x in that order" said nothing true about why it failed."""
    message = _reference_error(_TakesAny())
    assert "IndexError" in message and "was called with" not in message, message
