"""Tiny Spec-Drafters for tests: a config of vocab 99 and width 32, and drafting with it from a fresh state."""

from __future__ import annotations

import torch
from conftest import VOCAB_SIZE

from specdec_hf import SpecDrafterAdapter
from specdec_hf.models import SpecDrafterConfig, SpecDrafterModel

NUM_DRAFT_TOKENS = 4  # the tiny drafters' mask slots
ATOL = 1e-5


def tiny_config(**overrides) -> SpecDrafterConfig:
    """A drafter config with its own 2-layer encoder, 2 decoder layers and 4 mask slots; `overrides` replace fields."""
    kwargs = dict(
        vocab_size=VOCAB_SIZE,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=256,
        max_draft_tokens=NUM_DRAFT_TOKENS,
        init_std=0.2,
        dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    kwargs.update(overrides)
    return SpecDrafterConfig(**kwargs)


def tiny_drafter(seed: int = 0, **overrides) -> SpecDrafterModel:
    """A randomly initialised drafter of `tiny_config(**overrides)`, in eval mode."""
    torch.manual_seed(seed)
    return SpecDrafterModel(tiny_config(**overrides)).eval()


def random_prefixes(lengths: list[int], seed: int = 0, width: int | None = None) -> torch.LongTensor:
    """Right-padded random prefixes starting with the decoder start token (2), padded with 1."""
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    prefix_ids = torch.randint(4, VOCAB_SIZE, (len(lengths), width), generator=generator)
    prefix_ids[:, 0] = 2
    for row, length in enumerate(lengths):
        prefix_ids[row, length:] = 1
    return prefix_ids


def propose_fresh(
    drafter: SpecDrafterModel,
    source,
    prefix_ids,
    lengths,
    num_draft_tokens=NUM_DRAFT_TOKENS,
    encoder_hidden_states=None,
):
    """One drafting call of `drafter` (through its adapter) from a fresh drafting state."""
    adapter = SpecDrafterAdapter(drafter)
    state = adapter.init_drafting_state(source["input_ids"], source["attention_mask"], encoder_hidden_states)
    return adapter.propose(state, prefix_ids, torch.as_tensor(lengths), num_draft_tokens)
