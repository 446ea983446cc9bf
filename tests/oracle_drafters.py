"""Test drafters that know the verifier's greedy output: always right, always wrong, or right part of the time.

They implement `specdec_hf.Drafter` by looking the continuation up in a reference (the verifier's own greedy
output, computed beforehand), so the decoding loop can be checked independently of any trained drafter.
"""

from __future__ import annotations

import torch

from specdec_hf import Drafter, DraftProposal


class OracleDrafter(Drafter):
    """Proposes `reference[row, len:len + k]`, corrupted at the positions `wrong_pattern` selects.

    Args:
        reference (`torch.LongTensor` of shape `(batch_size, total_length)`): The verifier's greedy output.
        vocab_size (`int`): The verifier's vocabulary size.
        block_size (`int`): Default k.
        accuracy (`str`): "right" (never corrupt), "wrong" (always corrupt) or "half" (corrupt a fixed
            pseudo-random half of the (row, position) pairs).
    """

    def __init__(self, reference: torch.LongTensor, vocab_size: int, block_size: int = 4, accuracy: str = "right"):
        self.reference = reference
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.accuracy = accuracy
        self.calls = 0

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states):
        return torch.arange(encoder_hidden_states.shape[0])

    def select_rows(self, state, rows):
        return state.index_select(0, rows)

    def propose(self, state, prefix_ids, prefix_lengths, block_size):
        self.calls += 1
        rows = state
        width = self.reference.shape[1]
        positions = prefix_lengths.unsqueeze(1) + torch.arange(block_size).unsqueeze(0)
        # past the end of the reference: propose token 0, which the verifier never has to accept there
        draft_ids = self.reference[rows.unsqueeze(1), positions.clamp(max=width - 1)]
        draft_ids = torch.where(positions < width, draft_ids, torch.zeros_like(draft_ids))
        wrong = self._wrong_mask(rows, positions)
        draft_ids = torch.where(wrong, (draft_ids + 1) % self.vocab_size, draft_ids)
        logits = torch.full((*draft_ids.shape, self.vocab_size), -10.0).scatter(-1, draft_ids.unsqueeze(-1), 10.0)
        return DraftProposal(draft_ids=draft_ids, draft_logits=logits, state=state)

    def _wrong_mask(self, rows: torch.LongTensor, positions: torch.LongTensor) -> torch.BoolTensor:
        if self.accuracy == "right":
            return torch.zeros_like(positions, dtype=torch.bool)
        if self.accuracy == "wrong":
            return torch.ones_like(positions, dtype=torch.bool)
        # a fixed hash of (row, position): deterministic, about half of the pairs
        return ((rows.unsqueeze(1) * 7919 + positions * 104729) % 11) < 5


class RandomDrafter(Drafter):
    """Proposes seeded random tokens: a drafter with no knowledge of the verifier."""

    def __init__(self, vocab_size: int, block_size: int = 4, seed: int = 0):
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.generator = torch.Generator().manual_seed(seed)

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states):
        return None

    def select_rows(self, state, rows):
        return state

    def propose(self, state, prefix_ids, prefix_lengths, block_size):
        draft_ids = torch.randint(0, self.vocab_size, (prefix_ids.shape[0], block_size), generator=self.generator)
        return DraftProposal(draft_ids=draft_ids, draft_logits=None, state=state)


class StateRecordingDrafter(OracleDrafter):
    """An oracle that also reads verifier states (`verifier_state_layers`) and records what the loop hands it."""

    def __init__(self, *args, layers=(0, -1), confidence=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.verifier_state_layers = list(layers)
        self.confidence = confidence
        self.recorded = []  # (source rows, prefix_ids, prefix_lengths, prefix_states) per call

    def propose(self, state, prefix_ids, prefix_lengths, block_size, prefix_states=None):
        self.recorded.append((state.clone(), prefix_ids.clone(), prefix_lengths.clone(), prefix_states))
        proposal = super().propose(state, prefix_ids, prefix_lengths, block_size)
        if self.confidence is not None:
            proposal.draft_confidence = self.confidence(state, prefix_lengths, block_size)
        return proposal


class ConfidentOracleDrafter(OracleDrafter):
    """An oracle that reports a fixed pseudo-random confidence per (row, position): 0.95, 0.5 or 0.1."""

    def propose(self, state, prefix_ids, prefix_lengths, block_size):
        proposal = super().propose(state, prefix_ids, prefix_lengths, block_size)
        positions = prefix_lengths.unsqueeze(1) + torch.arange(block_size).unsqueeze(0)
        level = (state.unsqueeze(1) * 31 + positions * 17) % 3
        proposal.draft_confidence = torch.tensor([0.95, 0.5, 0.1])[level]
        return proposal
