"""A base for drafters that wrap another one (timing it, overriding its drafts) and forward its attributes."""

from __future__ import annotations

from ..drafting import Drafter
from .spec_drafter_adapter import as_drafter

__all__ = ["WrappingDrafter"]


class WrappingDrafter(Drafter):
    """
    Forwards the drafting contract's attributes to the wrapped drafter; subclasses implement the three methods.

    Args:
        drafter (`Drafter` or `SpecDrafterModel`): The wrapped drafter (a model is wrapped in its adapter).

    A subclass that hands on the wrapped drafter's proposals unchanged (a timer) sets `passes_proposals_through`, so
    that what is learnt of its drafts (`num_draft_tokens="auto"`'s acceptance counts) is the wrapped drafter's.
    """

    passes_proposals_through: bool = False

    def __init__(self, drafter):
        self.drafter = as_drafter(drafter)

    @property
    def vocab_size(self) -> int:
        return self.drafter.vocab_size

    @property
    def num_draft_tokens(self) -> int | str:
        return self.drafter.num_draft_tokens

    @property
    def max_draft_tokens(self) -> int | None:
        """The wrapped drafter's limit on k (`None`: none), so that `generate()` checks `num_draft_tokens` against
        it."""
        return getattr(self.drafter, "max_draft_tokens", None)

    @property
    def max_positions(self) -> int | None:
        """The wrapped drafter's position limit (`None`: none), so that the loop drafts within it."""
        return getattr(self.drafter, "max_positions", None)

    @property
    def verifier_state_layers(self) -> list[int] | None:
        """The wrapped drafter's; the loop hands `propose` the verifier's states only when it is set."""
        return getattr(self.drafter, "verifier_state_layers", None)
