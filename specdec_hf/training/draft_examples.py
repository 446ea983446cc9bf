"""Drafter training examples: splits of the verifier's output into prefix and next-k targets.

Xia et al. (2023, arXiv 2203.16487, §3.1) train the Spec-Drafter on the verifier's own outputs (sequence-level
distillation): for each target and step, pick a random split point, feed the prefix followed by k mask queries, and
predict the k tokens after the split. Targets past the end of the sequence are ignored. A drafter with a causal
prefix can instead learn from every split point of a sequence in one forward pass (`every_split_labels`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftExamples", "choose_split_lengths", "every_split_labels", "sample_draft_examples"]


@dataclass
class DraftExamples:
    """One batch of drafter inputs and labels.

    Args:
        decoder_input_ids (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`): Right-padded prefixes.
        decoder_attention_mask (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`): 1 on prefix tokens.
        labels (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`): Next k tokens; -100 past the sequence end.
    """

    decoder_input_ids: torch.LongTensor
    decoder_attention_mask: torch.LongTensor
    labels: torch.LongTensor


def sample_draft_examples(
    target_ids: torch.LongTensor,
    target_lengths: torch.LongTensor,
    num_draft_tokens: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> DraftExamples:
    """Split every target at a uniformly random point into a prefix and the k tokens that follow.

    Args:
        target_ids (`torch.LongTensor` of shape `(batch_size, max_length)`):
            Decoder sequences starting with the decoder start token (e.g. the verifier's greedy output), ending with
            EOS, right-padded.
        target_lengths (`torch.LongTensor` of shape `(batch_size,)`): Valid tokens per row (at least 2).
        num_draft_tokens (`int`): k, the number of tokens to predict after the split.
        pad_token_id (`int`): Written in the padded prefix slots.
        generator (`torch.Generator`, *optional*): For reproducible splits.

    Returns:
        `DraftExamples`: prefixes of length in `[1, length - 1]` and their next-k labels.
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

    label_positions = splits.unsqueeze(1) + torch.arange(num_draft_tokens, device=device)
    in_range = label_positions < target_lengths.unsqueeze(1)
    labels = target_ids.gather(1, label_positions.clamp(max=target_ids.shape[1] - 1))
    labels = torch.where(in_range, labels, -100)
    return DraftExamples(decoder_input_ids, prefix_mask.long(), labels)


def choose_split_lengths(
    max_length: int, max_splits: int | None = None, generator: torch.Generator | None = None
) -> torch.LongTensor:
    """Prefix lengths to train on in one pass: all of `1 .. max_length - 1`, or `max_splits` of them at random.

    Returns:
        `torch.LongTensor` of shape `(num_splits,)`, increasing.
    """
    lengths = torch.arange(1, max(max_length, 2))
    if max_splits is not None and lengths.numel() > max_splits:
        chosen = torch.randperm(lengths.numel(), generator=generator)[:max_splits]
        lengths = lengths[chosen.sort().values]
    return lengths


def every_split_labels(
    target_ids: torch.LongTensor,
    target_lengths: torch.LongTensor,
    split_lengths: torch.LongTensor,
    num_draft_tokens: int,
) -> torch.LongTensor:
    """The k tokens after each prefix length of `split_lengths`, for every row; -100 past the row's end.

    Args:
        target_ids (`torch.LongTensor` of shape `(batch_size, max_length)`): Right-padded verifier outputs.
        target_lengths (`torch.LongTensor` of shape `(batch_size,)`): Valid tokens per row.
        split_lengths (`torch.LongTensor` of shape `(num_splits,)`): Prefix lengths (shared by the rows).
        num_draft_tokens (`int`): k.

    Returns:
        `torch.LongTensor` of shape `(batch_size, num_splits, num_draft_tokens)`.
    """
    device = target_ids.device
    positions = split_lengths.to(device)[:, None] + torch.arange(num_draft_tokens, device=device)  # (S, k)
    labels = target_ids[:, positions.clamp(max=target_ids.shape[1] - 1)]
    in_range = positions[None] < target_lengths.to(device)[:, None, None]
    return torch.where(in_range, labels, -100)
