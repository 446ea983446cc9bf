"""The reduced head's vocabulary: counted once over the predicted positions, most frequent ids first."""

from __future__ import annotations

import pytest
import torch

from specdec_hf.training import frequent_token_ids, token_counts, token_coverage


def test_counts_skip_the_start_token_and_rank_by_frequency():
    targets = [[0, 5, 5, 7, 1], [0, 7, 5, 1], [0, 1]]  # decoder start 0 is never predicted
    counts = token_counts(iter(targets), vocab_size=9)
    assert counts.tolist() == [0, 3, 0, 0, 0, 3, 0, 2, 0]
    # ties (1 and 5, three each) by the smaller id
    assert frequent_token_ids(counts, 3).tolist() == [1, 5, 7]
    assert token_coverage(counts, torch.tensor([1, 5])) == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        frequent_token_ids(counts, 10)
