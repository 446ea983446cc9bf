"""Test drafters: the oracles of `specdec_hf.testing`, and two that also record what the loop hands them or report a
confidence of their own."""

from __future__ import annotations

import torch

from specdec_hf.testing import OracleDrafter, RandomDrafter

__all__ = ["ConfidentOracleDrafter", "OracleDrafter", "RandomDrafter", "StateRecordingDrafter"]


class StateRecordingDrafter(OracleDrafter):
    """An oracle that also reads verifier states (`verifier_state_layers`) and records what the loop hands it."""

    def __init__(self, *args, layers=(0, -1), confidence=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.verifier_state_layers = list(layers)
        self.confidence = confidence
        self.recorded = []  # (source rows, prefix_ids, prefix_lengths, verifier_states) per call

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        self.recorded.append((state.clone(), prefix_ids.clone(), prefix_lengths.clone(), verifier_states))
        proposal = super().propose(state, prefix_ids, prefix_lengths, num_draft_tokens)
        if self.confidence is not None:
            proposal.draft_confidence = self.confidence(state, prefix_lengths, num_draft_tokens)
        return proposal


class ConfidentOracleDrafter(OracleDrafter):
    """An oracle that reports a fixed pseudo-random confidence per (row, position): 0.95, 0.5 or 0.1."""

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        proposal = super().propose(state, prefix_ids, prefix_lengths, num_draft_tokens)
        positions = prefix_lengths.unsqueeze(1) + torch.arange(num_draft_tokens).unsqueeze(0)
        level = (state.unsqueeze(1) * 31 + positions * 17) % 3
        proposal.draft_confidence = torch.tensor([0.95, 0.5, 0.1])[level]
        return proposal
