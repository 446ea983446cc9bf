"""Glancing training (GLAT): which slots are revealed, and how the drafter reads them."""

from __future__ import annotations

import pytest
import torch
from conftest import build_verifier

from specdec_hf import SpecDrafterModel
from specdec_hf.training import glancing_targets


def test_reveals_ratio_of_wrong_predictions_among_valid_slots():
    labels = torch.tensor([[5, 6, 7, 8], [5, 6, -100, -100], [1, 2, 3, 4]])
    predictions = torch.tensor([[0, 0, 0, 0], [0, 6, 0, 0], [1, 2, 3, 4]])  # 4, 1 and 0 wrong
    generator = torch.Generator().manual_seed(0)
    glance_ids, loss_labels = glancing_targets(predictions, labels, 0.5, generator)
    revealed = glance_ids != -100
    assert revealed.sum(1).tolist() == [2, 0, 0]
    assert torch.equal(glance_ids[revealed], labels[revealed])
    assert (loss_labels[revealed] == -100).all()
    assert torch.equal(loss_labels[~revealed], labels[~revealed])
    most = glancing_targets(predictions, labels, 0.99, generator)[0]
    assert (most != -100).sum(1).tolist() == [3, 0, 0]


def test_ratio_is_validated():
    for ratio in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="ratio"):
            glancing_targets(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), ratio)


def test_drafter_reads_revealed_tokens_only_where_asked():
    verifier = build_verifier("bart")
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1).eval()
    inputs = dict(input_ids=torch.randint(4, 99, (2, 7)), decoder_input_ids=torch.tensor([[2, 10, 11], [2, 12, 13]]))
    plain = drafter(**inputs).logits
    none_revealed = drafter(**inputs, glance_ids=torch.full((2, 4), -100)).logits
    torch.testing.assert_close(none_revealed, plain)
    revealed = drafter(**inputs, glance_ids=torch.tensor([[-100, 30, -100, -100], [-100] * 4])).logits
    assert not torch.allclose(revealed[0], plain[0])
    torch.testing.assert_close(revealed[1], plain[1])
