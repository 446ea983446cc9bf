"""The stop stage's two ways of cutting rows: EOS and max length vectorised, or any stopping criteria per token."""

from __future__ import annotations

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList

from .aligned_rows import criteria_scores

__all__ = ["stop_at_eos", "stop_by_criteria"]


def stop_at_eos(
    new_tokens: torch.LongTensor,
    num_new: torch.LongTensor,
    lengths: torch.LongTensor,
    eos_token_ids: torch.LongTensor | None,
    max_length: int,
) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """EOS and max-length stopping, vectorised: cut each row after its first appended EOS.

    Args:
        new_tokens (`torch.LongTensor` of shape `(rows, k + 1)`), num_new (`torch.LongTensor` of shape `(rows,)`):
            The tokens each row would append and how many.
        lengths (`torch.LongTensor` of shape `(rows,)`): Committed lengths before them.
        eos_token_ids (`torch.LongTensor`, *optional*): The EOS ids; `None` stops at `max_length` only.
        max_length (`int`): A row of this many tokens is finished.

    Returns:
        `num_new` `(rows,)`, cut after an EOS, and `finished` `(rows,)`.
    """
    # greedy iterations on the CPU stop by the same rule on the host (`host_outcome`): change both
    if eos_token_ids is not None and new_tokens.shape[1] == 1:  # a plain step: one token, no cut to place
        hit = torch.isin(new_tokens[:, 0], eos_token_ids) & (num_new > 0)
    elif eos_token_ids is not None:
        offsets = torch.arange(new_tokens.shape[1], device=new_tokens.device).unsqueeze(0)
        is_eos = torch.isin(new_tokens, eos_token_ids) & (offsets < num_new.unsqueeze(1))
        hit = is_eos.any(dim=1)
        num_new = torch.where(hit, is_eos.float().argmax(dim=1) + 1, num_new)
    else:
        hit = torch.zeros_like(num_new, dtype=torch.bool)
    finished = hit | (lengths + num_new >= max_length)
    return num_new, finished


def stop_by_criteria(
    new_tokens: torch.LongTensor,
    num_new: torch.LongTensor,
    committed: torch.LongTensor,
    lengths: torch.LongTensor,
    scores: torch.FloatTensor,
    score_history: tuple[torch.FloatTensor, ...] | None,
    stopping_criteria: StoppingCriteriaList,
    pad: int,
) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """General stopping: evaluate the criteria after each appended token, on that row's exact sequence.

    Args:
        new_tokens (`torch.LongTensor` of shape `(rows, k + 1)`), num_new (`torch.LongTensor` of shape `(rows,)`):
            The tokens each row would append and how many.
        committed (`torch.LongTensor` of shape `(rows, length)`), lengths (`torch.LongTensor` of shape `(rows,)`):
            The rows' committed tokens (pad after) and lengths.
        scores (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The processed scores of the new tokens.
        score_history (`tuple[torch.FloatTensor]`, *optional*): The processed scores of earlier steps, when the
            criteria read them (a single row only).
        stopping_criteria (`StoppingCriteriaList`): The criteria.
        pad (`int`): Written after each row's new tokens.

    Returns:
        `num_new` `(rows,)`, cut after the token that stops a row, and `finished` `(rows,)`.
    """
    rows, width = new_tokens.shape
    device = new_tokens.device
    offsets = torch.arange(width, device=device).unsqueeze(0)
    extended = committed.clone()
    extended.scatter_(1, lengths.unsqueeze(1) + offsets, torch.where(offsets < num_new.unsqueeze(1), new_tokens, pad))
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    for position in range(int(num_new.max())):
        candidates = ((num_new > position) & ~finished).nonzero().squeeze(1)
        if candidates.numel() == 0:
            break
        stop = torch.zeros(candidates.numel(), dtype=torch.bool, device=device)
        candidate_lengths = lengths[candidates] + position + 1
        for length in candidate_lengths.unique().tolist():
            group = (candidate_lengths == length).nonzero().squeeze(1)
            rows_in_group = candidates[group]
            # a score history exists here only for a single row (see run_speculative_loop): the group is that row
            stop[group] = stopping_criteria(
                extended[rows_in_group, :length], criteria_scores(score_history, scores[rows_in_group], position)
            )
        stopped = candidates[stop]
        finished[stopped] = True
        num_new[stopped] = position + 1
    return num_new, finished
