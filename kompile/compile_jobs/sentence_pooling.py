"""A sentence-transformers model as its users call it: the token embeddings and the pooled sentence
embedding, as sentence-transformers' own ONNX export names them (`token_embeddings`,
`sentence_embedding`). Loaded as the bare transformer it gave last_hidden_state and BERT's pooler,
which sentence-transformers never trained or uses: a served model whose callers pool by hand, or
take the pooler for the embedding. The pooling is written out here from the modes
1_Pooling/config.json names (sentence_modules reads them; torch only: nothing from
sentence-transformers, which kompile does not install)."""

from __future__ import annotations

import torch


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
