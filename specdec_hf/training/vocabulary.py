"""The vocabulary of a reduced drafter head: the most frequent target tokens of the training data.

FR-Spec (Zhao et al., 2025, arXiv 2502.14856) and EAGLE-3 restrict the drafter's output layer to the tokens the
verifier emits most often: the head's cost falls with its size, and the tokens left out are rarely right anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["frequent_token_ids", "token_counts", "token_coverage"]


def token_counts(target_ids: Iterable[list[int]], vocab_size: int) -> torch.LongTensor:
    """Occurrences of each id among the predicted positions (every position but the decoder start token).

    Rows are read one at a time and counted in chunks, so a memory-mapped corpus of any size can be streamed in; count
    once and pass the counts to `frequent_token_ids` and `token_coverage`.

    Args:
        target_ids (iterable of `list[int]`): Distilled targets, each starting with the decoder start token.
        vocab_size (`int`): The verifier's vocabulary size.

    Returns:
        `torch.LongTensor` of shape `(vocab_size,)`.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    chunk: list[int] = []
    for ids in target_ids:
        chunk.extend(ids[1:])
        if len(chunk) >= 1_000_000:
            counts += torch.bincount(torch.as_tensor(chunk, dtype=torch.long), minlength=vocab_size)
            chunk.clear()
    if chunk:
        counts += torch.bincount(torch.as_tensor(chunk, dtype=torch.long), minlength=vocab_size)
    return counts


def frequent_token_ids(counts: torch.LongTensor, size: int) -> torch.LongTensor:
    """The `size` ids counted most often (ties by smaller id), most frequent first.

    Args:
        counts (`torch.LongTensor` of shape `(vocab_size,)`): From `token_counts`.
        size (`int`): Ids to keep, in `[1, vocab_size]`.

    Returns:
        `torch.LongTensor` of shape `(size,)`.
    """
    if not 1 <= size <= counts.numel():
        raise ValueError(f"`draft_vocab_size` must be between 1 and the vocabulary size {counts.numel()}, got {size}.")
    # stable sort on -count keeps smaller ids first among equal counts
    return torch.sort(-counts, stable=True).indices[:size]


def token_coverage(counts: torch.LongTensor, kept_ids: torch.LongTensor) -> float:
    """Fraction of the counted target tokens that lie in `kept_ids`."""
    return float(counts[kept_ids].sum()) / max(int(counts.sum()), 1)
