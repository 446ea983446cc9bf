"""Inputs and outputs of the evaluation passes: tokenised sources in padded batches, and generated ids trimmed.

Batches are built once per batch size (tokenisation and padding stay outside the timed region) and keep the
dataset row of every source, so that outputs can be put back in the data order whatever the batching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..data.padding import pad_token_ids

__all__ = [
    "Batch",
    "encode_sources",
    "eos_token_ids",
    "make_batches",
    "restore_order",
    "single_row_groups",
]


@dataclass
class Batch:
    """One `generate()` call's inputs.

    Args:
        rows (`list[int]`): The dataset rows of the batch, in batch order.
        input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`): Right-padded source ids.
        attention_mask (`torch.LongTensor` of shape `(batch_size, source_length)`): 1 for tokens, 0 for padding.
    """

    rows: list[int]
    input_ids: torch.LongTensor
    attention_mask: torch.LongTensor

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of `generate()`."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def encode_sources(
    tokenizer, sources: Sequence[str], source_prefix: str | None, max_source_length: int
) -> list[list[int]]:
    """Token ids of each `source_prefix + source`, truncated to `max_source_length` (special tokens included)."""
    prefix = source_prefix or ""
    encoded = tokenizer([prefix + source for source in sources], truncation=True, max_length=max_source_length)
    return [list(ids) for ids in encoded["input_ids"]]


def eos_token_ids(model) -> list[int]:
    """The ids that end a generated row (where outputs are cut): the generation config's EOS, else the config's."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def make_batches(
    encoded: Sequence[Sequence[int]],
    batch_size: int,
    pad_token_id: int,
    device: torch.device | str = "cpu",
    sort_by_length: bool = True,
) -> list[Batch]:
    """Right-padded batches of `batch_size` rows (the last may be smaller).

    With `sort_by_length` rows are batched longest first, so batches hold sources of similar length (less padding)
    and the first batch is the largest (a memory problem shows up at once).
    """
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
    order = list(range(len(encoded)))
    if sort_by_length:
        order.sort(key=lambda row: -len(encoded[row]))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        input_ids, attention_mask = pad_token_ids([encoded[row] for row in rows], pad_token_id)
        batches.append(Batch(rows=rows, input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)))
    return batches


def single_row_groups(groups: Sequence[Batch], single_rows: Sequence[Batch]) -> list[list[Batch]]:
    """For each batch of `groups`, the batch-size-1 batches of its rows, in its order.

    A batch-size-1 strategy decodes the rows of a group one at a time, so that it is timed on the same rows as the
    batched strategies it is interleaved with.

    Args:
        groups (`Sequence[Batch]`): The batches of the main batch size.
        single_rows (`Sequence[Batch]`): One batch per row (`make_batches(..., batch_size=1)`).
    """
    by_row = {batch.rows[0]: batch for batch in single_rows}
    return [[by_row[row] for row in group.rows] for group in groups]


def restore_order(batches: Sequence[Batch], per_batch: Sequence[Sequence]) -> list:
    """Put per-row results back in dataset order: `per_batch[b][i]` belongs to row `batches[b].rows[i]`."""
    size = sum(len(batch.rows) for batch in batches)
    ordered: list = [None] * size
    for batch, values in zip(batches, per_batch, strict=True):
        for row, value in zip(batch.rows, values, strict=True):
            ordered[row] = value
    return ordered
