"""What a sentence-transformers folder says of its pipeline (modules.json, 1_Pooling/config.json,
sentence_bert_config.json), read without torch: `kompile init` and the signature need it before any
model loads. sentence_pooling builds the module from it; a pipeline kompile cannot compose (a Dense,
a custom module) is refused here with what to do instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kompile.compile_jobs.source_files import SourceError, json_object

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
    value = json_object(folder / "sentence_bert_config.json").get("max_seq_length")
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


def pooling_of(folder: Path) -> tuple[list[str], bool] | None:
    """(pooling modes, normalize) of a sentence-transformers folder, None for a plain transformers
    one; SourceError for a pipeline kompile cannot compose."""
    entries = modules(folder)
    return None if entries is None else pooling_plan(folder, entries)
