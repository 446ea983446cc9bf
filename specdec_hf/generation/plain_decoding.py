"""A call decoded without drafting: transformers' own greedy / sampling loop, with this method's output and
statistics, for the calls the draft length schedule finds drafting does not pay."""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import StoppingCriteriaList

from .outputs import SpeculativeGenerateOutput
from .stats import SpeculativeDecodingStats

__all__ = ["plain_decoding"]


class _FinishRecordingCriteria(StoppingCriteriaList):
    """The call's stopping criteria, unchanged, noting the length at which each row first stops: greedy keeps a
    stopped row in the batch and appends pad to it, which the output cannot tell from generated tokens when pad is
    also an EOS token."""

    def __init__(self, criteria: StoppingCriteriaList):
        super().__init__(criteria)
        self.finished_at: torch.LongTensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        is_done = super().__call__(input_ids, scores, **kwargs)
        if self.finished_at is None:
            self.finished_at = torch.full_like(is_done, -1, dtype=torch.long)
        first = is_done & (self.finished_at < 0)
        self.finished_at = torch.where(first, input_ids.shape[1], self.finished_at)
        return is_done


def plain_decoding(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    streamer,
    stream_prompt: bool,
    model_kwargs: dict[str, Any],
) -> torch.LongTensor | SpeculativeGenerateOutput:
    """Decode with transformers' own loop (`GenerationMixin._sample`, what `generate()` runs without a drafter) and
    what `generate()` prepared.

    Args:
        stream_prompt (`bool`): Put the prompt to `streamer` first (`_sample` never does; `generate()` has when the
            streamer came as its own `streamer=`).

    Returns:
        `_sample`'s sequences, or a `SpeculativeGenerateOutput` whose statistics count one verifier pass per step,
        each row's generated tokens up to the step a criterion stopped it (without an EOS token greedy writes real
        tokens after that step; they are not counted, as the speculative loop does not count them) and no drafts.
    """
    if streamer is not None and stream_prompt:
        streamer.put(input_ids.cpu())
    # the finish lengths feed the statistics only: without them, the criteria as they are (no work per step)
    recording = _FinishRecordingCriteria(stopping_criteria) if generation_config.return_dict_in_generate else None
    output = type(model)._sample(
        model,
        input_ids,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria if recording is None else recording,
        generation_config=generation_config,
        synced_gpus=False,
        streamer=streamer,
        **model_kwargs,
    )
    if not generation_config.return_dict_in_generate:
        return output
    sequences = output.sequences
    stats = SpeculativeDecodingStats.for_batch(sequences.shape[0], 0)
    ends = recording.finished_at
    # defensive: `_sample` takes a step at least and ends only when every row stopped (the length limit is a
    # criterion too), so every row has an end
    if ends is None:
        ends = torch.full((sequences.shape[0],), sequences.shape[1])
    ends = torch.where(ends < 0, sequences.shape[1], ends)
    for row, end in enumerate(ends.tolist()):
        stats.iterations[row] = stats.generated_tokens[row] = end - input_ids.shape[1]
    stats.verifier_calls = sequences.shape[1] - input_ids.shape[1]
    return SpeculativeGenerateOutput(**{**output, "speculative_stats": stats})
