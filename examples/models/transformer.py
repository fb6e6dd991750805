"""A BERT-base-shaped transformer encoder built from a config (random seeded weights)."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel


class BertEncoder(torch.nn.Module):
    """BertModel with plain tensor inputs and one tensor output, as exporters and servers want."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        hidden: torch.Tensor = out.last_hidden_state
        return hidden


def bert_base(attn_implementation: str = "eager") -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        attn_implementation=attn_implementation,
    )
    return BertEncoder(config).eval()


def bert_base_sdpa() -> torch.nn.Module:
    """bert_base on SDPA attention, transformers' default when a model is built or loaded."""
    return bert_base("sdpa")


def bert_tiny(attn_implementation: str = "eager") -> torch.nn.Module:
    """A 2-layer BERT for fast tests: the same graph structure at a fraction of the cost."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=128,
        attn_implementation=attn_implementation,
    )
    return BertEncoder(config).eval()


def bert_tiny_sdpa() -> torch.nn.Module:
    """bert_tiny on SDPA attention, transformers' default when a model is built or loaded."""
    return bert_tiny("sdpa")
