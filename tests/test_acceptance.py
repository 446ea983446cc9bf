"""The top-β / τ acceptance rule on hand-written scores."""

from __future__ import annotations

import math

import pytest
import torch

from specdec_hf import accept_drafts, count_accepted
from specdec_hf.acceptance import validate_acceptance_arguments


def _log_probs(*probabilities):
    return torch.tensor([math.log(p) for p in probabilities])


def test_beta_one_accepts_only_argmax():
    scores = torch.tensor([[0.1, 2.0, 1.9], [3.0, 0.0, -1.0]])
    assert accept_drafts(scores, torch.tensor([1, 0])).tolist() == [True, True]
    assert accept_drafts(scores, torch.tensor([2, 1])).tolist() == [False, False]


def test_beta_binds():
    # probabilities 0.4, 0.3, 0.2, 0.1: the third-best token is 0.69 nats below the best, well inside tau = 5
    scores = _log_probs(0.4, 0.3, 0.2, 0.1).expand(4, -1)
    drafts = torch.tensor([0, 1, 2, 3])
    assert accept_drafts(scores, drafts, beta=2, tau=5.0).tolist() == [True, True, False, False]
    assert accept_drafts(scores, drafts, beta=3, tau=5.0).tolist() == [True, True, True, False]


def test_tau_binds():
    # all four tokens are inside top-4; only the log-probability gap separates them
    scores = _log_probs(0.5, 0.3, 0.15, 0.05).expand(4, -1)
    drafts = torch.tensor([0, 1, 2, 3])
    gap_second = math.log(0.5 / 0.3)  # 0.51
    gap_third = math.log(0.5 / 0.15)  # 1.20
    assert accept_drafts(scores, drafts, beta=4, tau=gap_second + 1e-4).tolist() == [True, True, False, False]
    assert accept_drafts(scores, drafts, beta=4, tau=gap_third + 1e-4).tolist() == [True, True, True, False]
    assert accept_drafts(scores, drafts, beta=4, tau=0.0).tolist() == [True, False, False, False]


def test_rule_uses_normalised_log_probabilities():
    # unnormalised scores shifted by a constant give the same decisions
    scores = _log_probs(0.5, 0.3, 0.15, 0.05)
    drafts = torch.tensor([1])
    assert accept_drafts(scores[None] + 17.0, drafts, beta=2, tau=0.6).tolist() == [True]
    assert accept_drafts(scores[None] + 17.0, drafts, beta=2, tau=0.4).tolist() == [False]


def test_tie_with_beta_th_token_is_inside():
    scores = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    assert accept_drafts(scores, torch.tensor([2]), beta=2, tau=10.0).tolist() == [True]


def test_count_accepted_stops_at_first_rejection():
    accepted = torch.tensor([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert count_accepted(accepted).tolist() == [2, 0, 4]


def test_works_on_blocks():
    scores = torch.randn(3, 5, 11)
    drafts = scores.argmax(-1)
    assert accept_drafts(scores, drafts, beta=1).all()
    assert accept_drafts(scores, drafts, beta=4, tau=0.5).all()


@pytest.mark.parametrize(
    "beta, tau, num_draft_tokens, name",
    [
        (0, 0.0, 4, "beta"),
        (1.5, 0.0, 4, "beta"),
        (True, 0.0, 4, "beta"),
        (1, -0.1, 4, "tau"),
        (1, float("nan"), 4, "tau"),
        (1, float("inf"), 4, "tau"),
        (1, 0.0, 0, "num_draft_tokens"),
        (1, 0.0, 2.0, "num_draft_tokens"),
    ],
)
def test_validation_names_the_argument(beta, tau, num_draft_tokens, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        validate_acceptance_arguments(beta, tau, num_draft_tokens)


def test_commit_accepted_prefix_without_drafts_appends_the_verifier_token():
    """A plain step (k = 0): the verifier's token alone, no draft accepted, whatever the budgets say."""
    from specdec_hf.acceptance import commit_accepted_prefix

    drafts = torch.zeros(2, 0, dtype=torch.long)
    new_tokens, num_accepted = commit_accepted_prefix(
        drafts, drafts.bool(), torch.tensor([[50], [60]]), torch.tensor([0, 3])
    )
    assert new_tokens.tolist() == [[50], [60]] and num_accepted.tolist() == [0, 0]


def test_commit_accepted_prefix_keeps_the_run_then_the_verifier_token():
    from specdec_hf.acceptance import commit_accepted_prefix

    drafts = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7]])
    accepted = torch.tensor([[True, False, True], [True, True, True], [True, True, True]])
    stop_tokens = torch.tensor([[50, 60, 70, 80], [50, 60, 70, 80], [50, 60, 70, 80]])
    budgets = torch.tensor([3, 3, 1])
    new_tokens, num_accepted = commit_accepted_prefix(drafts, accepted, stop_tokens, budgets)
    assert num_accepted.tolist() == [1, 3, 1]  # a later accepted draft after a rejection does not count
    # the first num_accepted + 1 tokens are appended: the drafts, then the verifier's token at the stop
    assert [row[: n + 1] for row, n in zip(new_tokens.tolist(), num_accepted.tolist(), strict=True)] == [
        [5, 60],
        [5, 6, 7, 80],
        [5, 60],
    ]
