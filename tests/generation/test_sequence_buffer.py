"""The loop's sequence buffer follows what is generated, not the length limit: `max_new_tokens=10**11` with an early
EOS returns what greedy decoding returns (it tried to allocate batch × (max_length + k + 1) tokens), and rows that
outgrow the first allocation decode exactly as greedy."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import OracleDrafter, StateRecordingDrafter

from specdec_hf import SpecDrafterModel, enable_speculative_decoding, speculative_generate
from specdec_hf.generation import speculative_loop

GREEDY = dict(do_sample=False, num_beams=1)


def _speculative(model, inputs, drafter, **kwargs):
    return model.generate(**inputs, **GREEDY, **kwargs, custom_generate=speculative_generate, drafter=drafter)


def test_a_huge_length_limit_with_an_early_eos_matches_greedy():
    model = build_verifier("bart")
    inputs = make_source_batch(2)
    eos = int(model.generate(**inputs, **GREEDY, max_new_tokens=12)[0, 4])  # row 0 emits it early
    limit = dict(max_new_tokens=10**11, eos_token_id=eos)
    reference = model.generate(**inputs, **GREEDY, **limit)
    assert torch.equal(
        _speculative(model, inputs, OracleDrafter(reference, VOCAB_SIZE, 4, "half"), **limit), reference
    )


def test_the_sequences_are_contiguous_as_greedys_are():
    """The buffer keeps room for k + 1 tokens after the longest row: what is returned is a copy of the used columns,
    not a strided slice of it (`view` would refuse it)."""
    model = build_verifier("bart")
    inputs = make_source_batch(2)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=8)
    output = _speculative(model, inputs, OracleDrafter(reference, VOCAB_SIZE, 4, "half"), max_new_tokens=8)
    assert torch.equal(output, reference) and reference.is_contiguous() and output.is_contiguous()
    assert torch.equal(output.view(-1), reference.view(-1))


@pytest.mark.parametrize("drafter_class", [OracleDrafter, StateRecordingDrafter])
def test_rows_outgrowing_the_first_allocation_match_greedy(monkeypatch, drafter_class):
    """With room for 2 new tokens at first, the buffer (and the verifier states read with it) grows many times."""
    monkeypatch.setattr(speculative_loop, "_INITIAL_NEW_TOKENS", 2)
    model = build_verifier("t5")  # relative positions: no position limit bounds the rows
    inputs = make_source_batch(3, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=40)
    drafter = drafter_class(reference, VOCAB_SIZE, 4, "half")
    assert torch.equal(_speculative(model, inputs, drafter, max_new_tokens=40), reference)


def test_no_length_limit_gives_what_greedy_gives():
    """Without `max_new_tokens`, generate()'s default of 20 new tokens; with `max_length=None` stated as well,
    whatever plain greedy decoding does (transformers 5 fails adding None to the prompt length): the same."""
    verifier = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1)
    inputs = make_source_batch(1)
    reference = verifier.generate(**inputs, **GREEDY, max_new_tokens=None)
    enable_speculative_decoding(verifier)
    assert torch.equal(verifier.generate(**inputs, **GREEDY, max_new_tokens=None, drafter=drafter), reference)
    no_limit = dict(max_new_tokens=None, max_length=None)
    try:
        reference = verifier.generate(**inputs, **GREEDY, **no_limit)
    except TypeError as greedy_error:
        with pytest.raises(TypeError, match=re.escape(str(greedy_error))):
            verifier.generate(**inputs, **GREEDY, **no_limit, drafter=drafter)
    else:
        assert torch.equal(verifier.generate(**inputs, **GREEDY, **no_limit, drafter=drafter), reference)
