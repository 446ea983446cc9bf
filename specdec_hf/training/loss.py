"""The drafter's training step: one loss function for `train_drafter.py` and the in-memory trainer.

Sequence-level distillation (Xia et al., 2023, arXiv 2203.16487, §3.1): the drafter predicts the verifier's own
output k tokens at a time. A batch's loss is built from

- **split points**: one random split per sequence (the paper), or every split point of every sequence in one forward
  pass (`split_points="all"`, causal prefix attention), which gives each step many times more training signal;
- **glancing** (GLAT, Qian et al. 2021): a first pass, then a fraction of the wrong slots is revealed;
- **the verifier's teacher-forced pass** over the distilled target (no gradient), run only when something needs it:
  its encoder output (drafters that read it), its distribution at every drafted position (soft labels: a KL term,
  as in knowledge distillation) and its decoder states (drafters with `verifier_state_layers`, EAGLE-style).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .draft_examples import choose_split_lengths, every_split_labels, sample_draft_examples
from .glancing import glancing_targets

__all__ = ["DrafterLossSettings", "VerifierTeacherOutputs", "drafter_training_loss", "verifier_teacher_outputs"]

SPLIT_POINTS = ("random", "all")


@dataclass
class DrafterLossSettings:
    """What the training loss of a batch is made of.

    Args:
        split_points (`str`): `"random"` (one split per sequence and step) or `"all"` (every split, one pass).
        max_splits (`int`, *optional*): With `"all"`, at most this many split points per batch (drawn at random,
            shared by the rows), to bound the cost on long sequences.
        label_smoothing (`float`): Of the cross-entropy on the verifier's tokens.
        glancing_ratio (`float`): GLAT's λ (0 disables glancing).
        soft_label_weight (`float`): Weight of KL(verifier ‖ drafter) at every drafted position (0 disables).
    """

    split_points: str = "random"
    max_splits: int | None = None
    label_smoothing: float = 0.1
    glancing_ratio: float = 0.0
    soft_label_weight: float = 0.0

    def __post_init__(self):
        if self.split_points not in SPLIT_POINTS:
            raise ValueError(f"`split_points` must be one of {SPLIT_POINTS}, got {self.split_points!r}.")
        if self.max_splits is not None and self.max_splits < 1:
            raise ValueError(f"`max_splits` must be at least 1 (or None for all), got {self.max_splits}.")
        if not 0.0 <= self.glancing_ratio < 1.0:
            raise ValueError(f"`glancing_ratio` must be in [0, 1), got {self.glancing_ratio}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"`label_smoothing` must be in [0, 1), got {self.label_smoothing}.")
        if self.soft_label_weight < 0:
            raise ValueError(f"`soft_label_weight` must be >= 0, got {self.soft_label_weight}.")

    def describe(self, num_draft_tokens: int) -> str:
        """One line for a model card: what the drafter was trained to minimise."""
        splits = "a random split of each sequence per step"
        if self.split_points == "all":
            splits = "every split point of each sequence per step, in one pass"
            if self.max_splits is not None:
                splits += f" (at most {self.max_splits} per batch)"
        text = f"cross-entropy (label smoothing {self.label_smoothing}) on the next k = {num_draft_tokens} verifier tokens "
        text += f"after {splits}"
        if self.soft_label_weight > 0:
            text += f", plus {self.soft_label_weight} × KL to the verifier's distribution at each drafted position"
        if self.glancing_ratio > 0:
            text += f", glancing ratio {self.glancing_ratio}"
        return text


@dataclass
class VerifierTeacherOutputs:
    """What one frozen verifier pass gives a batch.

    Args:
        encoder_states (`torch.FloatTensor` of shape `(batch_size, source_length, verifier_d_model)`, *optional*):
            For a drafter with `use_verifier_encoder=True`.
        log_probs (`torch.FloatTensor` of shape `(batch_size, target_length, head_size)`, *optional*):
            The verifier's log-distribution over the drafter's head vocabulary at each target position (predicting
            the token after it), for soft labels.
        decoder_states (`torch.FloatTensor` of shape `(batch_size, target_length, feature_width)`, *optional*):
            The verifier's decoder states of the drafter's `verifier_state_layers`, concatenated.
    """

    encoder_states: torch.FloatTensor | None = None
    log_probs: torch.FloatTensor | None = None
    decoder_states: torch.FloatTensor | None = None


@torch.no_grad()
def verifier_teacher_outputs(
    verifier,
    drafter,
    batch: dict,
    soft_labels: bool,
    autocast: Callable[[], AbstractContextManager] | None = None,
) -> VerifierTeacherOutputs:
    """Run the frozen verifier over the batch's sources and distilled targets, only as far as the drafter needs.

    Args:
        verifier (`PreTrainedModel`): The encoder-decoder verifier (eval mode).
        drafter (`SpecDrafterModel`): The (unwrapped) drafter: decides what is needed.
        batch (`dict`): `input_ids`, `attention_mask`, `target_ids`, `target_lengths` (see `DistilledBatchCollator`).
        soft_labels (`bool`): Whether to return the verifier's log-distribution at every target position.
        autocast (`Callable`, *optional*): The run's mixed precision (e.g. `accelerator.autocast`): the verifier's
            passes run under it, as the drafter's do. Its outputs are float32 whatever it computed in.
    """
    config = drafter.config
    layers = config.verifier_state_layers
    if not (config.use_verifier_encoder or soft_labels or layers):
        return VerifierTeacherOutputs()
    with (autocast or contextlib.nullcontext)():
        encoder_states = verifier.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[
            0
        ]
        decoded = None
        if soft_labels or layers:
            target_ids = batch["target_ids"]
            target_mask = (
                torch.arange(target_ids.shape[1], device=target_ids.device) < batch["target_lengths"][:, None]
            )
            decoded = verifier(
                encoder_outputs=(encoder_states,),
                attention_mask=batch["attention_mask"],
                decoder_input_ids=target_ids,
                decoder_attention_mask=target_mask.long(),
                output_hidden_states=bool(layers),
                use_cache=False,
                return_dict=True,
            )
    # float32 for what the drafter and the loss read: its master weights, the log-softmax and the KL term
    outputs = VerifierTeacherOutputs(encoder_states=encoder_states.float() if config.use_verifier_encoder else None)
    if decoded is None:
        return outputs
    if soft_labels:
        logits = decoded.logits.float()
        if drafter.draft_vocab_ids is not None:
            logits = logits[..., drafter.draft_vocab_ids.to(logits.device)]
        outputs.log_probs = torch.log_softmax(logits, dim=-1)
    if layers:
        outputs.decoder_states = torch.cat([decoded.decoder_hidden_states[index] for index in layers], dim=-1).float()
    return outputs


def drafter_training_loss(
    model,
    verifier,
    batch: dict,
    settings: DrafterLossSettings,
    generator: torch.Generator | None = None,
    drafter=None,
    autocast: Callable[[], AbstractContextManager] | None = None,
) -> tuple[torch.Tensor, int]:
    """The loss of one batch, ready for `backward()`.

    Args:
        model: The drafter as called for the forward pass (e.g. wrapped by `accelerator.prepare`), in train mode.
        verifier (`PreTrainedModel`): The frozen verifier.
        batch (`dict`): From `DistilledBatchCollator`, on the model's device.
        settings ([`DrafterLossSettings`]): What the loss is made of.
        generator (`torch.Generator`, *optional*): Draws split points and glancing choices (CPU generator).
        drafter (`SpecDrafterModel`, *optional*): The unwrapped model, when `model` is a wrapper.
        autocast (`Callable`, *optional*): The run's mixed precision for the verifier's teacher pass (e.g.
            `accelerator.autocast`; a model prepared by accelerate already runs its own forward under it).

    Returns:
        `(loss, num_label_tokens)`: the mean loss over the drafted positions and how many target tokens it covers.
    """
    drafter = model if drafter is None else drafter
    pad = drafter.config.pad_token_id
    num_draft_tokens = drafter.config.max_draft_tokens  # every mask slot is trained
    device = batch["input_ids"].device
    teacher = verifier_teacher_outputs(verifier, drafter, batch, settings.soft_label_weight > 0, autocast)
    inputs = dict(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        encoder_hidden_states=teacher.encoder_states,
    )
    if settings.split_points == "all":
        target_ids, target_lengths = batch["target_ids"], batch["target_lengths"]
        split_lengths = choose_split_lengths(int(target_lengths.max()), settings.max_splits, generator).to(device)
        labels = every_split_labels(target_ids, target_lengths, split_lengths, num_draft_tokens)
        target_mask = torch.arange(target_ids.shape[1], device=device) < target_lengths[:, None]
        inputs.update(
            decoder_input_ids=target_ids,
            decoder_attention_mask=target_mask.long(),
            split_lengths=split_lengths,
            verifier_states=teacher.decoder_states,
        )
        # the verifier's distribution over target position p sits at teacher position p - 1
        label_positions = split_lengths[:, None] + torch.arange(num_draft_tokens, device=device)  # (S, k)
    else:
        blocks = sample_draft_examples(
            batch["target_ids"].cpu(), batch["target_lengths"].cpu(), num_draft_tokens, pad, generator
        )
        labels = blocks.labels.to(device)
        prefix_length = blocks.decoder_input_ids.shape[1]
        inputs.update(
            decoder_input_ids=blocks.decoder_input_ids.to(device),
            decoder_attention_mask=blocks.decoder_attention_mask.to(device),
            verifier_states=None if teacher.decoder_states is None else teacher.decoder_states[:, :prefix_length],
        )
        splits = blocks.decoder_attention_mask.sum(dim=1).to(device)
        label_positions = splits[:, None] + torch.arange(num_draft_tokens, device=device)  # (B, k)

    glance_ids = None
    if settings.glancing_ratio > 0:
        with torch.no_grad():
            predictions = drafter.from_draft_vocab(model(**inputs).logits.argmax(dim=-1))
        glance_ids, labels = glancing_targets(
            predictions.flatten(0, -2).cpu(), labels.flatten(0, -2).cpu(), settings.glancing_ratio, generator
        )
        glance_ids, labels = glance_ids.view(predictions.shape).to(device), labels.view(predictions.shape).to(device)
    # the label loss is the drafter's own (forward's `labels`), so training and `model(labels=...)` cannot drift
    outputs = model(**inputs, glance_ids=glance_ids, labels=labels, label_smoothing=settings.label_smoothing)
    loss = outputs.loss
    if settings.soft_label_weight > 0:
        teacher_index = (label_positions - 1).clamp(min=0, max=teacher.log_probs.shape[1] - 1)
        if settings.split_points == "all":
            teacher_log_probs = teacher.log_probs[:, teacher_index]  # (B, S, k, head)
        else:
            rows = torch.arange(teacher_index.shape[0], device=device)[:, None]
            teacher_log_probs = teacher.log_probs[rows, teacher_index]  # (B, k, head)
        valid = labels != -100
        log_probs = torch.log_softmax(outputs.logits.float(), dim=-1)  # (..., k, head_size)
        kl = F.kl_div(log_probs, teacher_log_probs, log_target=True, reduction="none").sum(-1)
        loss = loss + settings.soft_label_weight * (kl * valid).sum() / valid.sum().clamp(min=1)
    return loss, int((labels != -100).sum())
