"""The logits processors applied to every position an iteration verifies.

Position i of a row is scored after that row's committed tokens and its first i drafts. Plain decoding applies the
processors in turn to one prefix; a position's scores depend on its own prefix only, so applying each processor to
every position before the next processor gives each position exactly what the processors in turn give it, for the
processors `generate()` builds: stateless, each row's scores from that row alone (a processor that keeps state
between calls or draws random numbers sees its calls in another order; such processors were never exact with
drafts verified several at a time). Each
processor then runs once per iteration where its effect can be computed for all positions at once, with the same
values transformers' own `__call__` writes:

- the length-gated ones (`min_length`, `min_new_tokens`, `forced_bos_token_id`, `forced_eos_token_id`), from each
  position's prefix length;
- n-gram blocking (`no_repeat_ngram_size`), matched against every position's last n - 1 tokens in one comparison,
  on the device, as transformers matches one prefix;
- those that read nothing of the prefix ([`is_position_independent`]), on all positions' scores in one call.

Any other processor (a repetition penalty, a multi-token ban, a user's own) runs position by position, on rows
grouped by prefix length (a processor reads the length of the `input_ids` it is given). Processors are matched by
exact type: a subclass may compute something else.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
)

from .processor_gating import apply_to_every_position, is_position_independent

__all__ = ["process_every_position"]


def process_every_position(
    logits_processor: LogitsProcessorList,
    committed: torch.LongTensor,
    lengths: torch.LongTensor,
    host_lengths: list[int],
    drafts: torch.LongTensor,
    logits: torch.FloatTensor,
) -> torch.FloatTensor:
    """The processed scores of every verified position.

    Args:
        logits_processor (`LogitsProcessorList`): The processors acting on this iteration, in order, each taking
            `(input_ids, scores)` only.
        committed (`torch.LongTensor` of shape `(rows, width)`): Each row's committed tokens, with room after the
            longest for k more.
        lengths (`torch.LongTensor` of shape `(rows,)`): Committed length of each row.
        host_lengths (`list[int]`): The same lengths, as the host knows them.
        drafts (`torch.LongTensor` of shape `(rows, k)`): The drafts (position i is scored after the first i).
        logits (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The verifier's raw scores; never written.

    Returns:
        `torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`: `logits` itself when no processor acts.
    """
    if all(is_position_independent(processor) for processor in logits_processor):  # none reads a prefix: none built
        return apply_to_every_position(logits_processor, logits)
    positions = logits.shape[1]
    if positions == 1:  # a plain step: the processors in turn, as greedy decoding calls them (fewer operations)
        groups = _length_groups(lengths, host_lengths)
        # a copy: processors may write into the scores they are given
        return _process_by_length(logits_processor, committed, groups, 0, logits[:, 0].clone()).unsqueeze(1)
    # the columns any position reads: up to the longest row's drafts
    prefixes = committed[:, : max(host_lengths) + drafts.shape[1]].clone()
    prefixes.scatter_(1, lengths.unsqueeze(1) + torch.arange(drafts.shape[1], device=drafts.device), drafts)
    # position-major, so that a position's scores are one contiguous block; a copy, as above
    scores = logits.transpose(0, 1).clone(memory_format=torch.contiguous_format)
    # (positions, rows): the length of the prefix each position is scored after
    prefix_lengths = lengths.unsqueeze(0) + torch.arange(positions, device=lengths.device).unsqueeze(1)
    groups = None
    for processor in logits_processor:
        at_once = _AT_ONCE.get(type(processor))
        if at_once is not None:
            scores = at_once(processor, prefixes, prefix_lengths, scores)
        elif is_position_independent(processor):
            scores = apply_to_every_position([processor], scores)
        else:
            if groups is None:
                groups = _length_groups(lengths, host_lengths)
            for position in range(positions):
                scores[position] = _process_by_length(processor, prefixes, groups, position, scores[position])
    return scores.transpose(0, 1)


def _length_groups(lengths: torch.LongTensor, host_lengths: list[int]) -> list[tuple[int, torch.LongTensor | None]]:
    """The rows grouped by committed length, `(length, row indices)` in increasing length (`None`: every row, when
    all have one length). The indices come from a stable sort on the device, cut where the host's lengths say."""
    distinct = sorted(set(host_lengths))
    if len(distinct) == 1:
        return [(distinct[0], None)]
    order = torch.argsort(lengths, stable=True)
    groups, start = [], 0
    for length in distinct:
        end = start + host_lengths.count(length)
        groups.append((length, order[start:end]))
        start = end
    return groups


def _process_by_length(
    processor: Callable,
    prefixes: torch.LongTensor,
    groups: list[tuple[int, torch.LongTensor | None]],
    position: int,
    scores: torch.FloatTensor,
) -> torch.FloatTensor:
    """One position's scores `(rows, vocab_size)` through `processor`, one call per group of rows whose prefixes have
    equal length."""
    if groups[0][1] is None:
        return processor(prefixes[:, : groups[0][0] + position], scores)
    processed = torch.empty_like(scores)
    for length, rows in groups:
        processed[rows] = processor(prefixes[rows, : length + position], scores[rows])
    return processed


def _where_length(condition: torch.BoolTensor, replaced: torch.FloatTensor, scores: torch.FloatTensor):
    """`replaced` at the `(position, row)` pairs where `condition` holds, `scores` elsewhere."""
    return torch.where(condition.unsqueeze(-1), replaced, scores)


def _forced_token(token_ids, scores: torch.FloatTensor) -> torch.FloatTensor:
    """The scores a forcing processor writes: `-inf` everywhere but 0 at `token_ids`."""
    forced = torch.full_like(scores[0, 0], -math.inf)
    forced[token_ids] = 0
    return forced


def _forced_eos(processor, prefixes, prefix_lengths, scores):
    return _where_length(
        prefix_lengths == processor.max_length - 1, _forced_token(processor.eos_token_id, scores), scores
    )


def _forced_bos(processor, prefixes, prefix_lengths, scores):
    return _where_length(prefix_lengths == 1, _forced_token(processor.bos_token_id, scores), scores)


def _eos_banned(too_short: torch.BoolTensor, eos_token_id, scores: torch.FloatTensor) -> torch.FloatTensor:
    """What a minimum length writes: `-inf` at the EOS ids of the `(position, row)` pairs still too short."""
    vocab = torch.arange(scores.shape[-1], device=scores.device)
    is_eos = torch.isin(vocab, eos_token_id.to(scores.device))
    return scores.masked_fill(too_short.unsqueeze(-1) & is_eos, -math.inf)


def _min_length(processor, prefixes, prefix_lengths, scores):
    return _eos_banned(prefix_lengths < processor.min_length, processor.eos_token_id, scores)


def _min_new_tokens(processor, prefixes, prefix_lengths, scores):
    too_short = prefix_lengths - processor.prompt_length_to_skip < processor.min_new_tokens
    return _eos_banned(too_short, processor.eos_token_id, scores)


def _no_repeat_ngram(processor, prefixes, prefix_lengths, scores):
    """n-gram blocking at every position: the windows of n tokens lying wholly inside a position's prefix whose first
    n - 1 tokens equal that prefix's last n - 1 ban their last token (transformers' rule, which also lets a prefix
    shorter than n ban nothing)."""
    size = processor.ngram_size
    positions, rows, vocab_size = scores.shape
    if prefixes.shape[1] < size:
        return scores
    windows = prefixes.unfold(1, size, 1)  # (rows, starts, size)
    starts = torch.arange(windows.shape[1], device=prefixes.device)
    # (positions, rows, size - 1): each position's last n - 1 tokens (clamped where the prefix is shorter: unused)
    tail_index = (prefix_lengths - size + 1).unsqueeze(-1) + torch.arange(size - 1, device=prefixes.device)
    tails = prefixes.unsqueeze(0).expand(positions, -1, -1).gather(2, tail_index.clamp(min=0))
    # (positions, rows, starts)
    matches = (windows[:, :, :-1].unsqueeze(0) == tails.unsqueeze(2)).all(dim=-1)
    matches &= starts <= (prefix_lengths - size).unsqueeze(-1)
    # unmatched windows, and ids past the scores (an embedding larger than the head), go to a spare column
    banned = torch.where(matches, windows[:, :, -1].clamp(max=vocab_size).unsqueeze(0), vocab_size)
    mask = scores.new_zeros((positions, rows, vocab_size + 1), dtype=torch.bool).scatter_(2, banned, True)
    return scores.masked_fill(mask[..., :vocab_size], -math.inf)


# processors whose effect on every position is computed at once, by exact type
_AT_ONCE = {
    ForcedEOSTokenLogitsProcessor: _forced_eos,
    ForcedBOSTokenLogitsProcessor: _forced_bos,
    MinLengthLogitsProcessor: _min_length,
    MinNewTokensLengthLogitsProcessor: _min_new_tokens,
    NoRepeatNGramLogitsProcessor: _no_repeat_ngram,
}
