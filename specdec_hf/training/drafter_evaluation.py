"""Periodic evaluation of a drafter during training: Tok. against its verifier and accuracy per draft position."""

from __future__ import annotations

import torch

from ..generation import speculative_generate
from .collator import DistilledBatchCollator
from .draft_examples import sample_draft_examples
from .loss import verifier_teacher_outputs

__all__ = ["evaluate_drafter"]


@torch.no_grad()
def evaluate_drafter(
    verifier,
    drafter,
    examples: list[dict],
    batch_size: int = 16,
    max_new_tokens: int = 128,
    seed: int = 0,
) -> dict[str, float | list[float]]:
    """Measure how well `drafter` serves `verifier` on held-out distilled examples.

    Args:
        verifier (`PreTrainedModel`): The encoder-decoder verifier (eval mode).
        drafter (`SpecDrafterModel`): The drafter being trained (in eval mode here; its mode is restored after).
        examples (`list[dict]`): Distilled examples with `input_ids` (source) and `target_ids` (verifier output).
        batch_size (`int`): Rows per `generate()` call.
        max_new_tokens (`int`): Generation length limit.
        seed (`int`): Seed of the random split points of the accuracy measurement (fixed: comparable over time).

    Returns:
        `dict` with `tokens_per_iteration` (β=1 speculative decoding, all rows together),
        `accuracy_by_position` (teacher-forced: fraction of draft position i predicted right after a random split)
        and `accuracy` (over all positions).
    """
    was_training = drafter.training
    drafter.eval()
    try:
        device = next(verifier.parameters()).device
        pad = verifier.config.pad_token_id
        collate = DistilledBatchCollator(pad_token_id=pad)
        generator = torch.Generator().manual_seed(seed)
        generated = iterations = 0
        correct = torch.zeros(drafter.config.max_draft_tokens)
        counted = torch.zeros(drafter.config.max_draft_tokens)
        for start in range(0, len(examples), batch_size):
            batch = {key: value.to(device) for key, value in collate(examples[start : start + batch_size]).items()}
            output = verifier.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                do_sample=False,
                num_beams=1,
                max_new_tokens=max_new_tokens,
                custom_generate=speculative_generate,
                drafter=drafter,
                num_draft_tokens=drafter.config.max_draft_tokens,  # every trained slot, whatever k generate() would default to
                return_dict_in_generate=True,
            )
            generated += sum(output.speculative_stats.generated_tokens)
            iterations += sum(output.speculative_stats.iterations)

            blocks = sample_draft_examples(
                batch["target_ids"].cpu(),
                batch["target_lengths"].cpu(),
                drafter.config.max_draft_tokens,
                pad,
                generator,
            )
            teacher = verifier_teacher_outputs(verifier, drafter, batch, soft_labels=False)
            prefix_length = blocks.decoder_input_ids.shape[1]
            logits = drafter(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=blocks.decoder_input_ids.to(device),
                decoder_attention_mask=blocks.decoder_attention_mask.to(device),
                encoder_hidden_states=teacher.encoder_states,
                verifier_states=None if teacher.decoder_states is None else teacher.decoder_states[:, :prefix_length],
            ).logits
            valid = blocks.labels != -100
            predictions = drafter.from_draft_vocab(logits.argmax(-1)).cpu()
            correct += ((predictions == blocks.labels) & valid).sum(0).float()
            counted += valid.sum(0).float()
    finally:
        drafter.train(was_training)
    by_position = (correct / counted.clamp(min=1)).tolist()
    return {
        "tokens_per_iteration": generated / max(iterations, 1),
        "accuracy_by_position": by_position,
        "accuracy": float(correct.sum() / counted.sum().clamp(min=1)),
    }
