"""Which logits processors can change the scores of an iteration's verified positions.

Several processors that `generate()` adds act only at some prefix lengths: `forced_eos_token_id` at the last position
(`max_length - 1`), `forced_bos_token_id` at length 1, `min_length` / `min_new_tokens` below a length. Outside those
lengths they return the scores unchanged. An iteration verifies prefix lengths `[shortest row, longest row + k]`; when
no processor can act on any of them, the loop may judge all positions at once on the raw scores (the result is the
same), instead of running the processors position by position. Unknown processors are always assumed to act.
"""

from __future__ import annotations

from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
)

__all__ = ["processors_acting_on"]


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


def processors_acting_on(logits_processor: LogitsProcessorList, shortest: int, longest: int) -> LogitsProcessorList:
    """The processors of `logits_processor` that may act on a prefix length in `[shortest, longest]`, in order.

    Args:
        logits_processor (`LogitsProcessorList`): The processors `generate()` prepared.
        shortest (`int`): Length of the shortest prefix scored in this iteration (the shortest row's committed length).
        longest (`int`): Length of the longest (the longest row's committed length plus k).

    Returns:
        `LogitsProcessorList`: empty when every processor leaves these positions' scores unchanged.
    """
    return LogitsProcessorList([p for p in logits_processor if _acts_on(p, shortest, longest)])
