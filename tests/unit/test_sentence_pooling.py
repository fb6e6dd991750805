"""sentence_pooling's modes on a left- and a right-padded batch: padding never counts."""

from __future__ import annotations

import pytest
import torch

from kompile.compile_jobs import sentence_modules, sentence_pooling
from kompile.compile_jobs.sentence_pooling import SentenceEmbedder

# Two sentences of 2 tokens, the first padded on the right, the second on the left; the padding's
# embeddings are large, so a mode that counted them would be far off.
TOKENS = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [90.0, 90.0]], [[-90.0, 90.0], [5.0, 0.0], [1.0, 2.0]]])
MASK = torch.tensor([[1, 1, 0], [0, 1, 1]])
EXPECTED = {
    "cls_token": [[1.0, 2.0], [-90.0, 90.0]],  # position 0, as sentence-transformers takes it
    "max_tokens": [[3.0, 2.0], [5.0, 2.0]],
    "mean_tokens": [[2.0, -1.0], [3.0, 1.0]],
    "mean_sqrt_len_tokens": [[4.0 / 2**0.5, -2.0 / 2**0.5], [6.0 / 2**0.5, 2.0 / 2**0.5]],
    "weightedmean_tokens": [[(1 + 6) / 3, (2 - 8) / 3], [(10 + 3) / 5, (0 + 6) / 5]],
    "lasttoken": [[3.0, -4.0], [1.0, 2.0]],
}


@pytest.mark.parametrize("mode", sentence_modules.MODES)
def test_each_mode_pools_the_unpadded_tokens(mode: str) -> None:
    pooled = sentence_pooling._pool(mode, TOKENS, MASK)
    torch.testing.assert_close(pooled, torch.tensor(EXPECTED[mode]))


class _Transformer(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        class Out:
            last_hidden_state = TOKENS

        return Out()


def test_modes_concatenate_in_order_and_normalize() -> None:
    embedder = SentenceEmbedder(_Transformer(), ["cls_token", "mean_tokens"], normalize=True)
    out = embedder(torch.zeros(2, 3, dtype=torch.int64), MASK)
    assert out["sentence_embedding"].shape == (2, 4)
    torch.testing.assert_close(out["sentence_embedding"].norm(dim=1), torch.ones(2))
    raw = torch.cat([torch.tensor(EXPECTED["cls_token"]), torch.tensor(EXPECTED["mean_tokens"])], dim=1)
    torch.testing.assert_close(out["sentence_embedding"], torch.nn.functional.normalize(raw, dim=1))
    assert out["token_embeddings"] is TOKENS
