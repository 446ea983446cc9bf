"""Right-padding of token id lists into a batch (sources for the encoder, verifier outputs for training)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["pad_token_ids"]


def pad_token_ids(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Stack id lists of different lengths, right-padded.

    Args:
        sequences (`Sequence[Sequence[int]]`): One list (or 1-D tensor) of token ids per row.
        pad_token_id (`int`): Written after each row's ids.

    Returns:
        `(input_ids, attention_mask)`, both `torch.LongTensor` of shape `(rows, longest)`; the mask is 1 on real
        tokens.
    """
    rows = [torch.as_tensor(ids, dtype=torch.long) for ids in sequences]
    input_ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_token_id)
    lengths = torch.tensor([len(row) for row in rows])
    attention_mask = (torch.arange(input_ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return input_ids, attention_mask
