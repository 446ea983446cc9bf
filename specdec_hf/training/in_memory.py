"""Distillation of a drafter on in-memory tensors: for quick experiments, examples and tests.

`train_drafter.py` is the full trainer (Accelerate, datasets, checkpoints); this runs the same training step
(`specdec_hf.training.loss`) for data that fits in memory: the verifier's greedy outputs on a batch of sources.
"""

from __future__ import annotations

import torch

from ..data.padding import lengths_up_to_eos
from .loss import DrafterLossSettings, drafter_training_loss

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
    label_smoothing: float | None = None,
    seed: int = 0,
    verifier=None,
    settings: DrafterLossSettings | None = None,
) -> list[float]:
    """Train `drafter` on `targets` with the training step of `train_drafter.py` (Adam, constant learning rate).

    Args:
        drafter (`SpecDrafterModel`): Trained in place; left in eval mode.
        input_ids, attention_mask (`torch.LongTensor` of shape `(num_examples, source_length)`): Sources.
        targets (`torch.LongTensor` of shape `(num_examples, target_length)`): Verifier outputs, start token first.
        target_lengths (`torch.LongTensor` of shape `(num_examples,)`): Valid target tokens per example.
        verifier (`PreTrainedModel`, *optional*): The frozen verifier; needed by drafters that read its encoder
            output or decoder states, and for soft labels.
        label_smoothing (`float`, *optional*): Of the default loss (0.1); give it inside `settings` otherwise.
        settings ([`DrafterLossSettings`], *optional*): The loss (default: one random split per sequence).

    Returns:
        `list[float]`: the loss of every step.
    """
    if settings is not None and label_smoothing is not None:
        raise ValueError("pass `label_smoothing` inside `settings` (DrafterLossSettings), not both.")
    settings = settings or DrafterLossSettings(label_smoothing=0.1 if label_smoothing is None else label_smoothing)
    needs_verifier = (
        drafter.config.use_verifier_encoder or drafter.config.verifier_state_layers or settings.soft_label_weight > 0
    )
    if needs_verifier and verifier is None:
        raise ValueError(
            "This drafter (or soft labels) needs the verifier's states: pass `verifier=` to fit_drafter_in_memory."
        )
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=learning_rate)
    losses = []
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(0, input_ids.shape[0], (batch_size,), generator=generator)
        batch = {
            "input_ids": input_ids[rows],
            "attention_mask": attention_mask[rows],
            "target_ids": targets[rows],
            "target_lengths": target_lengths[rows],
        }
        loss, _ = drafter_training_loss(drafter, verifier, batch, settings, generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    drafter.eval()
    return losses
