"""process_every_position: every verified position's scores equal transformers' processors applied in turn to that
position's own prefix, for the processors computed at once and for those run position by position."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from specdec_hf.generation.position_processing import process_every_position
from specdec_hf.generation.processor_gating import CalledInTurn, check_processor_arguments

VOCAB = 12
EOS = 2

PROCESSOR_SETS = {
    "ngram 2": [NoRepeatNGramLogitsProcessor(2)],
    "ngram 3": [NoRepeatNGramLogitsProcessor(3)],
    "min length": [MinLengthLogitsProcessor(min_length=8, eos_token_id=[EOS, 3])],
    "min new tokens": [MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=1, min_new_tokens=7, eos_token_id=EOS)],
    "forced bos": [ForcedBOSTokenLogitsProcessor(bos_token_id=5)],
    "forced eos": [ForcedEOSTokenLogitsProcessor(max_length=9, eos_token_id=EOS)],
    "suppress": [SuppressTokensLogitsProcessor([3, 4])],
    "repetition penalty": [RepetitionPenaltyLogitsProcessor(1.3)],
    "multi-token ban": [NoBadWordsLogitsProcessor([[5, 6], [7]], eos_token_id=EOS)],
    # bart-large-cnn's kind, in generate()'s order; n-gram blocking before a forced EOS that it may have banned
    "summarization": [
        NoRepeatNGramLogitsProcessor(3),
        MinLengthLogitsProcessor(min_length=7, eos_token_id=EOS),
        ForcedBOSTokenLogitsProcessor(bos_token_id=0),
        ForcedEOSTokenLogitsProcessor(max_length=10, eos_token_id=EOS),
    ],
    "everything": [
        RepetitionPenaltyLogitsProcessor(1.3),
        NoRepeatNGramLogitsProcessor(2),
        SuppressTokensLogitsProcessor([4]),
        MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=1, min_new_tokens=6, eos_token_id=EOS),
        ForcedEOSTokenLogitsProcessor(max_length=9, eos_token_id=EOS),
    ],
}


def _iteration(lengths: list[int], k: int, seed: int):
    """Committed rows of a small vocabulary (n-grams repeat), right-padded with room for k drafts, the drafts, and
    raw scores of the k + 1 positions."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths) + k + 2
    committed = torch.randint(0, 6, (len(lengths), width), generator=generator)
    for row, length in enumerate(lengths):
        committed[row, length:] = 1  # pad
    drafts = torch.randint(0, 6, (len(lengths), k), generator=generator)
    logits = torch.randn(len(lengths), k + 1, VOCAB, generator=generator)
    return committed, torch.tensor(lengths), drafts, logits


def _position_by_position(processors, committed, lengths, drafts, logits) -> torch.FloatTensor:
    """transformers' processors in turn on each position's own prefix, one row at a time."""
    expected = torch.empty_like(logits)
    for row, length in enumerate(lengths.tolist()):
        for position in range(logits.shape[1]):
            prefix = torch.cat([committed[row, :length], drafts[row, :position]]).unsqueeze(0)
            expected[row, position] = LogitsProcessorList(processors)(prefix, logits[row, position].clone()[None])[0]
    return expected


@pytest.mark.parametrize("name", list(PROCESSOR_SETS))
@pytest.mark.parametrize(
    ("lengths", "k"), [([6], 3), ([3, 7, 7, 8], 4), ([1, 7, 7, 8], 4), ([2, 5], 0), ([1], 2), ([8, 8], 2)]
)
def test_every_position_equals_the_processors_in_turn_on_its_own_prefix(name, lengths, k):
    processors = CalledInTurn(PROCESSOR_SETS[name])
    for seed in range(4):
        committed, lengths_tensor, drafts, logits = _iteration(lengths, k, seed)
        raw = logits.clone()
        processed = process_every_position(processors, committed, lengths_tensor, lengths, drafts, logits)
        assert torch.equal(processed, _position_by_position(processors, committed, lengths_tensor, drafts, logits))
        assert torch.equal(logits, raw)  # the verifier's logits are never written


@pytest.mark.parametrize("name", list(PROCESSOR_SETS))
def test_the_ragged_case_exercises_every_processor(name):
    """The comparison above is not vacuous: on ragged rows with k = 4 every set changes some position's scores."""
    committed, lengths, drafts, logits = _iteration([1, 7, 7, 8], 4, 0)
    processed = process_every_position(
        CalledInTurn(PROCESSOR_SETS[name]), committed, lengths, [1, 7, 7, 8], drafts, logits
    )
    assert not torch.equal(processed, logits)


def test_no_acting_processor_returns_the_logits_themselves():
    committed, lengths, drafts, logits = _iteration([4, 6], 2, 0)
    assert process_every_position(CalledInTurn(), committed, lengths, [4, 6], drafts, logits) is logits


def test_a_processor_taking_more_than_ids_and_scores_is_refused_before_decoding():
    class NeedsCurrentLength:
        def __call__(self, input_ids, scores, cur_len):
            return scores

    check_processor_arguments(LogitsProcessorList(PROCESSOR_SETS["everything"]))  # transformers' own pass
    with pytest.raises(ValueError, match="NeedsCurrentLength takes .*cur_len.* drop it"):
        check_processor_arguments(LogitsProcessorList([NoRepeatNGramLogitsProcessor(2), NeedsCurrentLength()]))
