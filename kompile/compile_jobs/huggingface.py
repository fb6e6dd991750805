"""A Hugging Face model folder as a source: `config.json` beside the weights (`model.safetensors` or
`pytorch_model.bin`) and usually the tokenizer's files, as `save_pretrained` writes it and as most
transformer models reach a platform team. The class is the one `config.json` names (its first
`architectures` entry, else AutoModel), loaded from the folder alone: nothing is downloaded, and code
shipped in a folder (`auto_map`, trust_remote_code) is refused rather than run. The signature comes
from the tokenizer's input names (token ids, mask, segment ids), for vision models the image size
in the config (both for a text-and-image model, from its text and vision configs), for speech
models a waveform or the log-mel frames the config fixes; source_module.SourceModule then calls the
model by those names and flattens its ModelOutput."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kompile.compile_jobs import sentence_modules
from kompile.compile_jobs.signature import token_range
from kompile.compile_jobs.source_files import SourceError, json_object, quiet_torch_loading

CONFIG = "config.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids")
MAX_SEQUENCE = 512
"""The longest sequence the written manifest asks for, where the model allows more."""


def is_model_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


def _config(folder: Path) -> dict[str, Any]:
    try:
        doc = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SourceError(f"{folder / CONFIG}: not a readable JSON model config: {err}") from None
    if not isinstance(doc, dict):
        raise SourceError(f"{folder / CONFIG}: expected a JSON object (a transformers model config)")
    return doc


def check_folder(folder: Path) -> dict[str, Any]:
    """The folder's config, after checking it holds weights and no code kompile would have to run."""
    config = _config(folder)
    if "auto_map" in config:
        raise SourceError(
            f"{folder}: its config.json maps the model to Python code shipped in the folder (auto_map), "
            "which kompile does not run: point spec.source.uri at python://your_module:factory, a "
            "function that builds it (from_pretrained(..., trust_remote_code=True) where you trust it)"
        )
    if not any((folder / w).is_file() for w in WEIGHT_FILES):
        raise SourceError(
            f"{folder}: a model config without weights: expected one of {', '.join(WEIGHT_FILES)} "
            "beside config.json (save_pretrained writes them)"
        )
    sentence_modules.pooling_of(folder)  # a sentence-transformers model kompile cannot compose: refused here
    return config


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """The hub client's offline switch for one load: a folder is read as it is, never completed
    from the network; torch's log lines on importing transformers (pytree deprecations) held back."""
    import torch  # noqa: F401  # first: importing it sets the "torch" logger's level

    before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        with quiet_torch_loading():
            yield
    finally:
        if before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers' own "Loading weights" bar, which would cut into kompile's progress lines."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def model_class(config: dict[str, Any]) -> Any:
    """The transformers class config.json names, else AutoModel (the bare encoder or decoder)."""
    names = config.get("architectures") or []
    with _offline():  # transformers imports its modules on first use: here
        import transformers

        cls = getattr(transformers, str(names[0]), None) if names else None
        return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else transformers.AutoModel


def load(folder: Path) -> Any:
    """The model in eval mode and float32, with eager attention (what the ONNX exporters trace
    exactly). transformers 5 loads a checkpoint in its saved dtype: a bf16 one would make the
    reference and the export bf16, where every target's precision starts from fp32. A
    sentence-transformers folder comes with its pooling (sentence_pooling.SentenceEmbedder)."""
    import torch

    config = check_folder(folder)
    cls = model_class(config)
    try:
        with _offline(), _no_progress_bar():
            model = cls.from_pretrained(
                str(folder), local_files_only=True, attn_implementation="eager", dtype=torch.float32
            )
    except (OSError, ValueError, ImportError, KeyError, RuntimeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SourceError(f"{folder}: transformers cannot load it as {cls.__name__}: {first}") from None
    pooling = sentence_modules.pooling_of(folder)
    if pooling is not None:
        from kompile.compile_jobs.sentence_pooling import SentenceEmbedder

        return SentenceEmbedder(model, *pooling).eval()
    return model.eval()


def _tokenizer_inputs(folder: Path) -> list[str] | None:
    """The tokenizer's model_input_names, where the folder has a tokenizer."""
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        return None
    try:
        with _offline():
            from transformers import AutoTokenizer

            names = AutoTokenizer.from_pretrained(str(folder), local_files_only=True).model_input_names
    except (OSError, ValueError, ImportError, KeyError):
        return None
    return [str(n) for n in names]


def signature(folder: Path) -> list[dict[str, Any]]:
    """The inputs as signature.Input fields (name, dtype, shape with dims as (name, max)), in the
    order the model's forward() takes them; SourceError where the model's main input is none of
    token ids, an image, a waveform or a spectrogram."""
    config = check_folder(folder)
    cls = model_class(config)
    main = getattr(cls, "main_input_name", "input_ids")
    if cls.__name__ == "AutoModel":  # resolved only at load: text and vision encoders alike
        main = "pixel_values" if "image_size" in config or "vision_config" in config else "input_ids"
    params = _forward_params(cls)
    # A text-and-image model (CLIP, SigLIP) takes pixel_values beside the tokens.
    image = (
        _image_input(folder, config) if main == "pixel_values" or "pixel_values" in (params or ()) else None
    )
    if main == "input_ids":
        inputs = _text_signature(folder, config, params)
        if image is not None:
            order = params or []
            inputs = sorted(
                [*inputs, image], key=lambda i: order.index(i["name"]) if i["name"] in order else 0
            )
        return inputs
    if main in ("input_values", "input_features"):
        inputs = _audio_signature(folder, config, main)
    elif image is not None:
        inputs = [image]
    else:
        raise SourceError(
            f"{folder}: kompile reads the inputs of text models (token ids), image models (pixel_values "
            "with image_size in config.json or a size in preprocessor_config.json) and speech models "
            f"(a waveform or log-mel frames); this one takes {main!r}: write spec.inputs in a manifest"
        )
    if config.get("is_encoder_decoder") and params is not None and "decoder_input_ids" in params:
        # Whisper's or an image-to-text model's decoder (TrOCR, Donut), teacher-forced on given
        # tokens as a text encoder-decoder's is: without them it fails at the first call.
        inputs += _token_inputs(folder, config, ["decoder_input_ids"])
    return inputs


def _forward_params(cls: Any) -> list[str] | None:
    """forward()'s parameter names; None for AutoModel, whose class is chosen at load."""
    if cls.__name__ == "AutoModel":
        return None
    try:
        return list(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return None


def _image_input(folder: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """pixel_values at the size the model takes (a text-and-image model's vision_config says it),
    a video model's clip of frames; None where nothing says the size."""
    # A text-and-image model's vision_config, an image-to-text encoder-decoder's encoder.
    vision = config.get("vision_config", config.get("encoder"))
    if "image_size" not in config and isinstance(vision, dict):
        config = vision
    size = _image_size(folder, config)
    if size is None:
        return None
    channels = int(config.get("num_channels", 3))
    # A video model (VideoMAE, TimeSformer, ViViT) takes clips of num_frames images, frames
    # first: [batch, frames, channels, height, width] (its position embeddings fix the count).
    frames = config.get("num_frames")
    clip = [frames] if isinstance(frames, int) and frames > 0 else []
    return {"name": "pixel_values", "dtype": "float32", "shape": [("batch", None), *clip, channels, *size]}


def _audio_signature(folder: Path, config: dict[str, Any], main: str) -> list[dict[str, Any]]:
    """A speech model's input: Whisper's log-mel frames (exactly two per encoder position: 3000
    for 30 s, anything else it refuses), the Audio Spectrogram Transformer's [max_length frames,
    num_mel_bins], else a 16 kHz waveform (wav2vec2, HuBERT, WavLM), with the mask beside it
    where its feature extractor gives one (the layer-norm variants are trained with it).
    Log-mel frames come in batches of up to 8, as video clips do: each is 30 s of audio, and at 32
    whisper-tiny's shape (random weights) held 15.4 GB resident in `kompile run --backend
    onnxruntime` (5.8 GB at 8): its eager attention alone is heads x 1500 x 1500 floats a clip, and
    a larger Whisper's would not fit the source, ONNX Runtime and OpenVINO at once in 24 GiB."""
    mel, clips = config.get("num_mel_bins"), ("batch", 8)
    if isinstance(mel, int) and isinstance(config.get("max_source_positions"), int):
        frames = 2 * int(config["max_source_positions"])
        return [{"name": main, "dtype": "float32", "shape": [clips, mel, frames]}]
    if isinstance(mel, int) and isinstance(config.get("max_length"), int):
        return [{"name": main, "dtype": "float32", "shape": [clips, int(config["max_length"]), mel]}]
    if main != "input_values":
        raise SourceError(
            f"{folder}: a speech model taking {main!r} whose config.json says neither num_mel_bins with "
            "max_source_positions (Whisper) nor with max_length: write spec.inputs in a manifest"
        )
    batch, samples = ("batch", None), ("samples", None, _two_frames(config))
    inputs: list[dict[str, Any]] = [{"name": main, "dtype": "float32", "shape": [batch, samples]}]
    if _preprocessor(folder).get("return_attention_mask") is True:
        low, high = token_range("attention_mask")
        inputs.append(
            {"name": "attention_mask", "dtype": "int64", "shape": [batch, samples], "low": low, "high": high}
        )
    return inputs


def _two_frames(config: dict[str, Any]) -> int | None:
    """The fewest samples wav2vec2's convolutional encoder makes two frames of: its receptive field
    plus its stride (720 for wav2vec2-base's 400 and 320). At one frame torch.export fixes the
    frame count to 1 and refuses the range (`torch.export suggests samples = Dim('samples',
    min=720, ...)`); None where the config names no convolutions."""
    kernels, strides = config.get("conv_kernel"), config.get("conv_stride")
    if not (isinstance(kernels, list) and isinstance(strides, list) and len(kernels) == len(strides)):
        return None
    if not all(isinstance(v, int) and v > 0 for v in kernels + strides):
        return None
    field, stride = 1, 1
    for k, s in zip(kernels, strides, strict=True):
        field, stride = field + (k - 1) * stride, stride * s
    return field + stride


def _preprocessor(folder: Path) -> dict[str, Any]:
    """preprocessor_config.json (an image processor's or feature extractor's), {} where none."""
    return json_object(folder / "preprocessor_config.json")


def _image_size(folder: Path, config: dict[str, Any]) -> tuple[int, int] | None:
    """(height, width) of the images the model takes: config.json's image_size, else the size its
    image processor feeds it (Hugging Face's ResNet has no image_size): the crop where it crops,
    else the size it resizes to."""
    configured = config.get("image_size")
    if isinstance(configured, int):
        return configured, configured
    if isinstance(configured, list) and len(configured) == 2 and all(isinstance(d, int) for d in configured):
        return configured[0], configured[1]  # [height, width] (Swin, DeiT configs may say so)
    processor = _preprocessor(folder)
    cropped = processor.get("do_center_crop", "crop_size" in processor)
    for key in ("crop_size", "size") if cropped else ("size",):
        size = _height_width(processor.get(key))
        if size is not None:
            return size
    return None


def _height_width(size: Any) -> tuple[int, int] | None:
    """An image processor's size entry: 224, {"height": 224, "width": 224} or {"shortest_edge": 224}
    (the short side, square after its crop)."""
    if isinstance(size, int) and size > 0:
        return size, size
    if not isinstance(size, dict):
        return None
    if isinstance(size.get("height"), int) and isinstance(size.get("width"), int):
        return int(size["height"]), int(size["width"])
    if isinstance(size.get("shortest_edge"), int):
        return int(size["shortest_edge"]), int(size["shortest_edge"])
    return None


def _text_signature(folder: Path, config: dict[str, Any], params: list[str] | None) -> list[dict[str, Any]]:
    """The token inputs the tokenizer names (ids and a mask without one), in forward()'s order."""
    named = _tokenizer_inputs(folder) or ["input_ids", "attention_mask"]
    params = params if params is not None else list(_TEXT_INPUTS)
    if config.get("is_encoder_decoder") and "decoder_input_ids" in params:
        # An encoder-decoder (T5, BART) runs its decoder too: one teacher-forced pass over given
        # decoder tokens (without them it failed "You must specify exactly one of input_ids ...").
        named = [*named, "decoder_input_ids"]
    order = [p for p in params if p in named and p in _TEXT_INPUTS] or ["input_ids"]
    return _token_inputs(folder, config, order)


def _token_inputs(folder: Path, config: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    """Token inputs up to the positions the model holds (MAX_SEQUENCE at most), ids over its
    vocabulary: read from its text config (a text-and-image model's text_config), where a decoder's
    own bound (Whisper's max_target_positions) comes first for decoder tokens."""
    # Through transformers' config: it maps each family's own key (GPT-2's n_positions) to these.
    try:
        with _offline():
            from transformers import AutoConfig

            resolved = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        text = resolved.get_text_config()
    except (OSError, ValueError, KeyError, AttributeError):
        text = None
    raw = config.get("text_config", config.get("decoder"))
    raw = raw if isinstance(raw, dict) else config
    positions = getattr(text, "max_position_embeddings", None) or raw.get("max_position_embeddings")
    decoder_positions = getattr(text, "max_target_positions", None) or positions
    # A sentence-transformers model is trained to (and truncates at) its max_seq_length.
    positions = min(int(positions or MAX_SEQUENCE), sentence_modules.max_seq_length(folder) or MAX_SEQUENCE)
    vocab = int(getattr(text, "vocab_size", None) or raw.get("vocab_size") or 100)
    docs = []
    for name in names:
        decoder = "decoder" in name
        longest = min(int((decoder_positions if decoder else positions) or MAX_SEQUENCE), MAX_SEQUENCE)
        low, high = token_range(name, vocab)
        dim = ("decoder_sequence" if decoder else "sequence", longest)
        docs.append(
            {"name": name, "dtype": "int64", "shape": [("batch", None), dim], "low": low, "high": high}
        )
    return docs
