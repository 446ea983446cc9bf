"""Spec-Verification's acceptance rule (Xia et al., 2023, arXiv 2203.16487, §3.2).

A drafted token d_i is accepted when, under the verifier's distribution at its position,

1. it is among the verifier's top-β candidates, and
2. ``log p(top-1) - log p(d_i) <= τ``.

Acceptance stops at the first rejection; the verifier's top-1 token is then appended (or, when all k drafts are
accepted, the verifier's top-1 at position k+1 as a bonus token). With β = 1 only the verifier's argmax is ever
accepted, so the output is exactly greedy decoding.
"""

from __future__ import annotations

import math

import torch

__all__ = ["accept_drafts", "commit_accepted_prefix", "count_accepted", "validate_acceptance_arguments"]


def validate_acceptance_arguments(beta: object, tau: object, block_size: object) -> None:
    """Check `beta`, `tau` and `block_size`; raise `ValueError` naming the argument and the valid range."""
    if isinstance(beta, bool) or not isinstance(beta, int) or beta < 1:
        raise ValueError(f"`beta` must be an integer >= 1 (1 = exact greedy output), got {beta!r}.")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau < math.inf:
        # an infinite margin would accept tokens the logits processors banned (score -inf)
        raise ValueError(f"`tau` must be a finite number >= 0 (a log-probability margin), got {tau!r}.")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"`block_size` must be an integer >= 1 (tokens drafted per iteration), got {block_size!r}.")


def accept_drafts(scores: torch.Tensor, draft_ids: torch.LongTensor, beta: int = 1, tau: float = 0.0) -> torch.Tensor:
    """Apply the top-β / τ rule to drafted tokens, independently at every position.

    Args:
        scores (`torch.FloatTensor` of shape `(..., vocab_size)`):
            The verifier's (processed) scores at each drafted position: the scores that predicted `draft_ids`.
        draft_ids (`torch.LongTensor` of shape `(...)`):
            The drafted tokens, one per score vector.
        beta (`int`): Candidate set size (β); 1 accepts only the verifier's argmax.
        tau (`float`): Tolerance (τ) on the log-probability gap to the verifier's top-1; ignored when `beta == 1`.

    Returns:
        `torch.BoolTensor` of shape `(...)`: whether each draft passes the rule at its own position. Use
        `count_accepted` to turn it into the length of the accepted run.
    """
    if beta == 1:
        # argmax (first index among ties) is exactly what greedy decoding would pick.
        return draft_ids == scores.argmax(dim=-1)
    draft_scores = scores.gather(-1, draft_ids.unsqueeze(-1))
    # Rank by strict comparison: a draft tied with the β-th best is inside the candidate set.
    in_top_beta = (scores > draft_scores).sum(dim=-1) < beta
    log_probs = torch.log_softmax(scores.float(), dim=-1)
    gap = log_probs.max(dim=-1).values - log_probs.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)
    return in_top_beta & (gap <= tau)


def count_accepted(accepted: torch.Tensor) -> torch.LongTensor:
    """Length of the leading run of accepted drafts.

    Args:
        accepted (`torch.BoolTensor` of shape `(batch_size, block_size)`): output of `accept_drafts`.

    Returns:
        `torch.LongTensor` of shape `(batch_size,)`: number of drafts accepted before the first rejection.
    """
    return accepted.long().cumprod(dim=-1).sum(dim=-1)


def commit_accepted_prefix(
    draft_ids: torch.LongTensor,
    accepted: torch.BoolTensor,
    stop_tokens: torch.LongTensor,
    budgets: torch.LongTensor,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Keep each row's leading run of accepted drafts, then append the verifier's token where the run stops.

    Args:
        draft_ids (`torch.LongTensor` of shape `(rows, k)`): The drafts.
        accepted (`torch.BoolTensor` of shape `(rows, k)`): Whether each draft passes the rule at its position.
        stop_tokens (`torch.LongTensor` of shape `(rows, k + 1)`): The token emitted when the run stops at each
            position (the verifier's top-1 in greedy mode; position k is the bonus token).
        budgets (`torch.LongTensor` of shape `(rows,)`): The most drafts a row may accept (its length budget, or the
            drafts it verified).

    Returns:
        `(new_tokens, num_accepted)`: `(rows, k + 1)` tokens whose first `num_accepted + 1` are appended, and
        `(rows,)` accepted counts.
    """
    num_accepted = (
        torch.minimum(count_accepted(accepted), budgets) if draft_ids.shape[1] else torch.zeros_like(budgets)
    )
    offsets = torch.arange(stop_tokens.shape[1], device=draft_ids.device).unsqueeze(0)
    drafts_then_stop = torch.cat([draft_ids, stop_tokens[:, draft_ids.shape[1] :]], dim=1)
    new_tokens = torch.where(offsets < num_accepted.unsqueeze(1), drafts_then_stop, stop_tokens)
    return new_tokens, num_accepted
