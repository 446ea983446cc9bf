"""Aligned rows: the batch advanced as greedy decoding advances it, for code that reads a row's index in the batch.

By default the loop lets rows advance by what each accepts, drops rows as they finish, and calls logits processors
and stopping criteria on groups of rows of one prefix length. A processor or criterion that is a function of each
row's own tokens cannot tell; one that reads the row's *index* (a user's processor that bans a different token in
each row, `prefix_allowed_tokens_fn(batch_id, ...)`, the encoder n-gram processors, a criterion with a limit per
row) sees other rows under that index. And `output_scores` after a row's EOS has no scores to return, where greedy
returns those of the padding it appends.

With aligned rows every row stays in the batch until all are finished, a finished row's drafts and tokens are pad
(what greedy appends), and each iteration every row appends as many tokens as the row that accepts the fewest:
all rows keep one length, so processors and criteria are called on the whole batch in batch order, as in greedy
decoding. Tokens per iteration fall to the batch's slowest row; outputs stay exact.
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    EncoderNoRepeatNGramLogitsProcessor,
    EncoderRepetitionPenaltyLogitsProcessor,
    LogitsProcessorList,
    PrefixConstrainedLogitsProcessor,
)
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

__all__ = [
    "criteria_read_scores",
    "criteria_scores",
    "needs_aligned_rows",
    "pads_finished_rows",
    "reads_row_index",
    "stop_aligned",
]

# transformers' processors that read the batch index (the encoder input's row, the callback's `batch_id`)
_ROW_INDEXED_PROCESSORS = (
    PrefixConstrainedLogitsProcessor,
    EncoderRepetitionPenaltyLogitsProcessor,
    EncoderNoRepeatNGramLogitsProcessor,
)
# transformers' criteria that judge each row by its own tokens (or the clock)
_ROW_WISE_CRITERIA = (MaxLengthCriteria, EosTokenCriteria, MaxTimeCriteria, StopStringCriteria)


def reads_row_index(processor_or_criterion) -> bool:
    """Whether a logits processor or stopping criterion may read a row's index in the batch: transformers' own are
    known either way; any other (a user's) is assumed to."""
    if isinstance(processor_or_criterion, _ROW_INDEXED_PROCESSORS):
        return True
    if isinstance(processor_or_criterion, _ROW_WISE_CRITERIA):
        # a subclass that computes its own stop may read the row index
        own_call = type(processor_or_criterion).__call__
        return not any(own_call is known.__call__ for known in _ROW_WISE_CRITERIA)
    return not type(processor_or_criterion).__module__.startswith("transformers.")


def needs_aligned_rows(
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    batch_size: int,
    output_scores: bool,
    pad_finished_rows: bool = True,
) -> bool:
    """Whether the loop must keep the rows aligned: a batch of several rows with a processor or criterion that may
    read the row index, with `output_scores` / `output_logits` (greedy scores a row's padding after its EOS), or
    where greedy keeps decoding a stopped row (`pad_finished_rows` false: no EOS criterion) and a criterion other than
    the length limit may stop rows at different steps."""
    if batch_size == 1:
        return False
    if not pad_finished_rows and any(type(criterion) is not MaxLengthCriteria for criterion in stopping_criteria):
        return True
    return output_scores or any(reads_row_index(item) for item in [*logits_processor, *stopping_criteria])


def pads_finished_rows(stopping_criteria: StoppingCriteriaList) -> bool:
    """Whether greedy decoding appends pad to a row after its criteria stopped it: only with a criterion that has an
    `eos_token_id` (transformers' rule); without, it keeps decoding the row, as if it had not stopped."""
    return any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria)


def criteria_read_scores(stopping_criteria: StoppingCriteriaList) -> bool:
    """Whether a stopping criterion may read `scores`: transformers' length, EOS, time and stop-string criteria never
    do (their subclasses with a call of their own may); any other is assumed to."""
    return any(
        reads_row_index(criterion) or not isinstance(criterion, _ROW_WISE_CRITERIA) for criterion in stopping_criteria
    )


def criteria_scores(
    history: tuple[torch.FloatTensor, ...] | None, scores: torch.FloatTensor, position: int
) -> tuple[torch.FloatTensor, ...] | None:
    """`scores` as greedy decoding hands it to stopping criteria: `None` without a history, else one
    `(rows, vocab_size)` tensor per generated token, the earlier steps (`history`, one per committed token, of the same
    rows as `scores`) then this iteration's up to `position` included."""
    if history is None:
        return None
    return history + tuple(scores[:, : position + 1].unbind(1))


def stop_aligned(
    new_tokens: torch.LongTensor,
    num_new: torch.LongTensor,
    committed: torch.LongTensor,
    length: int,
    scores: torch.FloatTensor,
    score_history: tuple[torch.FloatTensor, ...] | None,
    stopping_criteria: StoppingCriteriaList,
    done: torch.BoolTensor,
    max_length: int,
    pad_token_id: int,
    pad_finished_rows: bool = True,
) -> tuple[torch.LongTensor, torch.LongTensor, torch.BoolTensor]:
    """Stage 4 with aligned rows: one length for all rows, the criteria called on the whole batch.

    Every row appends as many tokens as the unfinished row that appends the fewest, and no more than up to the
    first position where a criterion stops an unfinished row (greedy's `unfinished &= ~criteria(ids, scores)`);
    rows finished before this iteration append pad (or, without an EOS criterion, go on as greedy's do).

    Args:
        new_tokens (`torch.LongTensor` of shape `(rows, k + 1)`), num_new (`torch.LongTensor` of shape `(rows,)`):
            The tokens each row would append and how many.
        committed (`torch.LongTensor` of shape `(rows, capacity)`): The committed tokens, all rows `length` long.
        scores (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The processed scores.
        score_history (`tuple[torch.FloatTensor]`, *optional*): The processed scores of the earlier generated
            tokens, one `(rows, vocab_size)` tensor per step, when criteria read them (greedy hands them so).
        done (`torch.BoolTensor` of shape `(rows,)`): Rows finished before this iteration.
        pad_finished_rows (`bool`, *optional*, defaults to `True`): Finished rows append pad (greedy with an EOS
            criterion); else they append their own tokens, as greedy keeps decoding them.

    Returns:
        `new_tokens` (pad for finished rows), `num_new` `(rows,)` (the same for every row) and `finished` `(rows,)`:
        the rows finished after this iteration, earlier ones included.
    """
    rows, width = new_tokens.shape
    if pad_finished_rows:
        new_tokens = torch.where(done.unsqueeze(1), pad_token_id, new_tokens)
        common = int(torch.where(done, width, num_new).min())
    else:  # finished rows go on decoding, as greedy's do without an EOS: their accepted tokens count as well
        common = int(num_new.min())
    extended = committed[:, : length + common].clone()
    extended[:, length:] = new_tokens[:, :common]
    finished = done.clone()
    for position in range(common):
        stops = stopping_criteria(
            extended[:, : length + position + 1], criteria_scores(score_history, scores, position)
        )
        stopping = stops & ~finished
        if bool(stopping.any()):
            finished |= stopping
            common = position + 1
            break
    if length + common >= max_length:
        finished = torch.ones_like(finished)
    return new_tokens, torch.full((rows,), common, dtype=num_new.dtype, device=num_new.device), finished
