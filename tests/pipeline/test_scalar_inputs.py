"""Models that take a scalar (0-d) input: Silero VAD's sample rate (silero-vad's own ONNX file, with
real weights, If branches on the rate and its LSTM state an input [2, batch, 128]), a temperature
given per call. kompile refused them ("input 'sr' is a scalar (0-d), which spec.inputs cannot
declare"); `shape: []` declares one now, the same value for every sample of a batch, and every
step keeps it 0-d (np.ascontiguousarray made it [1] on the way to the model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.pipeline.conftest import small_cnn_doc
from tests.support.pretrained_files import silero_file

CHUNK = 576  # 512 samples at 16 kHz and the 64 of context silero-vad's wrapper puts before them


def _audio(path: Path) -> Path:
    """Eight chunks at 16 kHz: silence, noise, and tones with harmonics (a voiced sound's shape),
    stood in for speech, which no installed package ships. The state starts at zeros, as a stream
    does; the rate is one 0-d value for every sample."""
    rng = np.random.default_rng(0)
    t = np.arange(CHUNK) / 16000.0
    chunks = [np.zeros(CHUNK), 0.05 * rng.standard_normal(CHUNK)]
    for pitch in (110.0, 150.0, 220.0, 180.0, 130.0, 260.0):
        voiced = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 8))
        chunks.append(0.3 * voiced + 0.01 * rng.standard_normal(CHUNK))
    np.savez(
        path,
        input=np.stack(chunks).astype(np.float32),
        state=np.zeros((2, len(chunks), 128), np.float32),
        sr=np.array(16000, np.int64),
    )
    return path


def test_silero_vad_with_its_scalar_sample_rate_compiles_and_validates(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path
) -> None:
    batch = [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}]
    candidates = [
        {"backend": "onnxruntime", "precision": "fp32"},
        {"backend": "onnxruntime", "precision": "int8", "quantization": "static"},
        {"backend": "openvino", "precision": "fp32"},
    ]
    doc = small_cnn_doc(
        source={"uri": str(silero_file("silero_vad.onnx"))},
        inputs=[
            {"name": "input", "shape": [-1, CHUNK], "dynamicDims": batch},
            {"name": "state", "shape": [2, -1, 128], "dynamicDims": [{**batch[0], "axis": 1}]},
            {"name": "sr", "dtype": "int64", "shape": []},
        ],
        targets=[{"name": "cpu", "candidates": candidates}],
        validation={"dataset": str(_audio(tmp_path / "audio.npz"))},
        benchmark={"batchSizes": [1], "warmup": 1, "iterations": 5},
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    (t,) = res.status["targets"]
    cands = {c["name"]: c for c in t["candidates"]}
    assert t["phase"] == "Succeeded", t
    assert cands["onnxruntime-fp32"]["reason"] == "Validated", cands["onnxruntime-fp32"]
    # ONNX Runtime's quantizer leaves the If branches, where every Conv and LSTM lies, as they are:
    # its "int8" was the fp32 graph (0.238 against 0.235 ms), refused now with the reason.
    static = cands["onnxruntime-int8"]
    assert static["reason"] == "CompileFailed", static
    assert "quantized no operator" in static["message"], static
    assert "nodes all lie inside If/Loop/Scan branches" in static["message"], static
    # OpenVINO's ONNX frontend cannot type the If branches: said op by op, with the reason.
    refused = cands["openvino-fp32"]
    assert refused["reason"] == "CompileFailed", refused
    assert "Conv-16 at node If_0_then_branch" in refused["message"], refused
    assert "rank has to be known" in refused["message"], refused
    assert "batch 8" in t["validation"]["checkedAt"]  # the batch check held it past the dataset's batch


TEMPERED = """
import torch


class Tempered(torch.nn.Module):
    \"\"\"Class probabilities at a temperature given per call: a 0-d input listed first.\"\"\"

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, temperature, x):
        return torch.softmax(self.fc(x) / temperature, dim=-1)


def tempered():
    torch.manual_seed(0)
    return Tempered().eval()
"""


def test_a_scalar_listed_first_leaves_the_batch_to_the_next_input(  # type: ignore[no-untyped-def]
    kompile_run, write_manifest, tmp_path: Path
) -> None:
    """The batch is axis 0 of the first input that has one: with the scalar first, the run said
    'the inputs are static at batch 1' and timed batch 1 only."""
    (tmp_path / "tempered.py").write_text(TEMPERED)
    dims = [{"axis": 0, "name": "batch", "min": 1, "opt": 2, "max": 8}]
    doc = small_cnn_doc(
        source={"uri": "python://tempered:tempered"},
        inputs=[
            {"name": "temperature", "shape": [], "low": 0.5, "high": 2.0},
            {"name": "x", "shape": [-1, 16], "dynamicDims": dims},
        ],
        targets=[
            {"name": "cpu", "candidates": [{"backend": b} for b in ("onnxruntime", "openvino", "inductor")]}
        ],
        benchmark={"batchSizes": [1, 4], "warmup": 1, "iterations": 3},
    )
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 0, res.stderr
    assert "static at batch" not in res.stderr
    (t,) = res.status["targets"]
    for cand in t["candidates"]:
        assert cand["reason"] == "Validated", cand
        assert sorted(lat["batchSize"] for lat in cand["latency"]) == [1, 4], cand


def test_silero_vad_runs_from_its_file_and_a_dataset_alone(tmp_path: Path) -> None:
    """From the file alone the run failed: the state's unnamed axis 1 became its own dim
    (state_dim1, 16) beside a batch of 1, the audio's unnamed length a guessed 16 samples, and the
    sample rate a generated 0 or 1. `--dataset` gives the samples: the dims the dataset fixes (the
    576 samples a chunk holds) come from it, the rate too, and an RNN state [layers, ?, hidden]'s
    unnamed axis 1 is the batch."""
    import yaml
    from typer.testing import CliRunner

    from kompile.cli import app

    model = tmp_path / "vad" / "silero_vad.onnx"
    model.parent.mkdir()
    model.write_bytes(silero_file("silero_vad.onnx").read_bytes())
    data = _audio(tmp_path / "audio.npz")
    runner = CliRunner()
    # Without it, the error names the audio's length (not the state's batch) and both ways to set it.
    res = runner.invoke(app, ["run", str(model), "--no-register", "--work-dir", str(tmp_path / "w")])
    text = " ".join(res.stderr.split())
    assert res.exit_code == 2 and "'state': [2, 1, 128]" in text, text
    assert "the dynamic dims were input_dim1=16:" in text and "--dataset samples.npz" in text, text
    res = runner.invoke(app, ["init", str(model), "--dataset", str(data)])
    assert res.exit_code == 0, res.stderr
    spec = yaml.safe_load(model.with_suffix(".yaml").read_text())["spec"]
    dims = {i["name"]: i.get("dynamicDims", []) for i in spec["inputs"]}
    assert [(d["axis"], d["name"]) for d in dims["state"]] == [(1, "batch")], dims
    samples = [(d["axis"], d["name"], d["min"], d["opt"], d["max"]) for d in dims["input"]][1]
    assert samples == (1, "input_dim1", CHUNK, CHUNK, CHUNK), dims  # outside the 1..256 guess: fixed
    assert [i["shape"] for i in spec["inputs"]] == [[-1, -1], [2, -1, 128], []], spec["inputs"]
    assert spec["validation"] == {"dataset": "../audio.npz"}  # relative to the manifest, as the source
    res = runner.invoke(
        app,
        [
            "run",
            str(model),
            "--dataset",
            str(data),
            "--json",
            "--no-register",
            "--work-dir",
            str(tmp_path / "w"),
        ],
    )
    assert res.exit_code == 0, res.stderr
    import json

    (t,) = json.loads(res.stdout)["targets"]
    assert t["phase"] == "Succeeded", t
    # The init it offers keeps the flag, so the saved manifest is the one that ran.
    assert f"save it with `kompile init {model} --dataset {data}`" in " ".join(res.stderr.split())


def test_a_dataset_flag_that_cannot_serve_is_a_clear_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kompile.cli import app

    model = silero_file("silero_vad.onnx")
    runner = CliRunner()
    np.savez(tmp_path / "partial.npz", input=np.zeros((2, CHUNK), np.float32))
    for args, said in (
        (["--dataset", str(tmp_path / "none.npz")], "none.npz: no such file"),
        (
            ["--dataset", str(tmp_path / "partial.npz")],
            "has arrays ['input'], missing inputs ['state', 'sr']",
        ),
    ):
        res = runner.invoke(app, ["init", str(model), "--out", str(tmp_path / "m.yaml"), *args])
        text = " ".join(res.stderr.split())
        assert res.exit_code == 2 and said in text and "Traceback" not in text, text
    (tmp_path / "m.yaml").write_text("kind: CompiledModel\n")
    res = runner.invoke(app, ["run", str(tmp_path / "m.yaml"), "--dataset", str(tmp_path / "partial.npz")])
    assert res.exit_code == 2 and "apply to model files" in " ".join(res.stderr.split()), res.stderr
