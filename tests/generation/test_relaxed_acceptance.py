"""Invariants of the relaxed (β > 1, τ > 0) path on a real tiny verifier."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import OracleDrafter, RandomDrafter

from specdec_hf import speculative_generate


def _relaxed(model, inputs, drafter, beta, tau, num_draft_tokens, **kwargs):
    return model.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=20,
        custom_generate=speculative_generate,
        drafter=drafter,
        num_draft_tokens=num_draft_tokens,
        beta=beta,
        tau=tau,
        return_dict_in_generate=True,
        output_scores=True,
        **kwargs,
    )


@pytest.mark.parametrize("beta, tau", [(3, 1.0), (5, 3.0), (99, 100.0)])
def test_every_token_passes_the_rule_and_blocks_stay_in_bounds(family, beta, tau):
    model = build_verifier(family)
    inputs = make_source_batch(4, pad_token_id=model.config.pad_token_id)
    num_draft_tokens = 4
    drafter = RandomDrafter(VOCAB_SIZE, num_draft_tokens, seed=3)
    output = _relaxed(model, inputs, drafter, beta, tau, num_draft_tokens)
    stats = output.speculative_stats
    for row in range(4):
        assert stats.iterations[row] <= stats.generated_tokens[row] <= (num_draft_tokens + 1) * stats.iterations[row]
    # each emitted token is in the verifier's top-beta within tau of its top-1 at that position
    for step, scores in enumerate(output.scores):
        token = output.sequences[:, step + 1]
        log_probs = torch.log_softmax(scores, dim=-1)
        token_log_prob = log_probs.gather(1, token[:, None]).squeeze(1)
        rank = (log_probs > token_log_prob[:, None]).sum(-1)
        gap = log_probs.max(-1).values - token_log_prob
        emitted = scores.abs().sum(-1) > 0  # rows that had finished carry zero scores
        assert (rank[emitted] < beta).all()
        assert (gap[emitted] <= tau + 1e-5).all()


def test_relaxed_accepts_more_than_exact_and_is_deterministic():
    model = build_verifier("bart")
    inputs = make_source_batch(4, pad_token_id=1)
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=20)
    # random drafts: only a rule relaxed to the whole vocabulary accepts them all
    drafter = RandomDrafter(VOCAB_SIZE, 6, seed=5)
    first = _relaxed(model, inputs, drafter, beta=VOCAB_SIZE, tau=1e9, num_draft_tokens=6)
    again = _relaxed(model, inputs, RandomDrafter(VOCAB_SIZE, 6, seed=5), beta=VOCAB_SIZE, tau=1e9, num_draft_tokens=6)
    assert torch.equal(first.sequences, again.sequences)
    # with the rule fully relaxed every draft is accepted: k + 1 tokens per iteration until the length budget
    assert first.speculative_stats.acceptance_rate == 1.0
    exact = _relaxed(
        model, inputs, OracleDrafter(reference, VOCAB_SIZE, 6, "wrong"), beta=1, tau=0.0, num_draft_tokens=6
    )
    assert exact.speculative_stats.tokens_per_iteration == 1.0
    assert first.speculative_stats.tokens_per_iteration > 5.0
