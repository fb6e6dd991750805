"""A newcomer's own files, garbage included: every unreadable source ends in a clear message with
exit code 2 that names the file, what kompile expected and what it found, with no traceback and
nothing built or registered. The compile Job reports the same message in its result (exit code 2,
so its podFailurePolicy fails it at once), which the operator shows as the target's condition."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from tests.pipeline.conftest import fresh_kompile, run_compile_job, small_cnn_doc, torchscript_onnx

FEED = {"input": np.zeros((1, 3, 32, 32), np.float32)}


def _model() -> Any:
    from models.small import small_cnn  # type: ignore[import-not-found]

    return small_cnn().eval()


def _onnx(path: Path) -> Path:
    return torchscript_onnx(_model(), FEED, path, {}, "logits")


def _pt2(path: Path) -> Path:
    torch.export.save(torch.export.export(_model(), (torch.zeros(1, 3, 32, 32),)), str(path))
    return path


def _rewrite_zip(src: Path, dst: Path, edit: Callable[[str, bytes], bytes]) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item, edit(item.filename, zin.read(item.filename)))
    return dst


def corrupt_onnx(d: Path) -> Path:
    p = d / "corrupt.onnx"
    p.write_bytes(b"\x08\x07garbage that is not a protobuf" * 10)
    return p


def truncated_onnx(d: Path) -> Path:
    good = _onnx(d / "good.onnx").read_bytes()
    p = d / "truncated.onnx"
    p.write_bytes(good[: len(good) // 2])
    return p


def onnx_without_external_data(d: Path) -> Path:
    import onnx

    src = _onnx(d / "full.onnx")
    model = onnx.load(str(src))
    p = d / "split.onnx"
    onnx.save_model(model, str(p), save_as_external_data=True, location="split.weights", size_threshold=0)
    (d / "split.weights").unlink()
    return p


def pt2_not_an_archive(d: Path) -> Path:
    p = d / "notzip.pt2"
    p.write_bytes(b"this is not a zip archive" * 20)
    return p


def pt2_from_another_torch(d: Path) -> Path:
    def edit(name: str, data: bytes) -> bytes:
        if not name.endswith("models/model.json"):
            return data
        doc = json.loads(data)
        doc["schema_version"] = {"major": 99, "minor": 0}
        doc["torch_version"] = "9.9.0"
        return json.dumps(doc).encode()

    return _rewrite_zip(_pt2(d / "good.pt2"), d / "future.pt2", edit)


def torchscript_broken(d: Path) -> Path:
    src = d / "good_ts.pt"
    torch.jit.save(torch.jit.trace(_model(), torch.zeros(1, 3, 32, 32)), str(src))
    return _rewrite_zip(src, d / "broken.pt", lambda n, b: b"garbage" if n.endswith("data.pkl") else b)


def state_dict_pt(d: Path) -> Path:
    p = d / "weights.pt"
    torch.save(_model().state_dict(), p)
    return p


def training_checkpoint_pt(d: Path) -> Path:
    """The layout PyTorch's tutorials save: a dict holding the state_dict beside the epoch and the
    optimizer's state. It was called "a pickled Python object (collections.OrderedDict)"."""
    p = d / "checkpoint.pt"
    torch.save({"epoch": 3, "model_state_dict": _model().state_dict(), "loss": 0.25}, p)
    return p


def pickled_module_pth(d: Path) -> Path:
    p = d / "model.pth"
    torch.save(_model(), p)
    return p


def empty_onnx(d: Path) -> Path:
    p = d / "empty.onnx"
    p.write_bytes(b"")
    return p


def onnx_named_pt2(d: Path) -> Path:
    p = d / "really_onnx.pt2"
    p.write_bytes(_onnx(d / "x.onnx").read_bytes())
    return p


def pt2_named_onnx(d: Path) -> Path:
    p = d / "really_pt2.onnx"
    p.write_bytes(_pt2(d / "x.pt2").read_bytes())
    return p


CASES: list[tuple[Callable[[Path], Path], list[str]]] = [
    (corrupt_onnx, ["corrupt.onnx", "expected an ONNX model", "cannot be parsed"]),
    (truncated_onnx, ["truncated.onnx", "expected an ONNX model", "truncated or corrupt"]),
    (onnx_without_external_data, ["split.onnx", "external data", "split.weights", "beside"]),
    (pt2_not_an_archive, ["notzip.pt2", "expected a torch.export archive", "not a zip archive"]),
    (pt2_from_another_torch, ["future.pt2", "torch 9.9.0", "schema 99", "torch.export.save"]),
    (torchscript_broken, ["broken.pt", "expected TorchScript", "cannot be loaded"]),
    (state_dict_pt, ["weights.pt", "expected TorchScript", "state_dict", ".pt2", "python://"]),
    (
        training_checkpoint_pt,
        ["checkpoint.pt", "training checkpoint", "'model_state_dict'", "state_dict", ".pt2", "python://"],
    ),
    (pickled_module_pth, ["model.pth", "expected TorchScript", "pickled", ".pt2", "python://"]),
    (empty_onnx, ["empty.onnx", "is empty (0 bytes)", "expected an ONNX model"]),
    (onnx_named_pt2, ["really_onnx.pt2", "expected a torch.export archive", "holds an ONNX model"]),
    (pt2_named_onnx, ["really_pt2.onnx", "expected an ONNX model", "torch.export archive"]),
]


@pytest.mark.parametrize(("make", "phrases"), CASES, ids=[c[0].__name__ for c in CASES])
def test_unreadable_source_is_a_clear_error(
    make: Callable[[Path], Path], phrases: list[str], kompile_run, write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    bad = make(tmp_path)
    doc = small_cnn_doc(source={"uri": bad.name}, targets=[{"name": "cpu", "backend": "onnxruntime"}])
    res = kompile_run(write_manifest(doc))
    assert res.code == 2, (res.code, res.stderr)
    text = " ".join(res.stderr.split())
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in: {text}"
    assert "Traceback" not in res.stderr and "exporting" not in res.stderr
    assert not (tmp_path / ".kompile" / "artifacts").exists()
    assert not (tmp_path / ".kompile" / "mlflow.db").exists()


def test_dataset_keys_that_do_not_match_the_inputs(kompile_run, write_manifest, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    np.savez(tmp_path / "refs.npz", image=np.zeros((2, 3, 32, 32), np.float32))
    doc = small_cnn_doc(validation={"dataset": "refs.npz"})
    res = kompile_run(write_manifest(doc))
    assert res.code == 2
    text = " ".join(res.stderr.split())
    assert "refs.npz" in text and "['image']" in text and "missing inputs ['input']" in text, text
    assert "Traceback" not in res.stderr


def test_labels_outside_the_models_classes_stop_the_run_before_any_compile(
    kompile_run, write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    images = np.random.default_rng(0).random((4, 3, 32, 32), dtype=np.float32)
    np.savez(tmp_path / "refs.npz", input=images, y=np.array([1, 2, 3, 10]))  # 1-based, 10 classes
    doc = small_cnn_doc(validation={"dataset": "refs.npz", "labelsKey": "y"})
    res = kompile_run(write_manifest(doc))
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "refs.npz" in text and "from 1 to 10" in text and "10 classes" in text, text
    assert "compiling" not in text, text


def test_a_detection_task_on_a_model_with_no_yolo_head_stops_the_run_before_any_compile(
    kompile_run, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    doc = small_cnn_doc(validation={"task": "detection"})
    res = kompile_run(write_manifest(doc))
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "spec.validation.task detection: output" in text and "is no YOLO detection head" in text, text
    assert "compiling" not in text and "Traceback" not in text, text


def test_non_finite_reference_outputs_say_whether_the_dataset_or_the_model_made_them(
    kompile_run, write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A NaN in the dataset's inputs was reported as the model's fault ("check the model's
    weights"); a model that makes NaN of clean inputs says which samples."""
    images = np.random.default_rng(0).random((4, 3, 32, 32), dtype=np.float32)
    images[2, 0, 0, 0] = np.nan
    np.savez(tmp_path / "refs.npz", input=images)
    res = kompile_run(write_manifest(small_cnn_doc(validation={"dataset": "refs.npz"})))
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "refs.npz" in text and "sample 2" in text and "inputs hold NaN or Inf" in text, text
    assert "weights" not in text, text
    (tmp_path / "nanny.py").write_text(
        "import torch\n\n\nclass Nan(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x.mean((2, 3)) * float('nan')\n\n\n"
        "def nan():\n    return Nan()\n"
    )
    res = kompile_run(write_manifest(small_cnn_doc(source={"uri": "python://nanny:nan"})))
    assert res.code == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "Nan itself yields NaN or Inf" in text and "on 2 of 2 samples (0, 1)" in text, text


def test_the_compile_job_reports_the_same_message_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the operator shows: the Job's compact result carries the message, exit code 2."""
    from kompile.api.job_contract import ExitCode
    from kompile.api.spec import Target

    bad = state_dict_pt(tmp_path)
    doc = small_cnn_doc(source={"uri": bad.name})
    target = Target(name="cpu", backend="onnxruntime")
    code, status = run_compile_job(monkeypatch, doc, target, tmp_path, tmp_path)
    assert code == ExitCode.BAD_INPUT
    assert status.phase == "Failed" and status.reason == "SourceError"
    assert "weights.pt" in (status.message or "") and "state_dict" in (status.message or "")


def test_a_torch_ao_quantized_model_says_to_bring_the_float_one(
    kompile_run, write_manifest, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """quantize_dynamic's quantized::linear_dynamic has no ONNX form. Before: the message named the
    operator only, after two raw TorchScript graph dumps the exporter prints on its way out."""
    float_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    quantized = torch.ao.quantization.quantize_dynamic(float_model.eval(), {torch.nn.Linear})
    torch.jit.trace(quantized, torch.zeros(1, 16)).save(str(tmp_path / "dynq.pt"))
    doc = small_cnn_doc(source={"uri": "dynq.pt"}, inputs=[{"name": "x", "shape": [1, 16]}])
    res = kompile_run(write_manifest(doc))
    assert res.code == 2, res.stderr
    assert "quantized::linear_dynamic" in res.stderr and "torch.ao" in res.stderr, res.stderr
    assert "the float model" in res.stderr and "int8 target" in res.stderr, res.stderr
    # The dumps come from torch's C++ code, on the process's own stdout (amid --json's output).
    printed = "".join(capfd.readouterr())
    assert "graph(" not in printed + res.stderr and "Traceback" not in res.stderr, printed


def test_loading_a_torch_ao_model_prints_no_cpp_warning_amid_the_progress(tmp_path: Path) -> None:
    """torch's C++ warns once per process that quantized tensors are deprecated, straight to fd 2:
    in a fresh `kompile run` (a user's) that line landed between the progress lines."""
    float_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    quantized = torch.ao.quantization.quantize_dynamic(float_model.eval(), {torch.nn.Linear})
    torch.jit.trace(quantized, torch.zeros(1, 16)).save(str(tmp_path / "dynq.pt"))
    doc = small_cnn_doc(source={"uri": "dynq.pt"}, inputs=[{"name": "x", "shape": [1, 16]}])
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(doc))
    done = fresh_kompile(tmp_path, "run", "m.yaml", "--no-register")
    assert done.returncode == 2 and "quantized::linear_dynamic" in done.stderr, done.stderr
    assert "Quantizer.cpp" not in done.stderr + done.stdout, done.stderr
    assert "Quantizer.cpp" in (tmp_path / ".kompile" / "cache" / "load.log").read_text()


SHAPES = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 30 * 30, 10)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        if VALUE_BRANCH and h.sum() > 1e9:
            h = h * 2
        return self.fc(h.view(int(h.shape[0]), -1))


def shape_int():
    torch.manual_seed(0)
    return Net().eval()
"""


def _shape_model(tmp_path: Path, value_branch: bool) -> None:
    (tmp_path / "shapes.py").write_text(SHAPES.replace("VALUE_BRANCH", str(value_branch)))


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_python_int_of_a_shape_is_a_constant_only_a_dynamic_dim_cannot_hold(
    kompile_run, write_manifest, tmp_path: Path, dynamic: bool
) -> None:  # type: ignore[no-untyped-def]
    """int(h.shape[0]) fixes the batch in the trace: refused where the batch is dynamic, with what
    to write instead; at static shapes it is the constant it says (validation still checks it)."""
    _shape_model(tmp_path, value_branch=False)
    shape = [-1, 3, 32, 32] if dynamic else [2, 3, 32, 32]
    dims = [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 4}] if dynamic else []
    doc = small_cnn_doc(
        source={"uri": "python://shapes:shape_int"},
        inputs=[{"name": "x", "shape": shape, **({"dynamicDims": dims} if dims else {})}],
        targets=[{"name": "ort", "backend": "onnxruntime", "precision": "fp32"}],
    )
    doc["spec"].pop("fleet", None)
    res = kompile_run(write_manifest(doc), "--no-register")
    if dynamic:
        assert res.code == 2, res.stderr
        assert "shapes.py:15" in res.stderr and "batch" in res.stderr, res.stderr
        assert "int() of a size" in res.stderr and "h.shape[0]" in res.stderr, res.stderr
    else:
        assert res.code == 0, res.stderr
        (target,) = json.loads(res.stdout)["targets"]
        assert target["phase"] == "Succeeded", target.get("message")
        # Static at batch 2: timed as batch 2 (it was labelled batch 1, halving its throughput),
        # and the batchSizes it cannot run at are said to be left out.
        assert [lat["batchSize"] for lat in target["latency"]] == [2], target["latency"]
        assert "static at batch 2" in res.stderr, res.stderr


def test_value_dependent_control_flow_is_refused_even_at_static_shapes(
    kompile_run, write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    _shape_model(tmp_path, value_branch=True)
    doc = small_cnn_doc(
        source={"uri": "python://shapes:shape_int"},
        inputs=[{"name": "x", "shape": [2, 3, 32, 32]}],
        targets=[{"name": "ort", "backend": "onnxruntime", "precision": "fp32"}],
    )
    doc["spec"].pop("fleet", None)
    res = kompile_run(write_manifest(doc), "--no-register")
    assert res.code == 2, res.stderr
    assert "shapes.py:13" in res.stderr and "torch.where" in res.stderr, res.stderr
