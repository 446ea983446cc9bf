"""processors_acting_on: length-gated processors are dropped exactly where they leave the scores unchanged."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from specdec_hf.generation.processor_gating import processors_acting_on

EOS = 2
PROCESSORS = [
    ForcedEOSTokenLogitsProcessor(max_length=12, eos_token_id=EOS),
    ForcedBOSTokenLogitsProcessor(bos_token_id=0),
    MinLengthLogitsProcessor(min_length=5, eos_token_id=EOS),
    MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=1, min_new_tokens=6, eos_token_id=EOS),
]


@pytest.mark.parametrize("processor", PROCESSORS, ids=lambda p: type(p).__name__)
def test_dropped_exactly_where_the_processor_leaves_scores_unchanged(processor):
    scores = torch.randn(1, 10, generator=torch.Generator().manual_seed(0))
    changes = [
        not torch.equal(processor(torch.zeros(1, length, dtype=torch.long), scores.clone()), scores)
        for length in range(1, 16)
    ]
    for shortest in range(1, 16):
        for longest in range(shortest, 16):
            acting = processors_acting_on(LogitsProcessorList([processor]), shortest, longest)
            assert (len(acting) == 1) == any(changes[shortest - 1 : longest]), (shortest, longest)


def test_unknown_processors_always_act_and_order_is_kept():
    penalty = RepetitionPenaltyLogitsProcessor(1.3)
    forced_eos = ForcedEOSTokenLogitsProcessor(max_length=12, eos_token_id=EOS)
    acting = processors_acting_on(LogitsProcessorList([penalty, forced_eos]), 3, 11)
    assert list(acting) == [penalty, forced_eos]
    assert list(processors_acting_on(LogitsProcessorList([penalty, forced_eos]), 3, 10)) == [penalty]
