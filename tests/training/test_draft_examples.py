"""Random prefix / next-k splits for drafter training."""

from __future__ import annotations

import pytest
import torch

from specdec_hf.training import sample_draft_examples


def test_prefix_and_labels_reassemble_the_target():
    targets = torch.tensor([[2, 10, 11, 12, 13, 2, 1, 1], [2, 20, 21, 2, 1, 1, 1, 1]])
    lengths = torch.tensor([6, 4])
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        batch = sample_draft_examples(targets, lengths, num_draft_tokens=3, pad_token_id=1, generator=generator)
        for row in range(2):
            split = int(batch.decoder_attention_mask[row].sum())
            assert 1 <= split <= int(lengths[row]) - 1
            assert batch.decoder_input_ids[row, :split].tolist() == targets[row, :split].tolist()
            assert (batch.decoder_input_ids[row, split:] == 1).all()
            expected = targets[row, split : split + 3].tolist()
            expected = [t if split + i < lengths[row] else -100 for i, t in enumerate(expected)]
            expected += [-100] * (3 - len(expected))
            assert batch.labels[row].tolist() == expected


def test_every_split_point_occurs():
    targets = torch.arange(10).unsqueeze(0)
    generator = torch.Generator().manual_seed(1)
    seen = {
        int(sample_draft_examples(targets, torch.tensor([10]), 2, 0, generator).decoder_attention_mask.sum())
        for _ in range(300)
    }
    assert seen == set(range(1, 10))


def test_too_short_target_is_rejected():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        sample_draft_examples(torch.tensor([[2, 1]]), torch.tensor([1]), 2, 1)
