"""What the lookup drafters share: their default largest k, their integer checks, and each row's last tokens read
once on the host."""

from __future__ import annotations

import torch

__all__ = ["DEFAULT_MAX_DRAFT_TOKENS", "is_positive_int", "row_tails"]

# the largest k of a lookup drafter where k is chosen as decoding runs (its default)
DEFAULT_MAX_DRAFT_TOKENS = 8


def is_positive_int(value) -> bool:
    """Whether `value` is an `int` of at least 1 (`True` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def row_tails(prefix_ids: torch.LongTensor, prefix_lengths: torch.LongTensor, count: int) -> list[list[int]]:
    """Each row's last `count` committed tokens (fewer in a shorter row), as host lists.

    Args:
        prefix_ids (`torch.LongTensor` of shape `(rows, width)`): Committed tokens, right-padded.
        prefix_lengths (`torch.LongTensor` of shape `(rows,)`): Valid tokens per row.
        count (`int`): How many of each row's last tokens.
    """
    lengths = prefix_lengths.tolist()
    # one transfer of the columns the tails span (on the CPU one read and Python slices cost less than gathering
    # them first)
    start = max(min(lengths) - count, 0)
    window = prefix_ids[:, start : max(lengths)].tolist()
    return [row[max(length - count, 0) - start : length - start] for row, length in zip(window, lengths, strict=True)]
