"""Distillation of a drafter on in-memory tensors: for quick experiments, examples and tests.

`train_drafter.py` is the full trainer (Accelerate, datasets, checkpoints); this is the same objective in a
dozen lines, for data that fits in memory: the verifier's greedy outputs on a batch of sources.
"""

from __future__ import annotations

import torch

from ..distillation import lengths_up_to_eos
from .block_examples import sample_block_examples

__all__ = ["distill_greedy_outputs", "fit_drafter_in_memory"]


@torch.no_grad()
def distill_greedy_outputs(verifier, input_ids: torch.LongTensor, attention_mask: torch.LongTensor, **generate_kwargs):
    """The verifier's greedy outputs and their lengths (up to and including the first EOS).

    Returns:
        `(targets, lengths)`: `torch.LongTensor` of shape `(batch_size, length)` and `(batch_size,)`.
    """
    targets = verifier.generate(
        input_ids=input_ids, attention_mask=attention_mask, do_sample=False, num_beams=1, **generate_kwargs
    )
    return targets, lengths_up_to_eos(targets, verifier.generation_config.eos_token_id)


def fit_drafter_in_memory(
    drafter,
    input_ids: torch.LongTensor,
    attention_mask: torch.LongTensor,
    targets: torch.LongTensor,
    target_lengths: torch.LongTensor,
    steps: int = 200,
    batch_size: int = 16,
    learning_rate: float = 3e-3,
    label_smoothing: float = 0.1,
    seed: int = 0,
) -> list[float]:
    """Train `drafter` with random prefix / next-k splits of `targets` (Adam, constant learning rate).

    Args:
        drafter (`SpecDrafterModel`): Trained in place; left in eval mode.
        input_ids, attention_mask (`torch.LongTensor` of shape `(num_examples, source_length)`): Sources.
        targets (`torch.LongTensor` of shape `(num_examples, target_length)`): Verifier outputs, start token first.
        target_lengths (`torch.LongTensor` of shape `(num_examples,)`): Valid target tokens per example.

    Returns:
        `list[float]`: the loss of every step.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=learning_rate)
    pad = drafter.config.pad_token_id
    losses = []
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(0, input_ids.shape[0], (batch_size,), generator=generator)
        batch = sample_block_examples(targets[rows], target_lengths[rows], drafter.block_size, pad, generator)
        loss = drafter(
            input_ids=input_ids[rows],
            attention_mask=attention_mask[rows],
            decoder_input_ids=batch.decoder_input_ids,
            decoder_attention_mask=batch.decoder_attention_mask,
            labels=batch.labels,
            label_smoothing=label_smoothing,
        ).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    drafter.eval()
    return losses
