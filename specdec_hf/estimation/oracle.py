"""A drafter whose cost is a real drafter's and whose tokens follow an acceptance profile.

To measure what speculative decoding would buy on a verifier before any drafter is trained, every iteration runs
the real drafter's `propose` (so its cost is paid exactly as in use) and then replaces its drafts: right (the
verifier's greedy continuation, known beforehand) for the first `a` positions and wrong after, `a` drawn from an
acceptance profile. The draws are fixed per (row, iteration) in advance, so every timed round sees the same luck.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..drafting import Drafter, DraftProposal
from ..generation.wrapping_drafter import WrappingDrafter

__all__ = ["ProfileOracleDrafter"]


@dataclass
class _OracleState:
    inner: Any  # the wrapped drafter's state
    rows: torch.LongTensor  # (active_rows,) original row of each active row
    iterations: torch.LongTensor  # (active_rows,) propose calls so far per row


class ProfileOracleDrafter(WrappingDrafter):
    """
    Wraps a drafter: runs its `propose`, then drafts the reference continuation, right for `accepted[row, it]`
    positions of iteration `it` and wrong from there on.

    Args:
        drafter (`Drafter` or `SpecDrafterModel`): The real drafter whose calls are paid (a model is wrapped in its
            adapter).
        reference (`torch.LongTensor` of shape `(batch_size, total_length)`): The verifier's greedy output for the
            batch (decoder start token included).
        accepted (`torch.LongTensor` of shape `(batch_size, max_iterations)`): Drafts right per row and iteration
            (e.g. `AcceptanceProfile.draw_accepted`); iterations past the end draw all wrong.
    """

    def __init__(self, drafter: Drafter, reference: torch.LongTensor, accepted: torch.LongTensor):
        super().__init__(drafter)
        self.reference = reference
        self.accepted = accepted

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states) -> _OracleState:
        """The wrapped drafter's state, plus each row's identity and iteration count."""
        rows = torch.arange(encoder_hidden_states.shape[0])
        inner = self.drafter.init_drafting_state(input_ids, attention_mask, encoder_hidden_states)
        return _OracleState(inner, rows, torch.zeros_like(rows))

    def propose(self, state: _OracleState, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        """The real drafter's call, its drafts replaced by the profile's right and wrong tokens."""
        proposal = self.drafter.propose(state.inner, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states)
        lengths = prefix_lengths.cpu()
        positions = lengths.unsqueeze(1) + torch.arange(num_draft_tokens)  # (rows, k)
        width = self.reference.shape[1]
        right = self.reference[state.rows.unsqueeze(1), positions.clamp(max=width - 1)]
        right = torch.where(positions < width, right, 0)
        iteration = state.iterations.clamp(max=self.accepted.shape[1] - 1)
        num_right = self.accepted[state.rows, iteration]
        num_right = torch.where(state.iterations < self.accepted.shape[1], num_right, 0)
        wrong = torch.arange(num_draft_tokens).unsqueeze(0) >= num_right.unsqueeze(1)
        draft_ids = torch.where(wrong, (right + 1) % self.vocab_size, right)
        new_state = _OracleState(proposal.state, state.rows, state.iterations + 1)
        return DraftProposal(draft_ids=draft_ids.to(prefix_ids.device), draft_logits=None, state=new_state)

    def select_rows(self, state: _OracleState, rows: torch.LongTensor) -> _OracleState:
        """Keeps `rows` of the wrapped state and of the oracle's own bookkeeping."""
        cpu_rows = rows.cpu()
        return _OracleState(
            self.drafter.select_rows(state.inner, rows),
            state.rows.index_select(0, cpu_rows),
            state.iterations.index_select(0, cpu_rows),
        )
