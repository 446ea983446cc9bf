"""Confidence-truncated verification (`draft_confidence_threshold`): fewer drafts verified, the same output."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import ConfidentOracleDrafter

from specdec_hf import SpecDrafterAdapter, SpecDrafterModel, speculative_generate
from specdec_hf.drafting import DraftProposal, softmax_at
from specdec_hf.generation import ReducedHeadProposal
from specdec_hf.generation.speculative_loop import confident_draft_counts

GREEDY = dict(do_sample=False, num_beams=1)


def test_confident_draft_counts():
    confidence = torch.tensor([[0.9, 0.9, 0.9, 0.1], [0.05, 0.9, 0.9, 0.9], [1.0, 1.0, 1.0, 1.0]])
    assert confident_draft_counts(confidence, 0.5).tolist() == [3, 1, 4]  # never zero: the first draft always
    assert confident_draft_counts(confidence, 0.0).tolist() == [4, 4, 4]
    assert confident_draft_counts(confidence, 1.0).tolist() == [1, 1, 4]


def _reduced_head_proposal(draft_ids, head_logits, head_ids, vocab_size):
    return ReducedHeadProposal(draft_ids, head_logits, None, torch.tensor(head_ids), vocab_size)


def test_reduced_head_proposal_scores_the_verifier_vocabulary():
    """A reduced head's scores reach the loop over the verifier's vocabulary: its own at its ids, -inf elsewhere."""
    head_logits = torch.tensor([[[1.0, 2.0, 3.0]]])
    proposal = _reduced_head_proposal(torch.tensor([[5]]), head_logits, head_ids=[7, 3, 5], vocab_size=10)
    expected = torch.full((1, 1, 10), float("-inf"))
    expected[0, 0, [7, 3, 5]] = head_logits[0, 0]
    assert torch.equal(proposal.draft_logits, expected)
    assert proposal.draft_logits is proposal.draft_logits  # built once, on first read


def test_proposal_confidence_from_logits():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]]))
    # a drafter's own confidence wins; without it, the softmax of the logits at the drafted ids (argmax or not)
    given = DraftProposal(torch.tensor([[0, 2]]), logits, None, draft_confidence=torch.tensor([[0.9, 0.9]]))
    assert given.confidence() is given.draft_confidence
    derived = DraftProposal(torch.tensor([[1, 2]]), logits, None).confidence()
    torch.testing.assert_close(derived, torch.tensor([[0.3, 0.8]]))
    # a reduced head over verifier ids [7, 3, 5]: id 3 is its column 1; id 4 lies outside the head (probability 0)
    reduced = _reduced_head_proposal(torch.tensor([[3, 4]]), logits, head_ids=[7, 3, 5], vocab_size=10)
    torch.testing.assert_close(reduced.confidence(), torch.tensor([[0.3, 0.0]]))
    # ids beyond the head's largest id, draft_ids wider than the logits, half-precision logits
    wide = _reduced_head_proposal(torch.tensor([[9, 5, 3]]), logits.bfloat16(), head_ids=[7, 3, 5], vocab_size=10)
    torch.testing.assert_close(wide.confidence(), torch.tensor([[0.0, 0.8]]), atol=1e-2, rtol=0)
    assert DraftProposal(torch.tensor([[1, 2]]), None, None).confidence() is None


def _start_drafting(num_draft_tokens: int, inference_buffer: bool = False):
    """A drafter with a reduced head over verifier ids [9, 4, 30] (its buffer made under `torch.inference_mode` if
    asked), its adapter, and a call that drafts `num_draft_tokens` from the start token for two rows."""
    model = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=num_draft_tokens, decoder_layers=1, draft_vocab_ids=[9, 4, 30]
    )
    if inference_buffer:
        with torch.inference_mode():
            drafter.draft_vocab_ids = torch.tensor([9, 4, 30])
    adapter = SpecDrafterAdapter(drafter.eval())
    inputs = make_source_batch(2, seed=1, pad_token_id=model.config.pad_token_id)
    encoder_states = model.get_encoder()(**inputs).last_hidden_state
    state = adapter.init_drafting_state(inputs["input_ids"], inputs["attention_mask"], encoder_states)
    start = torch.full((2, 1), model.config.decoder_start_token_id)
    return drafter, adapter, lambda: adapter.propose(state, start, torch.tensor([1, 1]), num_draft_tokens)


def test_reduced_head_proposals_share_the_adapters_id_map():
    """The adapter inverts the head's ids once; its proposals read that map, and their confidence is the head's
    softmax at the drafted rows."""
    _, adapter, propose = _start_drafting(3)
    proposals = [propose() for _ in range(2)]
    assert proposals[0].head_rows is proposals[1].head_rows is adapter.head_rows
    assert adapter.head_rows[[9, 4, 30]].tolist() == [0, 1, 2] and adapter.head_rows.eq(-1).sum() == VOCAB_SIZE - 3
    rows = proposals[0].head_logits.argmax(dim=-1)
    expected = torch.softmax(proposals[0].head_logits, dim=-1).gather(-1, rows[..., None]).squeeze(-1)
    torch.testing.assert_close(proposals[0].confidence(), expected)


@pytest.mark.parametrize("inference_buffer", [False, True], ids=["tracked", "inference_tensor"])
def test_adapter_remakes_its_maps_when_the_head_changes_in_place(inference_buffer):
    """A long-lived adapter follows its model's head: after `draft_vocab_ids` is rewritten in place (as
    `load_state_dict` does), drafts and confidence read the new ids, not a map made from the old ones; also for a
    buffer made under `torch.inference_mode`, which has no version counter."""
    drafter, _, propose = _start_drafting(2, inference_buffer)
    assert drafter.draft_vocab_ids.is_inference() == inference_buffer
    propose().confidence()  # the maps of ids [9, 4, 30] in use
    with torch.inference_mode() if inference_buffer else torch.no_grad():
        drafter.draft_vocab_ids.copy_(torch.tensor([40, 12, 7]))
    proposal = propose()
    rows = proposal.head_logits.argmax(dim=-1)
    assert torch.equal(proposal.draft_ids, torch.tensor([40, 12, 7])[rows])
    expected = torch.softmax(proposal.head_logits, dim=-1).gather(-1, rows[..., None]).squeeze(-1)
    torch.testing.assert_close(proposal.confidence(), expected)


def test_adapter_follows_a_replaced_head_buffer():
    """Assigning a new `draft_vocab_ids` tensor (as `.to(device)` does) after the adapter was made: drafts are mapped
    through the new ids."""
    drafter, adapter, propose = _start_drafting(2)
    propose()
    drafter.draft_vocab_ids = torch.tensor([40, 12, 7])
    proposal = propose()
    rows = proposal.head_logits.argmax(dim=-1)
    assert torch.equal(proposal.draft_ids, torch.tensor([40, 12, 7])[rows])
    assert adapter.head_rows[[40, 12, 7]].tolist() == [0, 1, 2] and adapter.head_rows[[9, 4, 30]].eq(-1).all()


@pytest.mark.parametrize("reduced_head", [False, True], ids=["full_head", "reduced_head"])
def test_spec_drafter_confidence_truncates_and_keeps_greedy(reduced_head):
    """The Spec-Drafter reports no confidence of its own: the loop derives it from its logits and truncates."""
    model = build_verifier("bart")
    inputs = make_source_batch(4, seed=3, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=16)
    head = dict(draft_vocab_ids=list(range(3, 60))) if reduced_head else {}
    drafter = SpecDrafterModel.from_verifier(model, max_draft_tokens=4, decoder_layers=1, **head).eval()
    output = model.generate(
        **inputs,
        **GREEDY,
        max_new_tokens=16,
        custom_generate=speculative_generate,
        return_dict_in_generate=True,
        drafter=drafter,
        # an untrained drafter is nearly uniform over the vocabulary: its running confidence falls below this
        # after the first draft, so every iteration verifies exactly one
        draft_confidence_threshold=0.5,
    )
    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    assert stats.verified_at_position[1:] == [0, 0, 0]
    assert 0 < sum(stats.verified_tokens) < stats.proposed_tokens


@pytest.mark.parametrize("processors", [False, True], ids=["all_positions_at_once", "per_position"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("num_draft_tokens", [4, 10])
@pytest.mark.parametrize("accuracy", ["right", "half"])
def test_truncated_verification_equals_greedy(family, batch_size, num_draft_tokens, accuracy, processors):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=3, pad_token_id=model.config.pad_token_id)
    options = dict(max_new_tokens=20, repetition_penalty=1.2) if processors else dict(max_new_tokens=20)
    reference = model.generate(**inputs, **GREEDY, **options)
    full = model.generate(
        **inputs,
        **GREEDY,
        **options,
        custom_generate=speculative_generate,
        return_dict_in_generate=True,
        drafter=ConfidentOracleDrafter(reference, VOCAB_SIZE, num_draft_tokens, accuracy),
    )
    truncated = model.generate(
        **inputs,
        **GREEDY,
        **options,
        custom_generate=speculative_generate,
        return_dict_in_generate=True,
        drafter=ConfidentOracleDrafter(reference, VOCAB_SIZE, num_draft_tokens, accuracy),
        draft_confidence_threshold=0.3,
    )
    assert torch.equal(full.sequences, reference) and torch.equal(truncated.sequences, reference)
    stats = truncated.speculative_stats
    assert sum(stats.verified_tokens) < sum(full.speculative_stats.verified_tokens)
    assert sum(stats.verified_tokens) < stats.proposed_tokens
    if batch_size > 1:  # rows were cut at different lengths: some verified past position 1, some stopped there
        assert stats.verified_at_position[1] < stats.verified_at_position[0]


def test_threshold_one_verifies_exactly_one_draft_per_row():
    model = build_verifier("bart")
    inputs = make_source_batch(4, pad_token_id=1)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=16)
    output = model.generate(
        **inputs,
        **GREEDY,
        max_new_tokens=16,
        custom_generate=speculative_generate,
        return_dict_in_generate=True,
        drafter=ConfidentOracleDrafter(reference, VOCAB_SIZE, 4, "right"),
        draft_confidence_threshold=1.0,
    )
    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    assert stats.verified_at_position[1:] == [0, 0, 0]
    # one verified draft in every iteration that had length budget left (the last one of a row may have none)
    assert stats.verified_at_position[0] >= sum(stats.iterations) - 4 > 0


@pytest.mark.parametrize("threshold", [-0.1, 1.5, "0.5", True])
def test_bad_threshold_is_rejected(threshold):
    model = build_verifier("bart")
    inputs = make_source_batch(1, pad_token_id=1)
    drafter = ConfidentOracleDrafter(model.generate(**inputs, max_new_tokens=4), VOCAB_SIZE, 4)
    with pytest.raises(ValueError, match="draft_confidence_threshold"):
        model.generate(
            **inputs,
            max_new_tokens=4,
            custom_generate=speculative_generate,
            drafter=drafter,
            draft_confidence_threshold=threshold,
        )


def test_softmax_at_is_the_probability_of_a_column_and_zero_outside_the_scores():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]], dtype=torch.bfloat16))
    probabilities = softmax_at(logits, torch.tensor([2, -1]))
    assert probabilities.dtype == torch.float32
    torch.testing.assert_close(probabilities, torch.tensor([0.2, 0.0]), atol=5e-3, rtol=0)
