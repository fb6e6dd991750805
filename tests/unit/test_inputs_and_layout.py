"""Reference inputs, Triton layout, source format detection and hardware classes (no torch needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kompile.api.spec import InputSpec
from kompile.compile_jobs import inputs, triton
from kompile.compile_jobs.hardware import cpu_isa
from kompile.compile_jobs.sources import SourceError, detect_format, sha256_file

SIG = [
    InputSpec.model_validate(
        {
            "name": "ids",
            "dtype": "int64",
            "shape": [-1, -1],
            "low": 0,
            "high": 100,
            "dynamicDims": [
                {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8},
                {"axis": 1, "name": "seq", "min": 1, "opt": 16, "max": 64},
            ],
        }
    ),
    InputSpec.model_validate(
        {
            "name": "mask",
            "dtype": "int64",
            "shape": [-1, -1],
            "low": 1,
            "high": 2,
            "dynamicDims": [
                {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8},
                {"axis": 1, "name": "seq", "min": 1, "opt": 16, "max": 64},
            ],
        }
    ),
]


def test_generated_feeds_are_deterministic_and_shaped() -> None:
    a = inputs.generate_feeds(SIG, 3, seed=7)
    b = inputs.generate_feeds(SIG, 3, seed=7)
    assert len(a) == 3
    for fa, fb in zip(a, b, strict=True):
        np.testing.assert_array_equal(fa["ids"], fb["ids"])
        assert fa["ids"].shape == (1, 16) and fa["ids"].dtype == np.int64
        assert fa["ids"].max() < 100
    big = inputs.generate_feeds(SIG, 1, 0, {"batch": 4})[0]
    assert big["ids"].shape == (4, 16)
    assert inputs.batch_dim(SIG) == "batch"


def _mask_spec(name: str, dtype: str, low: int | None, high: int | None) -> InputSpec:
    dims = [{"axis": 0, "name": "batch", "min": 1, "opt": 4, "max": 8}]
    doc = {"name": name, "dtype": dtype, "shape": [-1, 32], "low": low, "high": high, "dynamicDims": dims}
    return InputSpec.model_validate({k: v for k, v in doc.items() if v is not None})


@pytest.mark.parametrize(
    ("name", "dtype", "low", "high"),
    [
        ("attention_mask", "int64", 1, 2),  # what kompile init writes from a tokenizer
        ("attention_mask", "int64", 0, 2),
        ("decoder_attention_mask", "int32", None, None),
        ("attention_mask", "bool", None, None),
        ("attention_mask", "float32", None, None),  # some exporters take the mask as floats
    ],
)
def test_generated_attention_masks_pad_like_a_tokenizer(
    name: str, dtype: str, low: int | None, high: int | None
) -> None:
    """A mask of ones never shows the gate an artifact that ignores the mask (a trace specialised on
    an all-ones example does): rows are ones then zeros, most of them padded."""
    feeds = inputs.generate_feeds([_mask_spec(name, dtype, low, high)], 3, seed=0)
    rows = np.concatenate([f[name] for f in feeds]).astype(np.int64)
    assert rows.shape == (12, 32)
    lengths = rows.sum(axis=1)
    assert (rows[:, 0] == 1).all() and (lengths >= 16).all()  # no row without a token
    assert all((row[:n] == 1).all() and (row[n:] == 0).all() for row, n in zip(rows, lengths, strict=True))
    assert (lengths < 32).sum() >= 9  # padded, bar the odd row drawn at full length
    assert len(set(lengths.tolist())) > 3


def test_a_padding_mask_marks_the_padding() -> None:
    """nn.MultiheadAttention's key_padding_mask is True where a position is padding."""
    (feed,) = inputs.generate_feeds([_mask_spec("src_key_padding_mask", "bool", None, None)], 1, seed=0)
    rows = feed["src_key_padding_mask"]
    assert rows.dtype == np.bool_ and not rows[:, 0].any() and rows[:, -1].sum() >= 3


def test_other_masks_keep_their_declared_values() -> None:
    """A mask input declared with other values (a 3-D pixel mask, a range beyond 0/1, floats with
    bounds) or named otherwise (attn_mask's True means "attend" to one torch API, "do not" to
    another) is not rewritten."""
    pixel = InputSpec.model_validate(
        {"name": "pixel_mask", "dtype": "int64", "shape": [2, 8, 8], "low": 1, "high": 2}
    )
    ranged = _mask_spec("attention_mask", "int64", 0, 5)
    bounded = _mask_spec("padding_mask", "float32", -1, 1)
    other = _mask_spec("attn_mask", "int64", 1, 2)
    (feed,) = inputs.generate_feeds([pixel, ranged, other, bounded], 1, seed=0)
    assert (feed["padding_mask"] < 0).any()
    assert (feed["pixel_mask"] == 1).all() and (feed["attn_mask"] == 1).all()
    assert feed["attention_mask"].max() > 1


def test_dataset_split_into_samples(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, ids=np.zeros((5, 16), np.int64), mask=np.ones((5, 16), np.int32))
    feeds, labels = inputs.load_dataset(path, SIG)
    assert labels is None
    assert len(feeds) == 5 and feeds[0]["ids"].shape == (1, 16) and feeds[0]["mask"].dtype == np.int64


STATE_SIG = [
    InputSpec.model_validate(
        {
            "name": "tokens",
            "dtype": "int64",
            "shape": [-1, 5],
            "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}],
        }
    ),
    InputSpec.model_validate(
        {
            "name": "h0",
            "shape": [2, -1, 4],
            "dynamicDims": [{"axis": 1, "name": "batch", "min": 1, "opt": 1, "max": 8}],
        }
    ),
    InputSpec.model_validate({"name": "scale", "shape": [4]}),
]


def test_a_dataset_is_cut_into_samples_along_each_inputs_batch_axis(tmp_path: Path) -> None:
    """An RNN's state holds its samples on axis 1 ([layers, batch, hidden]); an input without the
    batch dim is every sample's."""
    path = tmp_path / "d.npz"
    h0 = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    scale = np.arange(4, dtype=np.float32)
    np.savez(path, tokens=np.arange(15).reshape(3, 5), h0=h0, scale=scale)
    feeds, _ = inputs.load_dataset(path, STATE_SIG)
    assert len(feeds) == 3
    assert feeds[1]["tokens"].shape == (1, 5) and feeds[1]["h0"].shape == (2, 1, 4)
    assert (feeds[1]["h0"][:, 0] == h0[:, 1]).all()
    assert all((f["scale"] == scale).all() for f in feeds)


def test_a_dataset_whose_inputs_disagree_on_samples_names_each_axis(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, tokens=np.zeros((3, 5), np.int64), h0=np.zeros((2, 2, 4)), scale=np.zeros(4))
    with pytest.raises(inputs.InputMismatch, match=r"tokens: 3 \(axis 0\), h0: 2 \(axis 1\)"):
        inputs.load_dataset(path, STATE_SIG)


@pytest.mark.parametrize(
    ("arrays", "phrase"),
    [
        ({"ids": np.zeros((2, 16), np.int64)}, "missing inputs ['mask']"),
        ({"ids": np.zeros((2, 16, 3), np.int64), "mask": np.ones((2, 16), np.int64)}, "3 dimensions"),
        (
            {"ids": np.zeros((2, 100), np.int64), "mask": np.ones((2, 100), np.int64)},
            "outside its declared range",
        ),
        ({"ids": np.zeros((2, 16), np.int64), "mask": np.ones((3, 16), np.int64)}, "disagree"),
        # An empty dataset (a filter that kept nothing) failed later as an IndexError, "a bug".
        ({"ids": np.zeros((0, 16), np.int64), "mask": np.ones((0, 16), np.int64)}, "holds no samples"),
    ],
)
def test_dataset_mismatch_is_explained(tmp_path: Path, arrays: dict, phrase: str) -> None:  # type: ignore[type-arg]
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    with pytest.raises(inputs.InputMismatch, match=phrase.replace("[", r"\[").replace("]", r"\]")):
        inputs.load_dataset(path, SIG)


def test_triton_config_batched_and_unbatched() -> None:
    ins = [triton.TensorSpec("input", "float32", (-1, 3, 224, 224))]
    outs = [triton.TensorSpec("output", "float32", (-1, 1000))]
    text = triton.config_pbtxt("resnet", "onnxruntime_onnx", ins, outs, max_batch_size=32)
    assert 'platform: "onnxruntime_onnx"' in text and "max_batch_size: 32" in text
    assert "dims: [ 3, 224, 224 ]" in text and "dims: [ 1000 ]" in text and "KIND_CPU" in text
    flat = triton.config_pbtxt("m", "tensorrt_plan", ins, outs, max_batch_size=0, instance_kind="KIND_GPU")
    assert "dims: [ -1, 3, 224, 224 ]" in flat and "KIND_GPU" in flat


def test_triton_batches_only_what_has_a_batch_axis() -> None:
    """A model returning (logits, a scalar) got max_batch_size 8 and the scalar dims [ 1 ]: Triton
    refuses to load that (the scalar has no batch axis). Without batching every dim is written,
    and a scalar is dims [ 1 ] reshaped to [ ], as Triton asks for 0-d tensors."""
    ins = [triton.TensorSpec("x", "float32", (-1, 16))]
    outs = [triton.TensorSpec("logits", "float32", (-1, 4)), triton.TensorSpec("loss", "float32", ())]
    text = triton.config_pbtxt("m", "onnxruntime_onnx", ins, outs, max_batch_size=8)
    assert "max_batch_size: 0" in text and "dims: [ -1, 16 ]" in text and "dims: [ -1, 4 ]" in text
    assert 'name: "loss"\n    data_type: TYPE_FP32\n    dims: [ 1 ]\n    reshape: { shape: [ ] }' in text
    # An output whose axis 0 is not the batch (a fixed table): no batching either.
    table = [triton.TensorSpec("table", "float32", (10, 4))]
    assert "max_batch_size: 0" in triton.config_pbtxt("m", "onnxruntime_onnx", ins, table, 8)
    assert "max_batch_size: 8" in triton.config_pbtxt("m", "onnxruntime_onnx", ins, outs[:1], 8)


def test_triton_config_for_aotinductor_packages() -> None:
    """Triton's torch_aoti platform names tensors by position and does not cast: a bf16 package
    takes and returns bf16."""
    ins = [triton.TensorSpec("input_ids", "int64", (-1, 128)), triton.TensorSpec("x", "float32", (-1, 4))]
    outs = [triton.TensorSpec("logits", "float32", (-1, 2))]
    a_in, a_out = triton.aoti_io(ins, outs, "bf16")
    assert [(t.name, t.dtype) for t in a_in] == [("ARGS[0]", "int64"), ("ARGS[1]", "bfloat16")]
    assert [(t.name, t.dtype) for t in a_out] == [("RESULT", "bfloat16")]
    _, two = triton.aoti_io(ins, outs * 2, "fp32")
    assert [t.name for t in two] == ["RESULT[0]", "RESULT[1]"] and two[0].dtype == "float32"
    text = triton.config_pbtxt(
        "m", triton.AOTI_PLATFORM, a_in, a_out, 8, model_filename="model.pt2", backend="pytorch"
    )
    assert 'platform: "torch_aoti"\nbackend: "pytorch"\n' in text
    assert (
        'name: "ARGS[1]"\n    data_type: TYPE_BF16' in text and 'default_model_filename: "model.pt2"' in text
    )


def test_model_repository_layout(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx")
    d = triton.write_model_repository(tmp_path / "repo", "resnet", [(model, "model.onnx")], "cfg")
    assert (d / "config.pbtxt").read_text() == "cfg"
    assert (d / "1" / "model.onnx").read_bytes() == b"onnx"
    # Several files (OpenVINO's .xml and .bin), and no config for a backend Triton does not serve.
    weights = tmp_path / "m.bin"
    weights.write_bytes(b"w")
    d2 = triton.write_model_repository(
        tmp_path / "repo2", "ov", [(model, "model.xml"), (weights, "model.bin")], None
    )
    assert sorted(p.name for p in (d2 / "1").iterdir()) == ["model.bin", "model.xml"]
    assert not (d2 / "config.pbtxt").exists()


@pytest.mark.parametrize(
    ("uri", "fmt"),
    [
        ("a/model.pt2", "pt2"),
        ("file:///x/m.pt", "torchscript"),
        ("s3://b/k/m.onnx", "onnx"),
        ("models:/resnet/3", "mlflow"),
        ("runs:/abc/model", "mlflow"),
        ("python://pkg.mod:f", "python"),
    ],
)
def test_detect_format(uri: str, fmt: str) -> None:
    assert detect_format(uri) == fmt


def test_unknown_format_says_what_to_do() -> None:
    with pytest.raises(SourceError, match=r"set spec\.source\.format"):
        detect_format("model.bin")


def test_digest(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    assert sha256_file(p) == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_cpu_isa() -> None:
    assert cpu_isa({"avx2", "avx512f", "avx512_vnni"}, "amd64") == "avx512vnni"
    assert cpu_isa({"avx2"}, "amd64") == "avx2"
    assert cpu_isa({"asimddp"}, "arm64") == "dotprod"


def test_cpus_with_native_bf16_or_amx_are_classes_of_their_own() -> None:
    """A class is a set of interchangeable nodes: a bf16 or AMX int8 winner measured on Sapphire
    Rapids would be emulated (slower than fp32) on an Ice Lake node, and a compiler targeting the
    host (TVM: mcpu=cooperlake) may emit AVX-512 BF16 there, so neither joins plain VNNI."""
    vnni = {"avx2", "avx512f", "avx512_vnni"}
    zen4 = vnni | {"avx512_bf16"}
    sapphire_rapids = zen4 | {"amx_tile", "amx_int8", "amx_bf16"}
    assert cpu_isa(vnni, "amd64") == "avx512vnni"
    assert cpu_isa(zen4, "amd64") == "avx512bf16"
    assert cpu_isa(sapphire_rapids, "amd64") == "amx"


def test_an_image_bounded_below_the_guess_keeps_its_own_range() -> None:
    """The image guess starts at 32: a model exported for images up to 16 wide keeps [2, 16]."""
    from kompile.compile_jobs.signature import Dim, Input, input_specs

    image = Input("image", "float32", [Dim("batch"), 3, Dim("h", 2, 16), Dim("w", None, None)])
    (doc,) = input_specs([image], {})
    ranges = [(d["name"], d["min"], d["opt"], d["max"]) for d in doc["dynamicDims"]]
    assert ranges == [("batch", 1, 1, 32), ("h", 2, 16, 16), ("w", 32, 224, 512)]


def test_inputs_sharing_a_dim_name_share_its_guessed_range() -> None:
    """An LSTM's tokens [batch, seq] and state [layers, batch, hidden]: the state's batch (axis 1)
    was guessed as another dim (1..256, opt 16), so the reference inputs disagreed on the batch."""
    from kompile.compile_jobs.signature import Dim, Input, input_specs

    state = Input("h0", "float32", [2, Dim("batch"), 96])
    tokens = Input("tokens", "int64", [Dim("batch"), Dim("seq")])
    for order in ([state, tokens], [tokens, state]):
        docs = {d["name"]: d["dynamicDims"] for d in input_specs(order, {})}
        assert docs["h0"] == [{"axis": 1, "name": "batch", "min": 1, "opt": 1, "max": 32}], docs
        assert docs["tokens"][0] == {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32}


@pytest.mark.parametrize(
    ("layout", "names"),
    [
        ([Ellipsis, 3, "t", "h", "w"], ("t", "h", "w")),  # torchvision's video models: NCTHW
        ([Ellipsis, "t", 3, "h", "w"], ("t", "h", "w")),  # Hugging Face's VideoMAE pixel_values: NTCHW
        ([Ellipsis, "t", "h", "w", 3], ("t", "h", "w")),  # channels last
        ([Ellipsis, 3, "frames", "height", "width"], ("frames", "height", "width")),
    ],
)
def test_a_video_clip_gets_a_clips_frames_and_an_images_size(layout: list, names: tuple) -> None:  # type: ignore[type-arg]
    """r3d_18 exported with [batch, 3, frames, height, width]: its frames were guessed as a
    sequence (opt 128; 128 frames of 224x224 took 9 s an inference on 2 cores, and the reference,
    the dims checks and every timed call ran there); unnamed, its height and width were guessed as
    other dims (1..256, opt 16). Its batch check at 32 clips was killed for memory (5.9 GB in one
    ONNX Runtime session, held by three runtimes at once)."""
    from kompile.compile_jobs.signature import Dim, Input, input_specs

    shape = [Dim("batch") if s is Ellipsis else Dim(s) if isinstance(s, str) else s for s in layout]
    (doc,) = input_specs([Input("clip", "float32", shape)], {})
    ranges = {d["name"]: (d["min"], d["opt"], d["max"]) for d in doc["dynamicDims"]}
    frames, height, width = names
    assert ranges == {
        "batch": (1, 1, 8),
        frames: (1, 16, 32),
        height: (32, 224, 512),
        width: (32, 224, 512),
    }, ranges


RATE = InputSpec.model_validate({"name": "sr", "dtype": "int64", "shape": [], "low": 16000, "high": 16001})
AUDIO = InputSpec.model_validate(
    {
        "name": "audio",
        "shape": [-1, -1],
        "dynamicDims": [
            {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8},
            {"axis": 1, "name": "samples", "min": 64, "opt": 512, "max": 1024},
        ],
    }
)


def test_a_scalar_input_stays_0_d_through_generation_resizing_and_stacking() -> None:
    """Found by running Silero VAD: its 0-d sample rate reached the model as shape [1] once a dim
    was resized (np.ascontiguousarray returns at least 1-D), and the source refused it."""
    (feed,) = inputs.generate_feeds([RATE, AUDIO], 1, seed=0)
    assert feed["sr"].shape == () and int(feed["sr"]) == 16000
    assert inputs.resize(feed, [RATE, AUDIO], {"samples": 64})["sr"].shape == ()
    stacked = inputs.stacked([feed, feed], [RATE, AUDIO], 3)
    assert stacked["sr"].shape == () and stacked["audio"].shape == (3, 512)


def test_the_batch_is_the_first_input_with_an_axis_wherever_a_scalar_is_listed() -> None:
    from kompile.api.spec import batch_dim, batch_max, static_batch

    assert batch_dim([RATE, AUDIO]) == "batch" and batch_max([RATE, AUDIO]) == 8
    assert static_batch([RATE, AUDIO]) is None
    assert static_batch([RATE]) == 1


def test_a_dataset_holds_a_scalar_once_for_every_sample(tmp_path: Path) -> None:
    path = tmp_path / "audio.npz"
    np.savez(path, audio=np.zeros((3, 512), np.float32), sr=np.array(16000, np.int64))
    feeds, _ = inputs.load_dataset(path, [AUDIO, RATE])
    assert len(feeds) == 3 and all(f["sr"].shape == () and f["audio"].shape == (1, 512) for f in feeds)
    np.savez(path, audio=np.zeros((3, 512), np.float32), sr=np.full(3, 16000, np.int64))
    with pytest.raises(
        inputs.InputMismatch, match=r"input 'sr' has 1 dimensions \[3\], the signature declares 0"
    ):
        inputs.load_dataset(path, [AUDIO, RATE])
