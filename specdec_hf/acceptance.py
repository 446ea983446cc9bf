"""Every acceptance rule of the speculative decoding loop: which drafts are kept, and what is emitted where a row stops.

**Greedy: Spec-Verification's top-β/τ rule** (Xia et al., 2023, arXiv 2203.16487, §3.2). A drafted token d_i is
accepted when, under the verifier's distribution at its position, (1) it is among the verifier's top-β candidates
and (2) ``log p(top-1) - log p(d_i) <= τ``. Acceptance stops at the first rejection; the verifier's top-1 token is
then appended (or, when all k drafts are accepted, the verifier's top-1 at position k+1 as a bonus token). With
β = 1 only the verifier's argmax is ever accepted, so the output is exactly greedy decoding.

**Sampling: lossless speculative sampling** (Leviathan et al., 2023, arXiv 2211.17192; Chen et al., 2023, arXiv
2302.01318), applied to a non-autoregressive drafter: draft x_i ~ q_i, accept it with probability
``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection sample from ``normalise(max(0, p_i - q_i))``; after k accepted
drafts sample a bonus token from p_{k+1}. Every emitted token is then distributed exactly as sampling from the
verifier's p. A non-autoregressive drafter's q_i depends only on the committed prefix, not on x_<i; the rule needs no
more than that x_i was drawn from the q_i it is judged against.

**Processed scores.** The rules read scores with the logits processors applied, each verified position's with its
own prefix (`specdec_hf.generation.position_processing`). Greedy decoding judges all positions at once
([`accept_all_positions`]); sampling judges them in turn ([`judge_per_position`] with a [`SamplingRule`]), so that
its random draws come in the order plain sampling makes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

__all__ = [
    "SamplingRule",
    "accept_all_positions",
    "accept_drafts",
    "commit_accepted_prefix",
    "count_accepted",
    "draft_distribution",
    "judge_per_position",
    "sample_drafts",
    "sample_proposal",
    "speculative_sampling_step",
    "validate_acceptance_arguments",
]

# Processors that only reshape a distribution (sampling warpers): applied to the drafter's logits too, so that its
# proposal q resembles the verifier's warped p (any q keeps sampling exact; a closer one is accepted more often).
_WARPERS = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    TopHLogitsWarper,
)


def validate_acceptance_arguments(beta: object, tau: object, num_draft_tokens: object) -> None:
    """Check `beta`, `tau` and `num_draft_tokens`; raise `ValueError` naming the argument and the valid range."""
    if isinstance(beta, bool) or not isinstance(beta, int) or beta < 1:
        raise ValueError(f"`beta` must be an integer >= 1 (1 = exact greedy output), got {beta!r}.")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau < math.inf:
        # an infinite margin would accept tokens the logits processors banned (score -inf)
        raise ValueError(f"`tau` must be a finite number >= 0 (a log-probability margin), got {tau!r}.")
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(
            f"`num_draft_tokens` must be an integer >= 1 (tokens drafted per iteration), got {num_draft_tokens!r}."
        )


# --------------------------------------------------------------------------------------------------------------
# Greedy: the top-β/τ rule
# --------------------------------------------------------------------------------------------------------------


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
        accepted (`torch.BoolTensor` of shape `(batch_size, num_draft_tokens)`): output of `accept_drafts`.

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
    if draft_ids.shape[1] == 0:  # a plain step: the verifier's token, without ~9 µs of operators (docs/RESULTS.md)
        return stop_tokens, torch.zeros_like(budgets)
    num_accepted = torch.minimum(count_accepted(accepted), budgets)
    offsets = torch.arange(stop_tokens.shape[1], device=draft_ids.device).unsqueeze(0)
    drafts_then_stop = torch.cat([draft_ids, stop_tokens[:, draft_ids.shape[1] :]], dim=1)
    new_tokens = torch.where(offsets < num_accepted.unsqueeze(1), drafts_then_stop, stop_tokens)
    return new_tokens, num_accepted


def accept_all_positions(
    scores: torch.FloatTensor, drafts: torch.LongTensor, budgets: torch.LongTensor, beta: int, tau: float
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Greedy acceptance of every verified position at once.

    Args:
        scores (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The verifier's scores, processed, at the
            positions that verify the k drafts and give the bonus token.
        drafts (`torch.LongTensor` of shape `(rows, k)`), budgets (`torch.LongTensor` of shape `(rows,)`):
            As in [`commit_accepted_prefix`].

    Returns:
        `(new_tokens, num_accepted)`, as [`commit_accepted_prefix`].
    """
    # greedy iterations on the CPU settle by the same rule on the host (`generation.host_outcome`): change both
    top1 = scores.argmax(dim=-1)  # (rows, k + 1)
    k = drafts.shape[1]
    accepted = drafts == top1[:, :k] if beta == 1 else accept_drafts(scores[:, :k], drafts, beta, tau)
    return commit_accepted_prefix(drafts, accepted, top1, budgets)


# --------------------------------------------------------------------------------------------------------------
# Sampling: the proposal q and the lossless rule
# --------------------------------------------------------------------------------------------------------------


def draft_distribution(
    draft_logits: torch.FloatTensor | None, draft_ids: torch.LongTensor, vocab_size: int
) -> torch.FloatTensor:
    """The proposal q of every drafted position.

    Args:
        draft_logits (`torch.FloatTensor` of shape `(rows, k, vocab_size)`, *optional*):
            The drafter's (already warped) scores over the verifier's vocabulary; `None` for a drafter that proposes
            tokens without a distribution, which is then a point mass on `draft_ids` (still lossless: such a draft
            is accepted with probability p).
        draft_ids (`torch.LongTensor` of shape `(rows, k)`): The drafter's own proposal (used when there are no
            logits).
        vocab_size (`int`): The verifier's vocabulary size.

    Returns:
        `torch.FloatTensor` of shape `(rows, k, vocab_size)`: probabilities.
    """
    if draft_logits is None:
        return torch.nn.functional.one_hot(draft_ids, vocab_size).float()
    return torch.softmax(draft_logits.float(), dim=-1)


def sample_drafts(q: torch.FloatTensor, generator: torch.Generator | None = None) -> torch.LongTensor:
    """Draw x_i ~ q_i independently at every position: `(rows, k, vocab)` probabilities → `(rows, k)` ids."""
    rows, k, vocab = q.shape
    return torch.multinomial(q.reshape(rows * k, vocab), 1, generator=generator).reshape(rows, k)


def sample_proposal(
    draft_logits: torch.FloatTensor | None,
    draft_ids: torch.LongTensor,
    committed: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    vocab_size: int,
) -> tuple[torch.LongTensor, torch.FloatTensor]:
    """Sampling mode's drafts: warp the drafter's scores as the verifier's are warped, and draw from that q.

    Args:
        draft_logits (`torch.FloatTensor` of shape `(rows, >= k, vocab_size)`, *optional*): The drafter's scores.
        draft_ids (`torch.LongTensor` of shape `(rows, k)`): The drafter's own drafts (kept without scores).
        committed (`torch.LongTensor` of shape `(rows, length)`): The rows' committed tokens (the warpers only need a
            tensor of the right batch: they act row by row on the scores).
        logits_processor (`LogitsProcessorList`): `generate()`'s processors; only the warpers among them are applied.
        vocab_size (`int`): The verifier's vocabulary size.

    Returns:
        `(drafts, q)`: `(rows, k)` ids drawn from q, and q, `(rows, k, vocab_size)`.
    """
    if draft_logits is None:
        return draft_ids, draft_distribution(None, draft_ids, vocab_size)
    rows, k = draft_ids.shape
    if draft_logits.shape[0] != rows or draft_logits.shape[1] < k:
        raise ValueError(
            f"The drafter returned draft_logits of shape {tuple(draft_logits.shape)}; expected ({rows}, {k}, vocab)."
        )
    logits = draft_logits[:, :k].to(committed.device).float().reshape(rows * k, -1)
    warpers = [processor for processor in logits_processor if isinstance(processor, _WARPERS)]
    if warpers:
        prefixes = committed.repeat_interleave(k, dim=0)
        for warper in warpers:
            logits = warper(prefixes, logits)
    q = draft_distribution(logits.reshape(rows, k, -1), draft_ids, vocab_size)
    return sample_drafts(q), q


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


# --------------------------------------------------------------------------------------------------------------
# Sampling, position by position
# --------------------------------------------------------------------------------------------------------------


@dataclass
class SamplingRule:
    """Speculative sampling of each draft against the processed p; a residual sample at a rejection.

    Args:
        proposal_q (`torch.FloatTensor` of shape `(rows, k, vocab_size)`): The q the drafts were drawn from.
    """

    proposal_q: torch.FloatTensor

    def prepare(self, processed: torch.FloatTensor) -> torch.FloatTensor:
        """What the rule reads of a position's processed scores: p, computed once per position."""
        return torch.softmax(processed, dim=-1)

    def judge(self, p, draft, position, in_budget) -> tuple[torch.BoolTensor, torch.LongTensor]:
        """`(accepted, replacement)` of every row at `position`. A row past its budget (`in_budget` false) is judged
        against q = 0: it accepts nothing, and its residual max(0, p - 0) is p, so it emits what plain sampling
        draws (one draw for both cases, whatever the rows' budgets)."""
        q = torch.where(in_budget.unsqueeze(1), self.proposal_q[:, position], 0.0)
        accepted, replacement = speculative_sampling_step(p, q, draft)
        return accepted & in_budget, replacement

    def fresh(self, p: torch.FloatTensor) -> torch.LongTensor:
        """The token plain sampling would emit."""
        return torch.multinomial(p, 1).squeeze(1)


def judge_per_position(
    scores: torch.FloatTensor, drafts: torch.LongTensor, budgets: torch.LongTensor, rule: SamplingRule
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Judge the drafts position by position, in order: the random draws of sampling come position after position,
    as plain sampling draws them.

    `rule.prepare(processed)` is what the rule reads of a position's scores (computed once per position),
    `rule.judge(prepared, draft, position, in_budget)` says which rows accept their draft and what each emits where
    it stops (or where its length budget ends), and `rule.fresh(prepared)` is the token plain decoding would emit
    after the last draft.

    Every row is judged at every position, also after it stopped (what it accepts there is not counted): the
    host never reads which rows are still running, so the number of host synchronisations does not grow with k.

    Args:
        scores (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The processed scores of every verified
            position (`specdec_hf.generation.position_processing`).
        drafts (`torch.LongTensor` of shape `(rows, k)`): The drafts.
        budgets (`torch.LongTensor` of shape `(rows,)`): The most drafts each row may accept.
        rule ([`SamplingRule`]): The acceptance rule.

    Returns:
        The tokens to append `(rows, k + 1)` (a row's tokens after the position where it stops are judged on its
        rejected drafts: read only its first `num_accepted + 1`) and the number of accepted drafts per row
        `(rows,)`.
    """
    rows, k = drafts.shape
    new_tokens = torch.empty((rows, k + 1), dtype=torch.long, device=drafts.device)
    num_accepted = torch.zeros(rows, dtype=torch.long, device=drafts.device)
    running = torch.ones(rows, dtype=torch.bool, device=drafts.device)
    for position in range(k + 1):
        prepared = rule.prepare(scores[:, position])
        if position == k:
            new_tokens[:, position] = rule.fresh(prepared)
            break
        draft = drafts[:, position]
        accepted, replacement = rule.judge(prepared, draft, position, budgets > position)
        new_tokens[:, position] = torch.where(accepted, draft, replacement)
        running &= accepted
        num_accepted += running
    return new_tokens, num_accepted
