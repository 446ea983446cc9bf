"""What a drafter's `propose` returned, checked before the loop uses it, with errors naming the drafter and the fix.

A custom drafter's mistakes would otherwise surface deep inside torch ("index out of range in self", "probability
tensor contains either inf, nan or element < 0"). What is host metadata (the type, dtypes, shapes) is checked at
every call, for free. What needs the values (ids inside the vocabulary, scores that form a distribution) is checked
at every call too, on the device: the first call reads the facts at once (one host synchronisation); later calls
hand them to the loop, which reads them with the iteration's outcome (its one transfer) and raises the same error
then, having fed the verifier only values made safe in between ([`make_safe`]): the loop's per-iteration budget of
host syncs stays as it is, and a fault that appears late is still an error that names the drafter.
"""

from __future__ import annotations

import torch

from ..drafting import DraftProposal

__all__ = ["check_proposal", "make_safe", "raise_for_value_facts"]


def check_proposal(
    proposal: DraftProposal,
    drafter,
    rows: int,
    num_draft_tokens: int,
    vocab_size: int,
    first_call: bool,
    do_sample: bool,
    confidence_threshold: float | None,
) -> torch.LongTensor | None:
    """Check what `drafter.propose` returned for `rows` active rows and k = `num_draft_tokens`.

    `draft_logits` are checked only where the loop reads them: when sampling (their shape at every call), and for
    the confidence of a proposal without `draft_confidence` (their shape at the first call: a reduced head builds
    them over the verifier's vocabulary only when they are read).

    Args:
        proposal (`DraftProposal`): What `propose` returned.
        drafter: The drafter, named in the errors.
        vocab_size (`int`): The verifier's vocabulary size.
        first_call (`bool`): Whether this is the drafter's first call of the `generate()` call: its values are then
            checked at once (one host synchronisation).
        do_sample (`bool`), confidence_threshold (`float`, *optional*): What the loop reads of the proposal.

    Returns:
        After the first call, the values' facts on the device (`(4,)`: the smallest and largest id, whether sampling
        scores hold NaN, whether a position's are all `-inf`), for [`raise_for_value_facts`] once the loop reads
        them; `None` on the first call.

    Raises:
        ValueError: naming the drafter, what it returned and what it should return.
    """
    name = f"`drafter` ({type(drafter).__name__})"
    if not isinstance(proposal, DraftProposal):
        raise ValueError(
            f"{name}: `propose` returned {type(proposal).__name__}, not a `DraftProposal`: return "
            "`DraftProposal(draft_ids=..., draft_logits=..., state=...)` (see `specdec_hf.Drafter`)."
        )
    draft_ids = proposal.draft_ids
    _check_draft_ids_layout(draft_ids, name, rows, num_draft_tokens)
    derives_confidence = confidence_threshold is not None and proposal.draft_confidence is None
    # the condition first: reading a reduced head's `draft_logits` builds them
    draft_logits = proposal.draft_logits if do_sample or (first_call and derives_confidence) else None
    if draft_logits is not None:
        _check_draft_logits_shape(draft_logits, name, rows, num_draft_tokens, vocab_size)
    if confidence_threshold is not None and proposal.draft_confidence is not None:
        _check_confidence_shape(proposal.draft_confidence, name, rows, num_draft_tokens)
    if proposal.num_drafts is not None:
        _check_num_drafts(proposal.num_drafts, name, rows)
    facts = _value_facts(draft_ids[:, :num_draft_tokens], draft_logits if do_sample else None)
    if not first_call:
        return facts
    raise_for_value_facts(facts.tolist(), drafter, vocab_size)
    return None


def _check_num_drafts(num_drafts, name: str, rows: int) -> None:
    """One integer count per active row."""
    if (
        not isinstance(num_drafts, torch.Tensor)
        or num_drafts.is_floating_point()
        or num_drafts.dtype == torch.bool
        or tuple(num_drafts.shape) != (rows,)
    ):
        described = (
            f"of shape {tuple(num_drafts.shape)} and dtype {num_drafts.dtype}"
            if isinstance(num_drafts, torch.Tensor)
            else f"of type {type(num_drafts).__name__}"
        )
        raise ValueError(
            f"{name} returned num_drafts {described}: it must be an integer tensor of shape ({rows},), one count "
            "of drafts worth verifying per active row (or None for all k)."
        )


def _check_draft_ids_layout(draft_ids, name: str, rows: int, num_draft_tokens: int) -> None:
    """Ids of integer dtype, at least k per active row: fewer would misalign verification silently."""
    if not isinstance(draft_ids, torch.Tensor):
        raise ValueError(f"{name} returned draft_ids of type {type(draft_ids).__name__}: return a `torch.LongTensor`.")
    if draft_ids.is_floating_point() or draft_ids.is_complex() or draft_ids.dtype == torch.bool:
        raise ValueError(
            f"{name} returned draft_ids of dtype {draft_ids.dtype}: token ids must be integers (a `torch.LongTensor`); "
            "return e.g. `logits.argmax(-1)`, or convert with `.long()`."
        )
    shape = tuple(draft_ids.shape)
    if len(shape) != 2 or shape[0] != rows or shape[1] < num_draft_tokens:
        raise ValueError(
            f"{name} returned draft_ids of shape {shape}; expected ({rows}, {num_draft_tokens}) (rows, "
            "num_draft_tokens): one row per row of `prefix_ids`, at least `num_draft_tokens` ids each."
        )


def _check_draft_logits_shape(draft_logits, name: str, rows: int, num_draft_tokens: int, vocab_size: int) -> None:
    shape = tuple(draft_logits.shape)
    if len(shape) != 3 or shape[0] != rows or shape[1] < num_draft_tokens or shape[2] != vocab_size:
        raise ValueError(
            f"{name} returned draft_logits of shape {shape}; expected ({rows}, {num_draft_tokens}, {vocab_size}) "
            "(rows, num_draft_tokens, the verifier's vocabulary size): scores over the verifier's whole vocabulary, "
            "`-inf` for ids the drafter never drafts (or `draft_logits=None`)."
        )


def _check_confidence_shape(confidence, name: str, rows: int, num_draft_tokens: int) -> None:
    if confidence.dim() != 2 or confidence.shape[0] != rows or confidence.shape[1] < num_draft_tokens:
        raise ValueError(
            f"{name} returned draft_confidence of shape {tuple(confidence.shape)}; expected ({rows}, "
            f"{num_draft_tokens}) (rows, num_draft_tokens): one probability per draft."
        )


def _value_facts(draft_ids: torch.LongTensor, draft_logits: torch.FloatTensor | None) -> torch.LongTensor:
    """`(4,)` on the device: the smallest and largest id, and, when sampling reads the scores, whether they hold NaN
    and whether some position's are `-inf` over the whole vocabulary (0 otherwise)."""
    facts = [draft_ids.min().long(), draft_ids.max().long()]
    if draft_logits is not None:
        logits = draft_logits[:, : draft_ids.shape[1]].to(draft_ids.device)
        facts += [logits.isnan().any().long(), (logits == float("-inf")).all(dim=-1).any().long()]
    else:
        facts += [torch.zeros((), dtype=torch.long, device=draft_ids.device)] * 2
    return torch.stack(facts)


def make_safe(
    draft_ids: torch.LongTensor, draft_logits: torch.FloatTensor | None, vocab_size: int
) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
    """Ids clamped into the vocabulary and sampling scores without NaN or all-`-inf` positions: what the verifier
    and the sampler may read of a proposal whose facts are not read yet (an error follows if they were wrong)."""
    draft_ids = draft_ids.clamp(0, vocab_size - 1)
    if draft_logits is not None:
        # -inf (an id never drafted) is kept; NaN and +inf become finite
        draft_logits = torch.nan_to_num(draft_logits, nan=0.0, posinf=0.0, neginf=float("-inf"))
        no_distribution = (draft_logits == float("-inf")).all(dim=-1, keepdim=True)
        draft_logits = torch.where(no_distribution, 0.0, draft_logits)
    return draft_ids, draft_logits


def raise_for_value_facts(facts: list[int], drafter, vocab_size: int) -> None:
    """Raise the error a proposal's facts (as read on the host) call for, naming `drafter`; nothing when sound."""
    name = f"`drafter` ({type(drafter).__name__})"
    low, high, *scores = facts
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} returned draft_ids from {low} to {high}, outside the verifier's vocabulary [0, {vocab_size}): "
            "return ids of the verifier's tokenizer (a drafter with a smaller vocabulary maps its ids back itself)."
        )
    if scores and scores[0]:
        raise ValueError(
            f"{name} returned draft_logits containing NaN, which sampling cannot draw from: return finite scores "
            "(`-inf` only for ids the drafter never drafts), or `draft_logits=None`."
        )
    if scores and scores[1]:
        raise ValueError(
            f"{name} returned draft_logits that are `-inf` over the whole vocabulary at some position, which is no "
            "distribution to sample from: give every position at least one finite score, or `draft_logits=None`."
        )
