"""`kompile init MODEL_FILE` and `kompile run MODEL_FILE`: a manifest written from the model file
itself (inputs from the ONNX graph or the torch.export signature, fleet mode), on files the test
exports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from typer.testing import CliRunner

from kompile.api import parse_manifest
from kompile.cli import app
from kompile.compile_jobs.hardware import local_arch
from tests.pipeline.conftest import torchscript_onnx


class Frames(torch.nn.Module):
    """A small model over a dynamic time axis, with an integer mask input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.conv(frames.transpose(1, 2)) * mask.unsqueeze(1).to(frames.dtype)
        return self.head(hidden.mean(-1))


def _cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def _onnx(tmp_path: Path) -> Path:
    from models.small import small_cnn  # type: ignore[import-not-found]

    feed = {"image": np.zeros((1, 3, 32, 32), np.float32)}
    dyn = {"image": {0: "batch"}, "logits": {0: "batch"}}
    return torchscript_onnx(small_cnn().eval(), feed, tmp_path / "classifier.onnx", dyn, "logits")


def _pt2(tmp_path: Path) -> Path:
    batch, time = torch.export.Dim("batch", max=16), torch.export.Dim("time", min=2, max=200)
    example = (torch.randn(2, 10, 8), torch.ones(2, 10, dtype=torch.int64))
    program = torch.export.export(
        Frames().eval(), example, dynamic_shapes=({0: batch, 1: time}, {0: batch, 1: time})
    )
    path = tmp_path / "frames.pt2"
    torch.export.save(program, str(path))
    return path


def _spec(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    parse_manifest(doc, str(path))  # a valid CompiledModel, as kubectl apply would need
    return doc["spec"]


def test_init_reads_the_onnx_graph_and_writes_a_commented_manifest(tmp_path: Path) -> None:
    model = _onnx(tmp_path)
    code, _, err = _cli("init", str(model))
    assert code == 0, err
    out = tmp_path / "classifier.yaml"
    text = out.read_text()
    assert text.startswith("# CompiledModel for classifier.onnx") and "kubectl apply" in text
    spec = _spec(out)
    assert spec["source"] == {"uri": "classifier.onnx"}
    (inp,) = spec["inputs"]
    assert inp["name"] == "image" and inp["shape"] == [-1, 3, 32, 32]
    assert inp["dynamicDims"] == [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32}]
    assert spec["fleet"] == {"enabled": True, "precisions": ["fp32"]}
    assert spec["benchmark"] == {"batchSizes": [1]}
    # Flags override the guess; an existing file is kept unless told; a wrong dim name is named.
    code, _, err = _cli("init", str(model), "--dim", "batch=1:4:64", "--precision", "int8")
    assert code == 2 and "exists: pass --force" in err
    code, _, err = _cli("init", str(model), "--dim", "batch=1:4:64", "--precision", "int8", "--force")
    spec = _spec(out)
    assert spec["inputs"][0]["dynamicDims"][0] | {} == {
        "axis": 0,
        "name": "batch",
        "min": 1,
        "opt": 4,
        "max": 64,
    }
    assert spec["fleet"]["precisions"] == ["int8"]
    code, _, err = _cli("init", str(model), "--dim", "seq=1:2:3", "--force")
    assert code == 2 and "no dynamic dimension of that name" in err and "['batch']" in err
    code, _, err = _cli("init", str(model), "--dim", "batch=big", "--force")
    assert code == 2 and "NAME=MIN:OPT:MAX" in err


def test_init_takes_the_ranges_a_pt2_records(tmp_path: Path) -> None:
    code, _, err = _cli("init", str(_pt2(tmp_path)), "--out", str(tmp_path / "m" / "frames.yaml"))
    assert code == 0, err
    spec = _spec(tmp_path / "m" / "frames.yaml")
    assert spec["source"]["uri"] == "../frames.pt2"  # relative to the manifest
    frames, mask = spec["inputs"]
    assert (frames["name"], frames["shape"], mask["dtype"]) == ("frames", [-1, -1, 8], "int64")
    batch, time = frames["dynamicDims"]
    assert (batch["name"], batch["min"], batch["max"]) == ("batch", 1, 16)
    assert (time["min"], time["max"]) == (2, 200)  # torch.export's own bounds
    assert mask["dynamicDims"] == frames["dynamicDims"]  # shared symbols share a name
    assert (mask["low"], mask["high"]) == (1, 2)  # a mask: ones, as a tokenizer writes for a full row


def test_run_a_model_file_directly_and_print_its_manifest(tmp_path: Path) -> None:
    model = _onnx(tmp_path)
    work = str(tmp_path / ".kompile")
    code, out, err = _cli("run", str(model), "--json", "--no-register", "--work-dir", work)
    assert code == 0, err
    status = __import__("json").loads(out)
    (t,) = status["targets"]
    assert t["phase"] == "Succeeded"
    # The same `latest` pointer as the operator writes, in the run's local artifact folder.
    (pointer,) = status["latest"]
    assert pointer["hardwareClass"] == t["hardwareClass"] and pointer["target"] == t["name"]
    assert pointer["uri"].endswith(f"/artifacts/latest/default/classifier/{t['hardwareClass']}.json")
    doc = __import__("json").loads(Path(pointer["uri"].removeprefix("file://")).read_text())
    assert doc["digest"] == t["artifact"]["digest"] and doc["uri"] == t["artifact"]["uri"]
    # backend auto on an ONNX source: inductor (which compiles torch modules) is not offered at all
    backends = [c["backend"] for c in t["candidates"]]
    assert "inductor" not in backends and "onnxruntime" in backends
    assert any(n.startswith("inductor: ") and "source is ONNX" in n for n in t["notOffered"])
    if local_arch() == "amd64":  # the run's class is this machine's: executorch is for arm64 ones
        assert any(n.startswith("executorch: auto offers it on arm64") for n in t["notOffered"])
    assert "The manifest this run used" in err and "apiVersion: kompile.dev/v1alpha1" in err
    assert "reading the ONNX graph of classifier.onnx" in err and "exporting" not in err


def test_run_a_pt2_file_with_flags(tmp_path: Path) -> None:
    model = _pt2(tmp_path)
    work = str(tmp_path / ".kompile")
    code, out, err = _cli(
        "run",
        str(model),
        "--json",
        "--no-register",
        "--work-dir",
        work,
        "--backend",
        "onnxruntime",
        "--dim",
        "frames_dim1=2:16:64",
        "--name",
        "speech-v2",
    )
    assert code == 0, err
    (t,) = __import__("json").loads(out)["targets"]
    assert t["phase"] == "Succeeded" and t["backend"] == "onnxruntime"
    assert "{axis: 1, name: frames_dim1, min: 2, opt: 16, max: 64}" in err
    assert "name: speech-v2" in err and "/artifacts/speech-v2/" in t["artifact"]["uri"]
    assert "[torch.onnx]" not in err, err  # the exporter's own progress lines: "exporting" says it


def test_a_bad_model_file_or_flag_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08garbage")
    for args in (("init", str(bad)), ("run", str(bad))):
        code, _, err = _cli(*args)
        assert code == 2 and "broken.onnx" in err and "Traceback" not in err, err
    code, _, err = _cli("run", str(tmp_path / "missing.pt2"))
    assert code == 2 and "no such file" in err
    manifest = tmp_path / "m.yaml"
    manifest.write_text("apiVersion: kompile.dev/v1alpha1\n")
    code, _, err = _cli("run", str(manifest), "--dim", "batch=1:1:2")
    assert code == 2 and "apply to model files" in err
    # init on a manifest said "m.yaml exists: pass --force to overwrite it" (the manifest itself).
    code, _, err = _cli("init", str(manifest))
    assert code == 2 and "is a manifest already" in err and f"kompile run {manifest}" in err, err
    assert manifest.read_text() == "apiVersion: kompile.dev/v1alpha1\n"
    # A bad flag value is named as the flag, not as the field of a manifest the user never wrote.
    model = _onnx(tmp_path)
    for flag, value, said in (
        ("--precision", "fp64", "--precision fp64: use fp32, fp16, bf16, int8 or auto"),
        ("--backend", "tensorflow", "--backend tensorflow: use auto or one of"),
        ("--name", "My_Model", "--name My_Model:"),
    ):
        code, _, err = _cli("run", str(model), flag, value)
        text = " ".join(err.split())
        assert code == 2 and said in text and "spec." not in text and "metadata." not in text, text


def test_a_pytorch_file_kompile_cannot_read_says_what_it_holds_and_what_to_do(tmp_path: Path) -> None:
    """`init` and `run` on the .pt files users have: a state_dict or a pickled module has no code
    kompile runs (export it, or a python:// factory); TorchScript has no input shapes (a manifest
    with spec.inputs, or a .pt2). Both said only what suffixes they read, or (run on a state_dict)
    to write a manifest pointing at the weights, which then failed."""
    from models.small import small_cnn  # type: ignore[import-not-found]

    model = small_cnn().eval()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    torch.save(model, tmp_path / "pickled.pth")
    torch.jit.save(torch.jit.trace(model, torch.zeros(1, 3, 32, 32)), tmp_path / "scripted.pt")
    for verb in ("init", "run"):
        code, _, err = _cli(verb, str(tmp_path / "weights.pt"))
        assert code == 2 and "a state_dict" in err and "torch.export.save" in err, err
        assert "python://" in err and "Traceback" not in err, err
        code, _, err = _cli(verb, str(tmp_path / "pickled.pth"))
        assert code == 2 and "pickled Python object" in err and "torch.export.save" in err, err
        code, _, err = _cli(verb, str(tmp_path / "scripted.pt"))
        assert code == 2 and "TorchScript" in err and "spec.inputs" in err and ".pt2" in err, err
    assert not list(tmp_path.glob("*.yaml"))  # init wrote nothing


def test_a_model_uri_on_the_command_line_says_it_goes_in_a_manifest(tmp_path: Path) -> None:
    """`kompile run s3://bucket/model.onnx` (or python://, models:/): the argument is a file path, so
    it said "s3:/bucket/model.onnx: no such file" (the URI mangled, nothing on what to do)."""
    for uri in ("s3://bucket/models/model.onnx", "python://models.small:small_cnn", "models:/resnet/3"):
        for verb in ("init", "run"):
            code, _, err = _cli(verb, uri)
            assert code == 2 and f"{uri}: " in err, err
            assert f"spec.source.uri: {uri}" in " ".join(err.split()) and "spec.inputs" in err, err
            assert "no such" not in err and "Traceback" not in err, err
    assert not list(tmp_path.glob("*.yaml"))


def test_a_float64_model_says_to_convert_it_to_float32(tmp_path: Path) -> None:
    """A .double() model: its .pt2 was "not a tensor kompile can feed (FakeTensor(..., dtype=
    torch.float64))" and its ONNX "has ONNX element type 11"."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 4)).double().eval()
    example = (torch.zeros(2, 16, dtype=torch.float64),)
    torch.export.save(torch.export.export(model, example), str(tmp_path / "f64.pt2"))
    torchscript_onnx(model, {"x": example[0].numpy()}, tmp_path / "f64.onnx", {}, "y")
    for name, said in (("f64.pt2", "'input' is float64"), ("f64.onnx", "'x' is double (float64)")):
        for verb in ("init", "run"):
            code, _, err = _cli(verb, str(tmp_path / name))
            text = " ".join(err.split())
            assert code == 2 and said in text and "model.float()" in text, text
            assert "float32" in text and "FakeTensor" not in text and "Traceback" not in text, text


def test_an_image_of_any_size_is_timed_at_an_image_size(tmp_path: Path) -> None:
    """A fully convolutional model exported with dynamic height and width was given the generic
    guess, 1 to 256 at 16: timed and validated on 16x16 images, and a 1x1 minimum that a network
    downsampling 32x cannot run (TensorRT's profile fails to build at it)."""
    from models.small import small_cnn  # type: ignore[import-not-found]

    feed = {"image": np.zeros((1, 3, 64, 64), np.float32)}
    dynamic = {"image": {0: "batch", 2: "height", 3: "width"}}
    named = torchscript_onnx(small_cnn().eval(), feed, tmp_path / "named.onnx", dynamic, "logits")
    unnamed = {"image": {0: "batch", 2: "h_", 3: "w_"}}  # ONNX names them image_dim2/3 where unset
    torchscript_onnx(small_cnn().eval(), feed, tmp_path / "unnamed.onnx", unnamed, "logits")
    for model in (named, tmp_path / "unnamed.onnx"):
        code, _, err = _cli("init", str(model))
        assert code == 0, err
        inp = yaml.safe_load(model.with_suffix(".yaml").read_text())["spec"]["inputs"][0]
        spatial = [(d["min"], d["opt"], d["max"]) for d in inp["dynamicDims"][1:]]
        assert spatial == [(32, 224, 512), (32, 224, 512)], (model.name, inp["dynamicDims"])


def _relu_onnx(path: Path, input_name: str, output_name: str) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", [input_name], [output_name])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


def test_onnx_inputs_named_by_number_run_and_others_are_told_what_to_rename(tmp_path: Path) -> None:
    """Older exporters name tensors "0", "1": `kompile run` on one ended "kompile failed
    unexpectedly: ValidationError ... InputSpec". A name kompile cannot carry (a space) is an input
    error saying which input and which characters it takes."""
    numbered = _relu_onnx(tmp_path / "numbered.onnx", "0", "1")
    code, out, err = _cli("run", str(numbered), "--no-register", "--json", "--work-dir", str(tmp_path / "w"))
    assert code == 0, err
    assert json.loads(out)["targets"][0]["phase"] == "Succeeded", out
    spaced = _relu_onnx(tmp_path / "spaced.onnx", "input ids", "out")
    for verb in ("init", "run"):
        code, _, err = _cli(verb, str(spaced))
        text = " ".join(err.split())
        assert code == 2 and "input 'input ids'" in text and "rename" in text, text
        assert "unexpectedly" not in text, text


def test_a_scalar_input_is_declared_and_an_unshaped_one_is_an_input_error(tmp_path: Path) -> None:
    """A model taking a 0-d input (a temperature beside the batch) ended `kompile run` with
    "kompile failed unexpectedly: ValidationError ... InputSpec"; it was refused next, and is
    declared now (`shape: []`), the batch taken from the input beside it
    (tests/pipeline/test_scalar_inputs.py runs such models)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    t = helper.make_tensor_value_info("temperature", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Div", ["x", "temperature"], ["y"])], "g", [x, t], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "scaled.onnx"))
    # Nor an input whose rank the graph does not say, nor one that is no tensor.
    del model.graph.input[1].type.tensor_type.shape.dim[:]
    model.graph.input[1].type.tensor_type.ClearField("shape")
    onnx.save(model, str(tmp_path / "unshaped.onnx"))
    model.graph.input[1].type.CopyFrom(helper.make_sequence_type_proto(t.type))
    onnx.save(model, str(tmp_path / "sequence.onnx"))
    code, _, err = _cli("init", str(tmp_path / "scaled.onnx"))
    assert code == 0, err
    spec = _spec(tmp_path / "scaled.yaml")
    assert [i["shape"] for i in spec["inputs"]] == [[-1, 4], []], spec["inputs"]
    assert spec["inputs"][0]["dynamicDims"][0]["name"] == "N"
    for name, said in (
        ("unshaped.onnx", "input 'temperature' has no shape in the graph"),
        ("sequence.onnx", "input 'temperature' is sequence, not a tensor"),
    ):
        for verb in ("init", "run"):
            code, _, err = _cli(verb, str(tmp_path / name))
            text = " ".join(err.split())
            assert code == 2 and said in text and "unexpectedly" not in text, text


def test_init_times_a_static_model_at_its_own_batch(tmp_path: Path) -> None:
    """A graph exported at batch 4 runs only at 4: batchSizes [1] would time nothing there."""
    from models.small import small_cnn  # type: ignore[import-not-found]

    feed = {"image": np.zeros((4, 3, 32, 32), np.float32)}
    model = torchscript_onnx(small_cnn().eval(), feed, tmp_path / "fixed.onnx", {}, "logits")
    code, _, err = _cli("init", str(model))
    assert code == 0, err
    spec = _spec(tmp_path / "fixed.yaml")
    assert spec["inputs"][0]["shape"] == [4, 3, 32, 32] and spec["benchmark"] == {"batchSizes": [4]}


def test_dims_a_converter_named_get_readable_names_and_stay_shared(tmp_path: Path) -> None:
    """tf2onnx names unknown dims unk__12, torch's exporter s0: `kompile init` wrote them as the
    dims' names ("unk__12: min 1, max 32"), which tell a user nothing. They read as batch and
    <input>_dim<axis> now, and a dim two inputs share keeps one name (their sizes stay tied)."""
    import onnx
    from onnx import TensorProto, helper

    def info(name: str, dims: list[str]) -> Any:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)

    for batch, seq in (("unk__12", "unk__13"), ("s0", "s77")):
        ins = [info("input_ids:0", [batch, seq]), info("mask:0", [batch, seq])]
        add = helper.make_node("Add", ["input_ids:0", "mask:0"], ["out"])
        graph = helper.make_graph([add], "g", ins, [info("out", [batch, seq])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        path = tmp_path / f"{batch}.onnx"
        onnx.save(model, str(path))
        code, _, err = _cli("init", str(path))
        assert code == 0, err
        spec = _spec(tmp_path / f"{batch}.yaml")
        names = [[d["name"] for d in inp["dynamicDims"]] for inp in spec["inputs"]]
        assert names == [["batch", "input_ids_0_dim1"], ["batch", "input_ids_0_dim1"]], names


def test_token_inputs_get_the_values_a_tokenizer_gives(tmp_path: Path) -> None:
    """`kompile init` on a BERT-like ONNX file gave every integer input ids in [0, 100): an
    attention mask of 37 is no mask any tokenizer writes (it scales the attention scores instead of
    masking them), and int8 was calibrated on it. Masks are ones, token types zeros, and token ids
    span the vocabulary the embedding table holds."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((1000, 8), np.float32), "embeddings")
    ins = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["embeddings", "ids32"], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["token_type_ids"], ["t"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["m", "t"], ["mt"]),
        helper.make_node("Unsqueeze", ["mt", "axes"], ["mt3"]),
        helper.make_node("Mul", ["embedded", "mt3"], ["out"]),
    ]
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", 8])
    graph = helper.make_graph(nodes, "g", ins, [out], [table, axes])
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
        tmp_path / "t.onnx",
    )
    code, _, err = _cli("init", str(tmp_path / "t.onnx"))
    assert code == 0, err
    ranges = {i["name"]: (i["low"], i["high"]) for i in _spec(tmp_path / "t.yaml")["inputs"]}
    assert ranges == {"input_ids": (0, 1000), "attention_mask": (1, 2), "token_type_ids": (0, 1)}, ranges

    class Embedded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(500, 8)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.embed(input_ids).sum(1)

    program = torch.export.export(Embedded().eval(), (torch.zeros(1, 4, dtype=torch.int64),))
    torch.export.save(program, str(tmp_path / "e.pt2"))
    code, _, err = _cli("init", str(tmp_path / "e.pt2"))
    assert code == 0, err
    (ids,) = _spec(tmp_path / "e.yaml")["inputs"]
    assert (ids["low"], ids["high"]) == (0, 500), ids


class Frames400(torch.nn.Module):
    """A model whose first convolution spans 400 steps: 128 (the guess for a dim named like a
    sequence) is too short for it, unless its input is named as a waveform."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, 400, stride=160)

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        return self.conv(series.unsqueeze(1)).mean(-1)


def test_a_source_that_fails_at_the_guessed_shape_names_the_dim_to_set(tmp_path: Path) -> None:
    """The ONNX source failed on the reference inputs and the run ended "kompile failed
    unexpectedly: InvalidArgument ... This is a bug in kompile". It is an input error now (exit 2)
    naming the shapes tried, the dynamic dim with the value it had, and the flag that sets it; with
    the flag, it runs."""
    feed = {"series": np.zeros((1, 16000), np.float32)}
    dyn = {"series": {0: "batch", 1: "sequence_length"}}
    model = torchscript_onnx(Frames400().eval(), feed, tmp_path / "series.onnx", dyn, "logits")
    work = str(tmp_path / "w")
    code, _, err = _cli("run", str(model), "--no-register", "--work-dir", work)
    text = " ".join(err.split())
    assert code == 2, text
    assert "failed on inputs shaped {'series': [1, 128]}" in text, text
    assert "sequence_length=128" in text and "--dim sequence_length=MIN:OPT:MAX" in text, text
    assert "unexpectedly" not in text and "Traceback" not in text, text
    assert "[E:onnxruntime" not in text, text  # said once, by kompile
    code, out, err = _cli(
        "run",
        str(model),
        "--no-register",
        "--json",
        "--work-dir",
        work,
        "--dim",
        "sequence_length=400:16000:32000",
    )
    assert code == 0, err
    assert json.loads(out)["targets"][0]["phase"] == "Succeeded", out


def test_a_waveform_input_is_timed_at_a_second_of_audio(tmp_path: Path) -> None:
    """A 2-D float input named as Hugging Face's audio models name theirs (input_values), its
    samples dynamic: 400 samples to 10 s at 16 kHz, timed at 1 s, where 128 was too short for a
    first convolution spanning 400 samples (wav2vec2's span)."""
    feed = {"input_values": np.zeros((1, 16000), np.float32)}
    dyn = {"input_values": {0: "batch", 1: "sequence_length"}}
    model = torchscript_onnx(Frames400().eval(), feed, tmp_path / "speech.onnx", dyn, "logits")
    code, _, err = _cli("init", str(model))
    assert code == 0, err
    (inp,) = _spec(tmp_path / "speech.yaml")["inputs"]
    samples = inp["dynamicDims"][1]
    assert (samples["min"], samples["opt"], samples["max"]) == (400, 16000, 160000), samples


def test_init_judges_an_ultralytics_detector_by_its_detections(tmp_path: Path) -> None:
    """NudeNet's file is an Ultralytics YOLOv8 export (its metadata says author, task detect and its
    18 class names; its output is [batch, 22, anchors]): the manifest asks for task detection."""
    import shutil

    from kompile.compile_jobs.detections import ultralytics_detector
    from tests.support.detections import nudenet_as_yolov5
    from tests.support.pretrained_files import nudenet_detector

    model = Path(shutil.copy(nudenet_detector(), tmp_path / "detector.onnx"))
    code, _, err = _cli("init", str(model))
    assert code == 0, err
    out = tmp_path / "detector.yaml"
    assert _spec(out)["validation"] == {"task": "detection"}
    assert (
        "# task detection: the file's metadata says Ultralytics exported it as a detector" in out.read_text()
    )
    why = ultralytics_detector(model)
    assert (
        why == "an Ultralytics 8.2.46 detection export: output 'output0' is [batch, 4 + 18 classes, anchors]"
    )
    assert "validation" not in _spec_of_init(_onnx(tmp_path), tmp_path)  # a classifier: no task
    # The same metadata over a head not laid out [batch, 4 + classes, anchors]: not claimed.
    assert ultralytics_detector(nudenet_as_yolov5(tmp_path)) is None


def _spec_of_init(model: Path, folder: Path) -> dict[str, Any]:
    code, _, err = _cli("init", str(model), "--force")
    assert code == 0, err
    return _spec(folder / f"{model.stem}.yaml")
