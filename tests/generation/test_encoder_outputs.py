"""A precomputed encoder output (`encoder_outputs=`) is taken as greedy decoding takes it, and a drafter that needs
the source ids says so when only the encoder output (or `inputs_embeds`) was given."""

from __future__ import annotations

import pytest
import torch
from conftest import build_verifier, make_source_batch

from specdec_hf import SpecDrafterModel, enable_speculative_decoding

GREEDY = dict(do_sample=False, max_new_tokens=12)


@pytest.fixture(scope="module")
def pair():
    verifier = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1)
    return enable_speculative_decoding(verifier), drafter


def test_encoder_outputs_as_a_plain_tuple_match_greedy(pair):
    verifier, drafter = pair
    inputs = make_source_batch(2)
    reference = verifier.generate(**inputs, **GREEDY)
    encoder_outputs = tuple(verifier.get_encoder()(**inputs).values())
    output = verifier.generate(**inputs, encoder_outputs=encoder_outputs, drafter=drafter, **GREEDY)
    assert torch.equal(output, reference)


def test_an_own_encoder_drafter_names_the_input_that_replaced_the_source_ids(pair):
    verifier, drafter = pair
    inputs = make_source_batch(1)
    encoder_outputs = verifier.get_encoder()(**inputs)
    with pytest.raises(ValueError, match=r"given `encoder_outputs` without `input_ids`: pass the source `input_ids`"):
        verifier.generate(
            encoder_outputs=encoder_outputs, attention_mask=inputs["attention_mask"], drafter=drafter, **GREEDY
        )
    embeds = verifier.get_input_embeddings()(inputs["input_ids"])
    with pytest.raises(ValueError, match=r"given `inputs_embeds`: pass `input_ids` instead"):
        verifier.generate(inputs_embeds=embeds, attention_mask=inputs["attention_mask"], drafter=drafter, **GREEDY)


def test_a_forced_decoder_prefix_matches_greedy(pair):
    """The own-encoder drafter's first proposal continues a prefix of three tokens (`decoder_input_ids`)."""
    verifier, drafter = pair
    inputs = {**make_source_batch(1), "decoder_input_ids": torch.tensor([[2, 7, 9]])}
    reference = verifier.generate(**inputs, **GREEDY)
    assert torch.equal(verifier.generate(**inputs, drafter=drafter, **GREEDY), reference)
