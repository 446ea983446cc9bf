"""A custom drafter's faulty proposal is refused with an error naming the drafter, not a torch error deep inside.

Ids outside the vocabulary, of a float dtype or too few per row, `propose` returning something other than a
`DraftProposal`, and `draft_logits` that sampling or confidence truncation cannot use. Values are checked at every
call: at once on the drafter's first call, later with the iteration's outcome (no host synchronisation of their own).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import OracleDrafter

from specdec_hf import DraftProposal, speculative_generate
from specdec_hf.generation.proposal_checks import check_proposal, make_safe

GREEDY = dict(do_sample=False, max_new_tokens=12)


class FaultyDrafter(OracleDrafter):
    """An oracle whose proposals are spoilt in one way."""

    def __init__(self, reference, fault: str, vocab_size=VOCAB_SIZE, from_call: int = 1):
        super().__init__(reference, VOCAB_SIZE, 4, "half")
        self.fault = fault
        self.vocab_size = vocab_size
        self.from_call = from_call  # the first call (1, 2, ...) that is spoilt; `OracleDrafter` counts them

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        proposal = super().propose(state, prefix_ids, prefix_lengths, num_draft_tokens)  # counts the call
        ids, logits = proposal.draft_ids, proposal.draft_logits
        if self.calls < self.from_call:
            return proposal
        if self.fault == "none":
            return None
        if self.fault == "ids_at_vocab":
            ids = torch.full_like(ids, VOCAB_SIZE)
        elif self.fault == "ids_negative":
            ids = torch.full_like(ids, -1)
        elif self.fault == "ids_float":
            ids = ids.float()
        elif self.fault == "ids_shape":
            ids = ids[:, :-1]
        elif self.fault == "logits_nan":
            logits = torch.full_like(logits, float("nan"))
        elif self.fault == "logits_minus_inf":
            logits = torch.full_like(logits, float("-inf"))
        elif self.fault == "logits_width":
            logits = logits[..., :-3]
        return DraftProposal(draft_ids=ids, draft_logits=logits, state=proposal.state)


@pytest.fixture(scope="module")
def bart():
    return build_verifier("bart")


@pytest.fixture(scope="module")
def inputs():
    return make_source_batch(2)


def _speculative(model, inputs, drafter, **kwargs):
    return model.generate(**inputs, **{**GREEDY, **kwargs}, custom_generate=speculative_generate, drafter=drafter)


@pytest.mark.parametrize(
    "fault, kwargs, match",
    [
        ("ids_at_vocab", {}, r"draft_ids from 99 to 99, outside the verifier's vocabulary \[0, 99\)"),
        ("ids_negative", {}, r"draft_ids from -1 to -1, outside the verifier's vocabulary"),
        ("ids_float", {}, r"draft_ids of dtype torch.float32: token ids must be integers"),
        ("ids_shape", {}, r"draft_ids of shape \(2, 3\); expected \(2, 4\) \(rows, num_draft_tokens\)"),
        ("none", {}, r"`propose` returned NoneType, not a `DraftProposal`"),
        ("logits_nan", {"do_sample": True}, r"draft_logits containing NaN"),
        ("logits_minus_inf", {"do_sample": True}, r"draft_logits that are `-inf` over the whole vocabulary"),
        ("logits_width", {"do_sample": True}, r"draft_logits of shape \(2, 4, 96\); expected \(2, 4, 99\)"),
        ("logits_width", {"draft_confidence_threshold": 0.3}, r"draft_logits of shape \(2, 4, 96\)"),
    ],
)
def test_faulty_proposals_name_the_drafter(bart, inputs, fault, kwargs, match):
    drafter = FaultyDrafter(bart.generate(**inputs, **GREEDY), fault)
    with pytest.raises(ValueError, match=match) as error:
        _speculative(bart, inputs, drafter, **kwargs)
    assert "`drafter` (FaultyDrafter)" in str(error.value)


@pytest.mark.parametrize(
    "fault, kwargs, match",
    [
        ("ids_at_vocab", {}, r"draft_ids from 99 to 99, outside the verifier's vocabulary \[0, 99\)"),
        ("ids_negative", {}, r"draft_ids from -1 to -1, outside the verifier's vocabulary"),
        ("ids_negative", {"do_sample": True}, r"draft_ids from -1 to -1"),
        ("ids_negative", {"num_draft_tokens": "auto"}, r"draft_ids from -1 to -1"),
        ("ids_shape", {}, r"draft_ids of shape \(\d, 3\); expected \(\d, 4\)"),
        ("logits_nan", {"do_sample": True}, r"draft_logits containing NaN"),
        ("logits_minus_inf", {"do_sample": True}, r"draft_logits that are `-inf` over the whole vocabulary"),
        ("logits_width", {"do_sample": True}, r"draft_logits of shape \(2, 4, 96\); expected \(2, 4, 99\)"),
    ],
)
def test_a_fault_that_appears_after_the_first_call_is_the_same_clear_error(bart, inputs, fault, kwargs, match, clock):
    """Values are checked at every call: a late fault is refused as the first call's would be, not left to torch.
    (`clock`: with `"auto"`, the schedule's timings do not depend on the machine's load, so its drafting calls (above
    one row probes among plain calls) reach the spoilt call; on the machine's clock a loaded machine can make them step
    without drafting.)"""
    drafter = FaultyDrafter(bart.generate(**inputs, **{**GREEDY, "max_new_tokens": 24}), fault, from_call=3)
    with pytest.raises(ValueError, match=match) as error:
        # `"auto"` above one row decodes plainly (the drafter not called) until a drafting call runs as a probe
        for _ in range(10):
            _speculative(bart, inputs, drafter, max_new_tokens=24, **kwargs)
    # the values are checked with the spoilt call's own iteration
    assert "`drafter` (FaultyDrafter)" in str(error.value) and drafter.calls == 3


def test_logits_that_are_never_read_are_not_checked(bart, inputs):
    """Greedy verification without a confidence threshold never reads `draft_logits`: their width does not matter."""
    reference = bart.generate(**inputs, **GREEDY)
    assert torch.equal(_speculative(bart, inputs, FaultyDrafter(reference, "logits_width")), reference)


@pytest.mark.parametrize("vocab_size", [np.int64(VOCAB_SIZE), torch.tensor(VOCAB_SIZE)])
def test_integer_sizes_of_other_types_are_accepted(bart, inputs, vocab_size):
    reference = bart.generate(**inputs, **GREEDY)
    drafter = FaultyDrafter(reference, "ok", vocab_size=vocab_size)
    drafter.num_draft_tokens = np.int64(4)
    assert torch.equal(_speculative(bart, inputs, drafter), reference)


def test_values_are_read_at_once_on_the_first_call_and_handed_on_later():
    """Later calls return the facts (on the device) for the loop to read with the iteration's outcome."""
    proposal = DraftProposal(draft_ids=torch.full((2, 4), VOCAB_SIZE), draft_logits=None, state=None)
    arguments = dict(drafter=object(), rows=2, num_draft_tokens=4, vocab_size=VOCAB_SIZE, do_sample=False)
    facts = check_proposal(proposal, first_call=False, confidence_threshold=None, **arguments)
    assert facts.tolist() == [VOCAB_SIZE, VOCAB_SIZE, 0, 0]
    with pytest.raises(ValueError, match="outside the verifier's vocabulary"):
        check_proposal(proposal, first_call=True, confidence_threshold=None, **arguments)


def test_unread_values_are_made_safe_for_the_verifier_and_the_sampler():
    ids = torch.tensor([[-1, 5, VOCAB_SIZE]])
    logits = torch.zeros(1, 3, VOCAB_SIZE)
    logits[0, 0] = float("nan")
    logits[0, 1] = float("-inf")
    safe_ids, safe_logits = make_safe(ids, logits, VOCAB_SIZE)
    assert safe_ids.tolist() == [[0, 5, VOCAB_SIZE - 1]]
    assert torch.isfinite(safe_logits).all()
