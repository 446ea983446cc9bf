"""Drafters with known behaviour, for tests and benchmarks: always right, always wrong, right part of the time, or
random.

They implement `specdec_hf.Drafter` by looking the continuation up in a reference (the verifier's own greedy output,
computed beforehand), so the decoding loop can be checked, and its own cost measured, independently of any trained
drafter (as transformers' tests of assisted decoding use assistants that are always right or always wrong).
"""

from __future__ import annotations

import torch

from .drafting import Drafter, DraftProposal

__all__ = ["OracleDrafter", "RandomDrafter"]


class OracleDrafter(Drafter):
    """Proposes `reference[row, len:len + k]`, corrupted at the positions `accuracy` selects.

    Args:
        reference (`torch.LongTensor` of shape `(batch_size, total_length)`): The verifier's greedy output.
        vocab_size (`int`): The verifier's vocabulary size.
        num_draft_tokens (`int`): Default k.
        accuracy (`str`): "right" (never corrupt), "wrong" (always corrupt) or "half" (corrupt a fixed
            pseudo-random half of the (row, position) pairs).
    """

    def __init__(
        self, reference: torch.LongTensor, vocab_size: int, num_draft_tokens: int = 4, accuracy: str = "right"
    ):
        self.reference = reference
        self.vocab_size = vocab_size
        self.num_draft_tokens = num_draft_tokens
        self.accuracy = accuracy
        self.calls = 0

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states) -> torch.LongTensor:
        """The state is the batch index of each active row: `(batch_size,)`."""
        return torch.arange(encoder_hidden_states.shape[0])

    def select_rows(self, state: torch.LongTensor, rows: torch.LongTensor) -> torch.LongTensor:
        """Keep the batch indices of `rows`."""
        return state.index_select(0, rows)

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None) -> DraftProposal:
        """The reference's next `num_draft_tokens` tokens after each row's prefix, with certain scores (±10)."""
        self.calls += 1
        rows = state
        width = self.reference.shape[1]
        positions = prefix_lengths.unsqueeze(1) + torch.arange(num_draft_tokens).unsqueeze(0)
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
    """Proposes seeded random tokens: a drafter with no knowledge of the verifier.

    Args:
        vocab_size (`int`): The verifier's vocabulary size.
        num_draft_tokens (`int`): Default k.
        seed (`int`): Seed of its own generator.
    """

    def __init__(self, vocab_size: int, num_draft_tokens: int = 4, seed: int = 0):
        self.vocab_size = vocab_size
        self.num_draft_tokens = num_draft_tokens
        self.generator = torch.Generator().manual_seed(seed)

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states) -> None:
        """No state."""
        return None

    def select_rows(self, state, rows):
        """No state to select from."""
        return state

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None) -> DraftProposal:
        """Uniformly random ids, without scores."""
        draft_ids = torch.randint(
            0, self.vocab_size, (prefix_ids.shape[0], num_draft_tokens), generator=self.generator
        )
        return DraftProposal(draft_ids=draft_ids, draft_logits=None, state=state)
