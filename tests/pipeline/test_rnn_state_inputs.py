"""An RNN that takes its state as inputs: an LSTM tagger's tokens are [batch, seq] and its initial
state [layers, batch, hidden], the batch on axis 1. `kompile run lstm.onnx` guessed the state's
batch as another dim (1..256, opt 16) beside the tokens' (1..32, opt 1), and the source refused
its own reference inputs ("Input initial_h must have shape {1,1,96}. Actual:{1,16,96}"); given
one range, the batch check stacked the state along axis 0 (growing the layers) and refused the
batch max. Now a dim name is one range in every input, each input is batched along the axis that
holds it, and a dataset holds the state's samples on that axis."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tests.pipeline.conftest import small_cnn_doc

VOCAB, HIDDEN, LAYERS, SEQ = 50, 24, 2, 6


def _tagger() -> Any:
    import torch

    class Tagger(torch.nn.Module):
        """Tags each token; takes and returns the LSTM's state, as a streaming tagger does."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 16)
            self.lstm = torch.nn.LSTM(16, HIDDEN, num_layers=LAYERS, batch_first=True)
            self.head = torch.nn.Linear(HIDDEN, 5)

        def forward(self, tokens: Any, h0: Any, c0: Any) -> tuple[Any, Any, Any]:
            out, (h, c) = self.lstm(self.embed(tokens), (h0, c0))
            return self.head(out), h, c

    torch.manual_seed(0)
    return Tagger().eval()


def _example(batch: int) -> tuple[Any, ...]:
    import torch

    state = torch.zeros(LAYERS, batch, HIDDEN)
    return torch.randint(0, VOCAB, (batch, SEQ)), state, state.clone()


def _lstm_onnx(path: Path) -> Path:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and RNN notes
        torch.onnx.export(
            _tagger(),
            _example(2),
            str(path),
            input_names=["tokens", "h0", "c0"],
            output_names=["tags", "h", "c"],
            dynamic_axes={"tokens": {0: "batch", 1: "seq"}, "h0": {1: "batch"}, "c0": {1: "batch"}},
            dynamo=False,
        )
    return path


def test_an_lstm_with_state_inputs_compiles_from_its_file(kompile_run: Any, tmp_path: Path) -> None:
    res = kompile_run(_lstm_onnx(tmp_path / "lstm.onnx"), "--backend", "onnxruntime")
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    assert target["phase"] == "Succeeded", target
    assert "and batch 32" in res.stderr, res.stderr  # the batch max held, the state batched on axis 1


def test_a_dataset_holds_the_states_samples_on_their_batch_axis(
    kompile_run: Any, write_manifest: Any, tmp_path: Path
) -> None:
    source = _lstm_onnx(tmp_path / "lstm.onnx")
    rng = np.random.default_rng(0)
    samples = 5
    np.savez(
        tmp_path / "streams.npz",
        tokens=rng.integers(0, VOCAB, (samples, SEQ)),
        h0=rng.standard_normal((LAYERS, samples, HIDDEN)).astype(np.float32),  # a stream's carried state
        c0=rng.standard_normal((LAYERS, samples, HIDDEN)).astype(np.float32),
    )
    batch = {"name": "batch", "min": 1, "opt": 1, "max": 8}
    state = {"dtype": "float32", "shape": [LAYERS, -1, HIDDEN], "dynamicDims": [{"axis": 1, **batch}]}
    doc = small_cnn_doc(
        source={"uri": source.name},
        inputs=[
            {"name": "tokens", "dtype": "int64", "shape": [-1, SEQ], "dynamicDims": [{"axis": 0, **batch}]},
            {"name": "h0", **state},
            {"name": "c0", **state},
        ],
        validation={"dataset": "streams.npz"},
        benchmark={"batchSizes": [1, 4], "warmup": 1, "iterations": 3},
    )
    res = kompile_run(write_manifest(doc))
    assert res.code == 0, res.stderr
    (target,) = res.status["targets"]
    assert target["phase"] == "Succeeded", target
    assert target["validation"]["samples"] == samples, target["validation"]


def test_an_lstm_program_with_state_inputs_exports_without_torchs_own_warnings(
    kompile_run: Any, tmp_path: Path
) -> None:
    """torch.export unrolls the LSTM over a fixed seq; its batch stays dynamic. Exporting the
    program to ONNX printed ten of torch's FutureWarnings (`_check_is_size will be removed`) about
    its own generated code, which a user can do nothing about."""
    import torch

    batch = torch.export.Dim("batch", max=16)
    program = torch.export.export(
        _tagger(), _example(2), dynamic_shapes={"tokens": {0: batch}, "h0": {1: batch}, "c0": {1: batch}}
    )
    torch.export.save(program, tmp_path / "lstm.pt2")
    with warnings.catch_warnings(record=True) as caught:  # pytest would take them off stderr
        warnings.simplefilter("always")
        res = kompile_run(tmp_path / "lstm.pt2", "--backend", "onnxruntime")
    assert res.code == 0, res.stderr
    assert res.status["targets"][0]["phase"] == "Succeeded", res.status
    shown = [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, FutureWarning)]
    assert not shown, shown
    assert "Warning" not in res.stderr, res.stderr
