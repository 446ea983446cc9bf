"""Drafter training examples: a random split of the verifier's output into prefix and next-k targets.

Xia et al. (2023, arXiv 2203.16487, §3.1) train the Spec-Drafter on the verifier's own outputs (sequence-level
distillation): for each target and step, pick a random split point, feed the prefix followed by k mask queries, and
predict the k tokens after the split. Targets past the end of the sequence are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BlockExamples", "sample_block_examples"]


@dataclass
class BlockExamples:
    """One batch of drafter inputs and labels.

    Args:
        decoder_input_ids (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`): Right-padded prefixes.
        decoder_attention_mask (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`): 1 on prefix tokens.
        labels (`torch.LongTensor` of shape `(batch_size, block_size)`): Next k tokens; -100 past the sequence end.
    """

    decoder_input_ids: torch.LongTensor
    decoder_attention_mask: torch.LongTensor
    labels: torch.LongTensor


def sample_block_examples(
    target_ids: torch.LongTensor,
    target_lengths: torch.LongTensor,
    block_size: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> BlockExamples:
    """Split every target at a uniformly random point into a prefix and the k tokens that follow.

    Args:
        target_ids (`torch.LongTensor` of shape `(batch_size, max_length)`):
            Decoder sequences starting with the decoder start token (e.g. the verifier's greedy output), ending with
            EOS, right-padded.
        target_lengths (`torch.LongTensor` of shape `(batch_size,)`): Valid tokens per row (at least 2).
        block_size (`int`): k, the number of tokens to predict after the split.
        pad_token_id (`int`): Written in the padded prefix slots.
        generator (`torch.Generator`, *optional*): For reproducible splits.

    Returns:
        `BlockExamples`: prefixes of length in `[1, length - 1]` and their next-k labels.
    """
    if (target_lengths < 2).any():
        raise ValueError("every target needs at least 2 tokens (the decoder start token and one token to predict)")
    batch_size = target_ids.shape[0]
    device = target_ids.device
    # split point s in [1, length - 1]: the prefix keeps the start token, at least one token remains to predict
    uniform = torch.rand(batch_size, generator=generator, device=generator.device if generator else None).to(device)
    splits = 1 + (uniform * (target_lengths - 1)).long().clamp(max=target_lengths - 2)
    max_prefix = int(splits.max())
    positions = torch.arange(max_prefix, device=device).unsqueeze(0)
    prefix_mask = positions < splits.unsqueeze(1)
    decoder_input_ids = torch.where(prefix_mask, target_ids[:, :max_prefix], pad_token_id)

    label_positions = splits.unsqueeze(1) + torch.arange(block_size, device=device)
    in_range = label_positions < target_lengths.unsqueeze(1)
    labels = target_ids.gather(1, label_positions.clamp(max=target_ids.shape[1] - 1))
    labels = torch.where(in_range, labels, -100)
    return BlockExamples(decoder_input_ids, prefix_mask.long(), labels)
