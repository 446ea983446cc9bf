"""The attention layout that trains a drafter on every split point of a sequence in one forward pass.

The drafter's prefix attends causally (`prefix_attention="causal"`), so the states of a sequence's prefix positions
are the same for every split point. One forward therefore serves all splits: the sequence is laid out once, followed
by k mask slots per split, and a block-structured mask lets the slots of split s (prefix length L_s) attend to prefix
positions < L_s and to each other only, exactly what a separate call with that prefix would see.
"""

from __future__ import annotations

import torch

__all__ = ["every_split_attention_mask"]


def every_split_attention_mask(
    prefix_mask: torch.BoolTensor, split_lengths: torch.LongTensor, num_draft_tokens: int
) -> torch.BoolTensor:
    """Self-attention mask of `[sequence; k slots of split 1; ...; k slots of split S]`, `True` = may attend.

    Args:
        prefix_mask (`torch.BoolTensor` of shape `(batch_size, length)`): `True` for real (non-padding) tokens.
        split_lengths (`torch.LongTensor` of shape `(num_splits,)`): Prefix length L_s of each split (shared by the
            batch), each in `[1, length]`.
        num_draft_tokens (`int`): k, mask slots per split.

    Returns:
        `torch.BoolTensor` of shape `(batch_size, 1, length + num_splits * k, length + num_splits * k)`.
    """
    batch_size, length = prefix_mask.shape
    num_splits = split_lengths.shape[0]
    device = prefix_mask.device
    positions = torch.arange(length, device=device)
    # prefix queries: causal over real tokens, never the slots
    prefix_rows = (positions[None, :] <= positions[:, None])[None] & prefix_mask[:, None, :]  # (B, T, T)
    prefix_rows = torch.cat(
        [prefix_rows, prefix_mask.new_zeros(batch_size, length, num_splits * num_draft_tokens)], dim=2
    )
    # slot queries of split s: prefix keys < L_s, and the slots of the same split
    slot_split = torch.arange(num_splits, device=device).repeat_interleave(num_draft_tokens)  # (S*k,)
    to_prefix = (positions[None, :] < split_lengths[slot_split][:, None])[None] & prefix_mask[:, None, :]
    to_slots = (slot_split[:, None] == slot_split[None, :])[None].expand(batch_size, -1, -1)
    slot_rows = torch.cat([to_prefix, to_slots], dim=2)  # (B, S*k, T + S*k)
    return torch.cat([prefix_rows, slot_rows], dim=1)[:, None]
