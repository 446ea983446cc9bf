"""Which logits processors can change the scores of an iteration's verified positions.

Several processors that `generate()` adds act only at some prefix lengths: `forced_eos_token_id` at the last position
(`max_length - 1`), `forced_bos_token_id` at length 1, `min_length` / `min_new_tokens` below a length. Outside those
lengths they return the scores unchanged. An iteration verifies prefix lengths `[shortest row, longest row + k]`; the
processors that cannot act on any of them are left out of its processing (the result is the same). Unknown
processors are always assumed to act.

Other processors act at every length but read nothing of the prefix: a ban of single tokens (`bad_words_ids=[[pad]]`,
which every OPUS-MT checkpoint's generation config carries), `suppress_tokens`, a `sequence_bias` of single tokens.
They give the same scores at every position, so they are applied to all verified positions at once, with no prefix
built. Which processors read the prefix, and how they are applied then: `position_processing`.

The loop calls the processors with `(input_ids, scores)` only, as `generate()` does: [`check_processor_arguments`]
checks that once per call, and [`CalledInTurn`] calls them without reading their signatures again.
"""

from __future__ import annotations

import inspect

import torch
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

__all__ = [
    "CalledInTurn",
    "apply_to_every_position",
    "check_processor_arguments",
    "is_position_independent",
    "processors_acting_on",
]


def _acts_on(processor, shortest: int, longest: int) -> bool:
    """Whether `processor` may change the scores of a prefix whose length lies in `[shortest, longest]`."""
    if isinstance(processor, ForcedEOSTokenLogitsProcessor):
        return shortest <= processor.max_length - 1 <= longest
    if isinstance(processor, ForcedBOSTokenLogitsProcessor):
        return shortest <= 1 <= longest
    if isinstance(processor, MinLengthLogitsProcessor):
        return shortest < processor.min_length
    if isinstance(processor, MinNewTokensLengthLogitsProcessor):
        return shortest - processor.prompt_length_to_skip < processor.min_new_tokens
    return True


class CalledInTurn(LogitsProcessorList):
    """Processors applied in turn to `(input_ids, scores)`, as `LogitsProcessorList.__call__` applies processors
    that take nothing more, without reading every processor's signature again at every call (the loop calls the
    processors once per verified position; [`check_processor_arguments`] checks the signatures once per call of
    `generate()`)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


def check_processor_arguments(logits_processor: LogitsProcessorList) -> None:
    """Raise the error `LogitsProcessorList.__call__` raises at its first call, before decoding starts, for a
    processor that takes arguments beyond `(input_ids, scores)`: `generate()` passes processors nothing more, and
    neither does the loop."""
    for processor in logits_processor:
        parameters = list(inspect.signature(processor.__call__).parameters)
        if len(parameters) > 2:
            raise ValueError(
                f"The logits processor {type(processor).__name__} takes {parameters}, more than (input_ids, scores): "
                "`generate()` passes processors nothing else, so it cannot run here; drop it from `logits_processor`."
            )


def processors_acting_on(logits_processor: LogitsProcessorList, shortest: int, longest: int) -> CalledInTurn:
    """The processors of `logits_processor` that may act on a prefix length in `[shortest, longest]`, in order.

    Args:
        logits_processor (`LogitsProcessorList`): The processors `generate()` prepared, checked by
            [`check_processor_arguments`].
        shortest (`int`): Length of the shortest prefix scored in this iteration (the shortest row's committed length).
        longest (`int`): Length of the longest (the longest row's committed length plus k).

    Returns:
        [`CalledInTurn`]: empty when every processor leaves these positions' scores unchanged.
    """
    return CalledInTurn([p for p in logits_processor if _acts_on(p, shortest, longest)])


def is_position_independent(processor) -> bool:
    """
    Whether `processor` changes every position's scores alike, reading nothing of the prefix (ids or length).

    True for `SuppressTokensLogitsProcessor` and for a `SequenceBiasLogitsProcessor` (`NoBadWordsLogitsProcessor`
    included) whose biased sequences are all single tokens; a multi-token sequence is matched against the prefix.
    """
    if type(processor) is SuppressTokensLogitsProcessor:
        return True
    if (
        isinstance(processor, SequenceBiasLogitsProcessor)
        and type(processor).__call__ is SequenceBiasLogitsProcessor.__call__
    ):
        return all(len(sequence) == 1 for sequence in processor.sequence_bias)
    return False


def apply_to_every_position(processors: LogitsProcessorList, logits: torch.FloatTensor) -> torch.FloatTensor:
    """
    Runs position-independent processors (`is_position_independent`) on all positions' scores in one call each.

    Args:
        processors (`LogitsProcessorList`): Processors that all pass `is_position_independent`.
        logits (`torch.FloatTensor` of shape `(rows, positions, vocab)`): Raw scores.

    Returns:
        `torch.FloatTensor` of the same shape: the processed scores.
    """
    if len(processors) == 0:
        return logits
    rows, positions, vocab = logits.shape
    scores = logits.reshape(rows * positions, vocab)
    # the processors read no prefix: any ids of the right batch size will do
    placeholder_ids = torch.zeros((rows * positions, 1), dtype=torch.long, device=logits.device)
    for processor in processors:
        scores = processor(placeholder_ids, scores)
    return scores.reshape(rows, positions, vocab)
