"""The drafting contract (`specdec_hf.drafting`): what a custom drafter must provide, and what a drafter written
against the earlier contract (a `propose` without the verifier's states) is told to change."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch

from specdec_hf import Drafter, DraftProposal, speculative_generate
from specdec_hf.drafting import validate_drafter

GREEDY = dict(do_sample=False, num_beams=1, max_new_tokens=8)


class EarlierContractDrafter(Drafter):
    """A drafter as written against the contract before the verifier's states: a `propose` of four arguments."""

    def __init__(self, vocab_size: int, num_draft_tokens: int = 3):
        self.vocab_size = vocab_size
        self.num_draft_tokens = num_draft_tokens

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states):
        return None

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens):
        return DraftProposal(torch.full((prefix_ids.shape[0], num_draft_tokens), 5), None, state)

    def select_rows(self, state, rows):
        return state


class UpdatedDrafter(EarlierContractDrafter):
    """The same drafter with the change the error message asks for."""

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        return super().propose(state, prefix_ids, prefix_lengths, num_draft_tokens)


def test_a_drafter_written_against_the_earlier_contract_is_told_what_to_change():
    model = build_verifier("bart")
    with pytest.raises(ValueError) as error:
        model.generate(
            **make_source_batch(2),
            **GREEDY,
            custom_generate=speculative_generate,
            drafter=EarlierContractDrafter(VOCAB_SIZE),
        )
    message = str(error.value)
    assert "earlier version of the drafting contract" in message
    assert "give `propose` a fifth parameter, `verifier_states=None`" in message
    validate_drafter(UpdatedDrafter(VOCAB_SIZE), VOCAB_SIZE)  # nothing left to change


def test_the_drafter_changed_as_told_decodes_exactly():
    model = build_verifier("bart")
    inputs = make_source_batch(2)
    reference = model.generate(**inputs, **GREEDY)
    output = model.generate(
        **inputs, **GREEDY, custom_generate=speculative_generate, drafter=UpdatedDrafter(VOCAB_SIZE)
    )
    assert torch.equal(output, reference)


def test_a_propose_taking_any_positional_arguments_is_accepted():
    class Forwarding(UpdatedDrafter):
        def propose(self, *args):
            return super().propose(*args)

    validate_drafter(Forwarding(VOCAB_SIZE), VOCAB_SIZE)


@pytest.mark.parametrize("positions", [0, 1, -3, "many", 2.5])
def test_a_drafter_with_an_impossible_position_limit_is_refused(positions):
    drafter = UpdatedDrafter(VOCAB_SIZE)
    drafter.max_positions = positions
    with pytest.raises(ValueError, match="has `max_positions`.*None \\(no limit\\) or an integer of at least 2"):
        validate_drafter(drafter, VOCAB_SIZE)


def test_a_drafter_position_limit_given_as_a_tensor_drafts_within_it():
    model = build_verifier("bart")
    inputs = make_source_batch(2)
    reference = model.generate(**inputs, **GREEDY)
    drafter = UpdatedDrafter(VOCAB_SIZE)
    drafter.max_positions = torch.tensor(6)
    output = model.generate(**inputs, **GREEDY, custom_generate=speculative_generate, drafter=drafter)
    assert torch.equal(output, reference)
