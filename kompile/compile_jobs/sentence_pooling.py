"""A sentence-transformers folder (modules.json: the Transformer at the folder's root, then Pooling
and perhaps Normalize) as the model its users call: the token embeddings and the pooled sentence
embedding, as sentence-transformers' own ONNX export names them (`token_embeddings`,
`sentence_embedding`). Loaded as the bare transformer it gave last_hidden_state and BERT's pooler,
which sentence-transformers never trained or uses: a served model whose callers pool by hand, or
take the pooler for the embedding.

The pooling is written out here from the modes 1_Pooling/config.json names (torch only: nothing from
sentence-transformers, which kompile does not install); a module it does not know (Dense, a
custom one) is refused with what to do instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from kompile.compile_jobs.source_files import SourceError

MODULES = "modules.json"
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
# The order sentence-transformers concatenates its pooling modes in.
MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


def modules(folder: Path) -> list[dict[str, Any]] | None:
    """modules.json's entries, None where the folder has none (a plain transformers folder)."""
    path = folder / MODULES
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SourceError(f"{path}: not a readable sentence-transformers module list: {err}") from None
    if not isinstance(doc, list) or not all(isinstance(m, dict) for m in doc):
        raise SourceError(f"{path}: expected a JSON list of modules (sentence-transformers writes one)")
    return doc


def max_seq_length(folder: Path) -> int | None:
    """The longest input the model was trained on (sentence_bert_config.json), where it says."""
    try:
        doc = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = doc.get("max_seq_length") if isinstance(doc, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def pooling_plan(folder: Path, entries: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """(pooling modes, normalize) for a Transformer -> Pooling [-> Normalize] pipeline; SourceError
    for any other, naming the module kompile cannot compose."""
    kinds = [str(m.get("type", "")) for m in entries]
    if kinds[:1] != [_TRANSFORMER] or str(entries[0].get("path", "")) not in ("", "."):
        raise SourceError(
            f"{folder / MODULES}: kompile composes a sentence-transformers model whose Transformer is the "
            "folder's root (as sentence-transformers 2 and later save it); this one has "
            f"{kinds[:1] or 'none'} at {entries[0].get('path') if entries else None!r}: save it again with "
            "save_pretrained, or give a python:// factory that builds it"
        )
    rest = kinds[1:]
    if rest not in ([_POOLING], [_POOLING, _NORMALIZE]):
        unknown = next((k for k in rest if k not in (_POOLING, _NORMALIZE)), " -> ".join(rest) or "nothing")
        raise SourceError(
            f"{folder / MODULES}: kompile composes Transformer -> Pooling [-> Normalize]; this model has "
            f"{unknown} after its Transformer: give a python:// factory that returns the whole model as "
            "one torch module (SentenceTransformer(...) wrapped to take input_ids and attention_mask)"
        )
    config_path = folder / str(entries[1].get("path", "")) / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SourceError(f"{config_path}: the Pooling module's config is not readable: {err}") from None
    chosen = [m for m in MODES if config.get(f"pooling_mode_{m}") is True]
    if not chosen:
        raise SourceError(f"{config_path}: names no pooling mode kompile knows ({', '.join(MODES)})")
    return chosen, rest[-1] == _NORMALIZE


def _pool(mode: str, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One pooling mode over [batch, seq, dim] token embeddings, padding (mask 0) left out."""
    m = mask.unsqueeze(-1).to(tokens.dtype)
    if mode == "cls_token":
        return tokens[:, 0]
    if mode == "max_tokens":
        return torch.where(m > 0, tokens, torch.full_like(tokens, -1e9)).max(dim=1).values
    counted = m.sum(dim=1).clamp(min=1e-9)
    if mode == "mean_tokens":
        return (tokens * m).sum(dim=1) / counted
    if mode == "mean_sqrt_len_tokens":
        return (tokens * m).sum(dim=1) / counted.sqrt()
    if mode == "weightedmean_tokens":  # position i weighs i + 1
        weights = (
            m * torch.arange(1, tokens.shape[1] + 1, dtype=tokens.dtype, device=tokens.device)[None, :, None]
        )
        return (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    # lasttoken: the last unmasked position, whichever side the batch was padded on.
    flipped = mask.flip(1)
    last = tokens.shape[1] - 1 - flipped.to(torch.int64).argmax(dim=1)
    return tokens[torch.arange(tokens.shape[0], device=tokens.device), last]


class SentenceEmbedder(torch.nn.Module):  # type: ignore[misc]
    """The transformer, its token embeddings pooled (and L2-normalized where the folder says) into
    one embedding per sentence; called by the tokenizer's input names, as the transformer is."""

    def __init__(self, transformer: torch.nn.Module, modes: list[str], normalize: bool) -> None:
        super().__init__()
        self.transformer = transformer
        self.modes = modes
        self.normalize = normalize

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        tokens = self.transformer(input_ids=input_ids, attention_mask=mask, **extra).last_hidden_state
        pooled = torch.cat([_pool(mode, tokens, mask) for mode in self.modes], dim=-1)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return {"token_embeddings": tokens, "sentence_embedding": pooled}
