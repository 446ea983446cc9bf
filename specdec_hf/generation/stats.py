"""Decoding statistics of one speculative ``generate()`` call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["SpeculativeDecodingStats"]


@dataclass
class SpeculativeDecodingStats:
    """Counters filled by the speculative decoding loop, per row of the batch and in total.

    Args:
        num_draft_tokens (`int`): The requested number of drafted tokens per iteration (k; the largest k of
            `"auto"`, 0 for a call it decoded without drafting).
        verifier_calls (`int`): Batched verifier decoder forward passes.
        drafter_calls (`int`): Batched drafter calls.
        proposed_tokens (`int`): Drafts the drafter proposed, over all rows and calls (k per active row and call, or
            fewer where its proposal's `num_drafts` says so); with `draft_confidence_threshold` fewer of them are
            verified (`verified_tokens`).
        iterations (`list[int]`): Per row, the verifier passes the row took part in.
        generated_tokens (`list[int]`): Per row, tokens emitted (excluding the decoder prompt and the padding after
            the row finished).
        verified_tokens (`list[int]`): Per row, drafts that were verified (could be accepted).
        accepted_tokens (`list[int]`): Per row, drafts that were accepted.
        accepted_at_position (`list[int]`): For each draft position i (0-based), how many times the draft at i was
            accepted, summed over rows and iterations.
        verified_at_position (`list[int]`): For each draft position i, how many drafts at i were verified.
    """

    num_draft_tokens: int
    verifier_calls: int = 0
    drafter_calls: int = 0
    proposed_tokens: int = 0
    iterations: list[int] = field(default_factory=list)
    generated_tokens: list[int] = field(default_factory=list)
    verified_tokens: list[int] = field(default_factory=list)
    accepted_tokens: list[int] = field(default_factory=list)
    accepted_at_position: list[int] = field(default_factory=list)
    verified_at_position: list[int] = field(default_factory=list)

    @classmethod
    def for_batch(cls, batch_size: int, num_draft_tokens: int) -> SpeculativeDecodingStats:
        """Zeroed counters for `batch_size` rows and `num_draft_tokens` drafts per iteration."""
        return cls(
            num_draft_tokens=num_draft_tokens,
            iterations=[0] * batch_size,
            generated_tokens=[0] * batch_size,
            verified_tokens=[0] * batch_size,
            accepted_tokens=[0] * batch_size,
            accepted_at_position=[0] * num_draft_tokens,
            verified_at_position=[0] * num_draft_tokens,
        )

    def count_iteration(self, rows: list[int], generated: list[int], verified: list[int], accepted: list[int]) -> None:
        """Add one verifier pass of the rows `rows` (batch indices): per row, the tokens it emitted, the drafts it
        verified and the drafts it accepted."""
        self.verifier_calls += 1
        for local, row in enumerate(rows):
            self.iterations[row] += 1
            self.generated_tokens[row] += generated[local]
            self.verified_tokens[row] += verified[local]
            self.accepted_tokens[row] += accepted[local]
            for position in range(verified[local]):
                self.verified_at_position[position] += 1
            for position in range(accepted[local]):
                self.accepted_at_position[position] += 1

    @property
    def tokens_per_iteration(self) -> float:
        """Tok.: tokens emitted divided by verifier passes, over all rows (the paper's hardware-free speed figure)."""
        return sum(self.generated_tokens) / max(sum(self.iterations), 1)

    @property
    def tokens_per_iteration_per_row(self) -> list[float]:
        """Tok. of every row."""
        return [g / max(i, 1) for g, i in zip(self.generated_tokens, self.iterations, strict=True)]

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts divided by verified drafts, over all rows."""
        return sum(self.accepted_tokens) / max(sum(self.verified_tokens), 1)

    @property
    def verified_per_iteration(self) -> float:
        """Verified drafts per verifier pass, over all rows (the verification's width, bonus token excluded)."""
        return sum(self.verified_tokens) / max(sum(self.iterations), 1)

    def to_dict(self) -> dict:
        """All counters and the derived figures, JSON-serialisable."""
        return {
            **asdict(self),
            "tokens_per_iteration": self.tokens_per_iteration,
            "tokens_per_iteration_per_row": self.tokens_per_iteration_per_row,
            "acceptance_rate": self.acceptance_rate,
            "verified_per_iteration": self.verified_per_iteration,
        }
