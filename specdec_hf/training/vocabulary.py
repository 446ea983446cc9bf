"""The vocabulary of a reduced drafter head: the most frequent target tokens of the training data.

FR-Spec (Zhao et al., 2025, arXiv 2502.14856) and EAGLE-3 restrict the drafter's output layer to the tokens the
verifier emits most often: the head's cost falls with its size, and the tokens left out are rarely right anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["frequent_token_ids", "token_coverage"]


def _counts(target_ids: Iterable[list[int]], vocab_size: int) -> torch.Tensor:
    """Occurrences of each id among the predicted positions (every position but the decoder start token).

    Rows are read one at a time and counted in chunks, so a memory-mapped corpus of any size can be streamed in.
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


def frequent_token_ids(target_ids: Iterable[list[int]], vocab_size: int, size: int) -> torch.LongTensor:
    """The `size` ids the targets contain most often (ties by smaller id), most frequent first.

    Args:
        target_ids (iterable of `list[int]`): Distilled targets, each starting with the decoder start token.
        vocab_size (`int`): The verifier's vocabulary size.
        size (`int`): Ids to keep, in `[1, vocab_size]`.

    Returns:
        `torch.LongTensor` of shape `(size,)`.
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"`draft_vocab_size` must be between 1 and the vocabulary size {vocab_size}, got {size}.")
    counts = _counts(target_ids, vocab_size)
    # stable sort on -count keeps smaller ids first among equal counts
    return torch.sort(-counts, stable=True).indices[:size]


def token_coverage(target_ids: Iterable[list[int]], kept_ids: torch.LongTensor, vocab_size: int) -> float:
    """Fraction of the predicted target tokens that lie in `kept_ids`."""
    counts = _counts(target_ids, vocab_size)
    return float(counts[kept_ids].sum()) / max(int(counts.sum()), 1)
