"""Glancing training (GLAT; Qian et al., 2021, arXiv 2008.07905), the optional refinement of Xia et al. (2023, §3.1).

A first pass predicts all k slots; then, for each row, ``ratio × (number of wrong predictions)`` randomly chosen
slots are given their target token as input, and the loss is taken on the slots that stayed masked. Rows the
drafter already gets right are trained as usual; rows it gets badly wrong are made easier, as in curriculum learning.
"""

from __future__ import annotations

import torch

__all__ = ["glancing_targets"]


def glancing_targets(
    predictions: torch.LongTensor,
    labels: torch.LongTensor,
    ratio: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Choose the slots to reveal and the labels left to learn.

    Args:
        predictions (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`): First-pass argmax of the drafter.
        labels (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`): Targets; -100 marks slots past the end.
        ratio (`float`): Fraction of the wrong predictions revealed (GLAT's λ), in [0, 1): at 1 a batch with no
            right prediction would have nothing left to learn.
        generator (`torch.Generator`, *optional*): For reproducible choices.

    Returns:
        `(glance_ids, loss_labels)`, both `(batch_size, num_draft_tokens)`: the revealed targets (-100 elsewhere), for the
        drafter's `glance_ids`; and the labels with the revealed slots set to -100.
    """
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"glancing `ratio` must be in [0, 1), got {ratio}.")
    valid = labels != -100
    wrong = (predictions != labels) & valid
    num_reveal = (ratio * wrong.sum(dim=1).float()).floor().long()
    # a random order of each row's valid slots: reveal the first num_reveal of them
    scores = torch.rand(labels.shape, generator=generator).to(labels.device).masked_fill(~valid, 2.0)
    rank = scores.argsort(dim=1).argsort(dim=1)
    reveal = (rank < num_reveal.unsqueeze(1)) & valid
    return torch.where(reveal, labels, -100), torch.where(reveal, -100, labels)
