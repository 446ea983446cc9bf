"""The reduced head's vocabulary: counted once over the predicted positions, most frequent ids first."""

from __future__ import annotations

import pytest
import torch
from conftest import build_verifier

from specdec_hf import SpecDrafterModel
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


@pytest.mark.parametrize(
    ("draft_vocab_ids", "match"),
    [
        ([1, 2, 500], r"`draft_vocab_ids` must lie in \[0, 99\) \(the vocabulary\)"),
        ([-1, 2], r"`draft_vocab_ids` must lie in \[0, 99\)"),
        ([1, 1, 2], "`draft_vocab_ids` must be distinct verifier ids"),
    ],
)
def test_a_head_over_ids_outside_the_vocabulary_or_repeated_is_refused(draft_vocab_ids, match):
    with pytest.raises(ValueError, match=match):
        SpecDrafterModel.from_verifier(build_verifier("bart"), max_draft_tokens=4, draft_vocab_ids=draft_vocab_ids)
