"""Lossless speculative sampling with a non-autoregressive drafter.

The rule of Leviathan et al. (2023, arXiv 2211.17192) and Chen et al. (2023, arXiv 2302.01318), applied to the
Spec-Drafter of Xia et al. (2023, arXiv 2203.16487): draft x_i ~ q_i, accept it with probability
``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection sample from ``normalise(max(0, p_i - q_i))``; after k
accepted drafts sample a bonus token from p_{k+1}. Every emitted token is then distributed exactly as sampling from
the verifier's p. A non-autoregressive drafter's q_i depends only on the committed prefix, not on x_<i; the rule
needs no more than that x_i was drawn from the q_i it is judged against.
"""

from __future__ import annotations

import torch

__all__ = ["draft_distribution", "sample_drafts", "speculative_sampling_step"]


def draft_distribution(
    draft_logits: torch.FloatTensor | None,
    draft_ids: torch.LongTensor,
    vocab_size: int,
    draft_vocab_ids: torch.LongTensor | None = None,
) -> torch.FloatTensor:
    """The proposal q of every drafted position.

    Args:
        draft_logits (`torch.FloatTensor` of shape `(rows, k, vocab_size)`, *optional*):
            The drafter's (already warped) scores; `None` for a drafter that proposes tokens without a distribution,
            which is then a point mass on `draft_ids` (still lossless: such a draft is accepted with probability p).
        draft_ids (`torch.LongTensor` of shape `(rows, k)`): The drafter's own proposal (used when there are no
            logits).
        vocab_size (`int`): The verifier's vocabulary size.
        draft_vocab_ids (`torch.LongTensor` of shape `(head_size,)`, *optional*): The verifier ids that the last
            dimension of `draft_logits` scores (a reduced drafter head); q is 0 on every other id.

    Returns:
        `torch.FloatTensor` of shape `(rows, k, vocab_size)`: probabilities.
    """
    if draft_logits is None:
        return torch.nn.functional.one_hot(draft_ids, vocab_size).float()
    q = torch.softmax(draft_logits.float(), dim=-1)
    if draft_vocab_ids is None:
        return q
    full = q.new_zeros((*q.shape[:-1], vocab_size))
    full[..., draft_vocab_ids.to(q.device)] = q
    return full


def sample_drafts(q: torch.FloatTensor, generator: torch.Generator | None = None) -> torch.LongTensor:
    """Draw x_i ~ q_i independently at every position: `(rows, k, vocab)` probabilities → `(rows, k)` ids."""
    rows, k, vocab = q.shape
    return torch.multinomial(q.reshape(rows * k, vocab), 1, generator=generator).reshape(rows, k)


def speculative_sampling_step(
    p: torch.FloatTensor,
    q: torch.FloatTensor,
    draft_ids: torch.LongTensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.BoolTensor, torch.LongTensor]:
    """Judge one drafted position of every row.

    Args:
        p (`torch.FloatTensor` of shape `(rows, vocab)`): The verifier's probabilities at this position.
        q (`torch.FloatTensor` of shape `(rows, vocab)`): The proposal the drafts were drawn from.
        draft_ids (`torch.LongTensor` of shape `(rows,)`): The drafts x ~ q.
        generator (`torch.Generator`, *optional*): Source of randomness (default: torch's global generator).

    Returns:
        `(accepted, replacement)`: `torch.BoolTensor` of shape `(rows,)` — accept with probability
        min(1, p(x)/q(x)); and `torch.LongTensor` of shape `(rows,)` — a token from normalise(max(0, p - q)), to be
        emitted where the draft was rejected.
    """
    p_draft = p.gather(1, draft_ids.unsqueeze(1)).squeeze(1)
    q_draft = q.gather(1, draft_ids.unsqueeze(1)).squeeze(1)
    uniform = torch.rand(p_draft.shape, generator=generator, device=p.device)
    # r < p/q written as r * q < p: no division by a zero q (a draft can only have q > 0 if it was drawn)
    accepted = uniform * q_draft < p_draft
    residual = (p - q).clamp(min=0)
    mass = residual.sum(dim=1, keepdim=True)
    # p == q leaves no residual mass, but then every draft is accepted; fall back to p to keep the sample valid
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p)
    replacement = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return accepted, replacement
