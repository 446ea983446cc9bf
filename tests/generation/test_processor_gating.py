"""processors_acting_on: length-gated processors are dropped exactly where they leave the scores unchanged."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from specdec_hf import speculative_generate
from specdec_hf.generation import position_processing
from specdec_hf.generation.processor_gating import (
    apply_to_every_position,
    is_position_independent,
    processors_acting_on,
)
from specdec_hf.testing import OracleDrafter

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


def test_position_independent_processors_are_recognised():
    assert is_position_independent(NoBadWordsLogitsProcessor([[7]], eos_token_id=EOS))
    assert is_position_independent(NoBadWordsLogitsProcessor([[7], [8]], eos_token_id=EOS))
    assert is_position_independent(SuppressTokensLogitsProcessor([3, 4]))
    assert is_position_independent(SequenceBiasLogitsProcessor([[[5], 2.0], [[6], -1.0]]))
    # a multi-token ban or bias reads the prefix; so do length- and repetition-based processors
    assert not is_position_independent(NoBadWordsLogitsProcessor([[7], [4, 5]], eos_token_id=EOS))
    assert not is_position_independent(SequenceBiasLogitsProcessor([[[5, 6], 2.0]]))
    assert not is_position_independent(RepetitionPenaltyLogitsProcessor(1.3))
    assert not any(is_position_independent(processor) for processor in PROCESSORS)


def test_applying_to_every_position_at_once_equals_position_by_position():
    processors = LogitsProcessorList(
        [NoBadWordsLogitsProcessor([[7], [9]], eos_token_id=EOS), SuppressTokensLogitsProcessor([3])]
    )
    logits = torch.randn(3, 5, 10, generator=torch.Generator().manual_seed(0))
    batched = apply_to_every_position(processors, logits.clone())
    prefixes = torch.randint(0, 10, (3, 8), generator=torch.Generator().manual_seed(1))
    for position in range(5):
        expected = processors(prefixes[:, : 2 + position], logits[:, position].clone())
        assert torch.equal(batched[:, position], expected)
    assert torch.isinf(batched[..., [3, 7, 9]]).all() and torch.isfinite(batched[..., [0, 1, 2, 4]]).all()


@pytest.mark.parametrize("family", ["marian", "bart"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_verifier_banning_pad_keeps_the_vectorised_path_and_stays_exact(family, batch_size, monkeypatch):
    """OPUS-MT checkpoints ban <pad> (`bad_words_ids=[[pad]]`): every iteration still judges all positions at once."""
    model = build_verifier(family)
    pad = model.config.pad_token_id
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.suppress_tokens = [7]
    inputs = make_source_batch(batch_size, pad_token_id=pad)
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=16)
    per_position_calls = _count_per_position_calls(monkeypatch)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 4, "half")
    output = model.generate(
        **inputs, do_sample=False, max_new_tokens=16, custom_generate=speculative_generate, drafter=drafter
    )
    assert torch.equal(output, reference)
    assert per_position_calls == []
    assert not (reference[:, 1:] == 7).any()  # the ban acted on greedy's output too


def test_a_multi_token_ban_takes_the_per_position_path_and_stays_exact(monkeypatch):
    model = build_verifier("bart")
    inputs = make_source_batch(4, pad_token_id=model.config.pad_token_id)
    unbanned = model.generate(**inputs, do_sample=False, max_new_tokens=16)
    bigram = unbanned[0, 2:4].tolist()  # a pair greedy produces: the ban changes the output
    model.generation_config.bad_words_ids = [bigram]
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=16)
    assert not torch.equal(reference, unbanned)
    per_position_calls = _count_per_position_calls(monkeypatch)
    drafter = OracleDrafter(unbanned, VOCAB_SIZE, 4, "right")  # drafts the banned pair: it must be refused
    output = model.generate(
        **inputs, do_sample=False, max_new_tokens=16, custom_generate=speculative_generate, drafter=drafter
    )
    assert torch.equal(output, reference) and len(per_position_calls) > 0


def _count_per_position_calls(monkeypatch) -> list:
    calls = []
    original = position_processing._process_by_length

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(position_processing, "_process_by_length", counting)
    return calls
