"""Batching distilled examples: pad sources and verifier outputs; split points are drawn later, per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.padding import pad_token_ids

__all__ = ["DistilledBatchCollator"]


@dataclass
class DistilledBatchCollator:
    """Pad `input_ids` (source) and `target_ids` (verifier output from its decoder start token to EOS).

    Returns a dict with `input_ids` and `attention_mask` of shape `(batch_size, max_source_length)`,
    `target_ids` of shape `(batch_size, max_target_length)` and `target_lengths` of shape `(batch_size,)`.
    """

    pad_token_id: int

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad_token_ids([example["input_ids"] for example in examples], self.pad_token_id)
        target_ids, target_mask = pad_token_ids([example["target_ids"] for example in examples], self.pad_token_id)
        target_lengths = target_mask.sum(dim=1)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "target_ids": target_ids,
            "target_lengths": target_lengths,
        }
