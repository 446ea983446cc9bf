"""Token id sequences in batches: right-padding id lists into a batch (sources for the encoder, verifier outputs
for training), and cutting `generate()` outputs after their first EOS."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = ["lengths_up_to_eos", "pad_token_ids", "trim_at_eos"]


def pad_token_ids(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Stack id lists of different lengths, right-padded.

    Args:
        sequences (`Sequence[Sequence[int]]`): One list (or 1-D tensor) of token ids per row.
        pad_token_id (`int`): Written after each row's ids.

    Returns:
        `(input_ids, attention_mask)`, both `torch.LongTensor` of shape `(rows, longest)`; the mask is 1 on real
        tokens.
    """
    rows = [torch.as_tensor(ids, dtype=torch.long) for ids in sequences]
    input_ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_token_id)
    lengths = torch.tensor([len(row) for row in rows])
    attention_mask = (torch.arange(input_ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return input_ids, attention_mask


def lengths_up_to_eos(
    sequences: torch.LongTensor, eos_token_id: int | Iterable[int] | None, prompt_length: int = 1
) -> torch.LongTensor:
    """Per row of a `generate()` output, the number of ids up to and including the first EOS after the decoder
    prompt (all ids when there is none).

    The prompt (by default the decoder start token) is never taken for EOS: BART and mBART start decoding from EOS.

    Args:
        sequences (`torch.LongTensor` of shape `(batch_size, length)`): `generate()` output, prompt first.
        eos_token_id (`int` or `Iterable[int]`, *optional*): The EOS id(s).
        prompt_length (`int`): Length of the decoder prompt.

    Returns:
        `torch.LongTensor` of shape `(batch_size,)`.
    """
    eos_ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    is_eos = torch.isin(sequences, torch.tensor(eos_ids, dtype=sequences.dtype, device=sequences.device))
    is_eos[:, :prompt_length] = False
    return torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, sequences.shape[1])


def trim_at_eos(
    sequences: torch.LongTensor,
    eos_token_id: int | Iterable[int] | None,
    prompt_length: int = 1,
    keep_prompt: bool = True,
) -> list[list[int]]:
    """Cut each generated row after its first EOS (see [`lengths_up_to_eos`]).

    Args:
        sequences (`torch.LongTensor` of shape `(batch_size, length)`): `generate()` output, prompt first, rows that
            finished early padded after their EOS.
        eos_token_id (`int` or `Iterable[int]`, *optional*): The EOS id(s).
        prompt_length (`int`): Length of the decoder prompt (1: the decoder start token).
        keep_prompt (`bool`): Whether the returned ids start with the prompt (`False`: the generated ids only).

    Returns:
        `list[list[int]]`: per row, the ids up to and including the first EOS; up to the end when it has none (it
        reached the length limit, so it carries no padding).
    """
    lengths = lengths_up_to_eos(sequences, eos_token_id, prompt_length).tolist()
    start = 0 if keep_prompt else prompt_length
    return [row[start:length] for row, length in zip(sequences.tolist(), lengths, strict=True)]
