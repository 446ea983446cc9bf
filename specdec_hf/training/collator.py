"""Batching distilled examples: pad sources and verifier outputs; split points are drawn later, per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DistilledBatchCollator"]


@dataclass
class DistilledBatchCollator:
    """Pad `input_ids` (source) and `target_ids` (verifier output from its decoder start token to EOS).

    Returns a dict with `input_ids` and `attention_mask` of shape `(batch_size, max_source_length)`,
    `target_ids` of shape `(batch_size, max_target_length)` and `target_lengths` of shape `(batch_size,)`.
    """

    pad_token_id: int

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        sources = [torch.as_tensor(example["input_ids"], dtype=torch.long) for example in examples]
        targets = [torch.as_tensor(example["target_ids"], dtype=torch.long) for example in examples]
        input_ids = torch.nn.utils.rnn.pad_sequence(sources, batch_first=True, padding_value=self.pad_token_id)
        attention_mask = torch.nn.utils.rnn.pad_sequence(
            [torch.ones_like(source) for source in sources], batch_first=True, padding_value=0
        )
        target_ids = torch.nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=self.pad_token_id)
        target_lengths = torch.tensor([len(target) for target in targets], dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "target_ids": target_ids,
            "target_lengths": target_lengths,
        }
