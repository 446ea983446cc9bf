"""Acceptance profiles: how often a drafter's i-th draft is accepted, the one figure the estimator cannot measure.

A profile gives, for each draft position i (1-based), the probability `c_i` that draft i is accepted given that
drafts 1..i-1 were. The number of drafts accepted in an iteration is then `a` with `P(a >= i) = c_1 ... c_i`, and
tokens per iteration (Tok., the bonus or correction token included) at k drafts is `1 + sum_i<=k c_1 ... c_i`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["AcceptanceProfile"]


@dataclass(frozen=True)
class AcceptanceProfile:
    """
    Per-position conditional acceptance rates of a drafter.

    Args:
        rates (`tuple[float, ...]`): `c_i` for i = 1..len(rates), each in [0, 1]; positions past the end reuse the
            last rate.
        source (`str`): Where the profile came from (shown in reports).
    """

    rates: tuple[float, ...]
    source: str = "given"

    def __post_init__(self):
        if not self.rates:
            raise ValueError("an acceptance profile needs at least one rate")
        bad = [rate for rate in self.rates if not (isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0)]
        if bad:
            raise ValueError(f"acceptance rates are probabilities in [0, 1]; got {bad} in {list(self.rates)}")

    def rate(self, position: int) -> float:
        """`c_position` (1-based)."""
        return self.rates[min(position, len(self.rates)) - 1]

    def survival(self, num_draft_tokens: int) -> list[float]:
        """`P(a >= i)` for i = 1..num_draft_tokens."""
        values, running = [], 1.0
        for position in range(1, num_draft_tokens + 1):
            running *= self.rate(position)
            values.append(running)
        return values

    def tokens_per_iteration(self, num_draft_tokens: int) -> float:
        """Expected Tok. at `num_draft_tokens` drafts (EOS and length limits ignored)."""
        return 1.0 + sum(self.survival(num_draft_tokens))

    def draw_accepted(self, shape: tuple[int, ...], num_draft_tokens: int, seed: int) -> torch.LongTensor:
        """
        Accepted-draft counts drawn from the profile, reproducibly (the same `seed` gives the same draws).

        Returns:
            `torch.LongTensor` of `shape`, values in `[0, num_draft_tokens]`.
        """
        generator = torch.Generator().manual_seed(seed)
        uniform = torch.rand((*shape, num_draft_tokens), generator=generator)
        rates = torch.tensor([self.rate(i) for i in range(1, num_draft_tokens + 1)])
        # a = number of leading positions whose draw falls under their rate
        return torch.cumprod((uniform < rates).long(), dim=-1).sum(-1)

    @classmethod
    def perfect(cls) -> AcceptanceProfile:
        """Every draft right: Tok. = k + 1."""
        return cls((1.0,), source="perfect drafts")

    @classmethod
    def constant_for_tokens(cls, tokens_per_iteration: float, num_draft_tokens: int) -> AcceptanceProfile:
        """
        The constant-rate profile whose expected Tok. at `num_draft_tokens` drafts is `tokens_per_iteration`.

        Raises:
            ValueError: unless `1 <= tokens_per_iteration <= num_draft_tokens + 1`.
        """
        if not 1.0 <= tokens_per_iteration <= num_draft_tokens + 1:
            raise ValueError(
                f"Tok. {tokens_per_iteration} is impossible at k={num_draft_tokens}: an iteration emits between 1 and "
                f"k + 1 = {num_draft_tokens + 1} tokens."
            )
        low, high = 0.0, 1.0
        for _ in range(60):  # Tok. grows with the rate: bisect
            middle = (low + high) / 2
            if cls((middle,)).tokens_per_iteration(num_draft_tokens) < tokens_per_iteration:
                low = middle
            else:
                high = middle
        return cls((high,), source=f"constant rate {high:.3f} (Tok. {tokens_per_iteration:g} at k={num_draft_tokens})")

    @classmethod
    def from_counts(cls, accepted_at_position: list[int], verified_at_position: list[int], source: str):
        """
        From a speculative run's counters (`speculative_stats.accepted_at_position` / `verified_at_position`).

        Draft i is judged only in iterations that accepted drafts 1..i-1 and verified a draft at i (a row's length
        budget or a confidence threshold can stop verification earlier). The counters do not pair the two per
        iteration, so `c_i` is estimated as `accepted[i] / min(accepted[i-1], verified[i])`: exact when no iteration
        stopped short of k except by rejection or when the budget cut only iterations that accepted everything
        (the usual end of a sentence), an upper bound otherwise.
        """
        if len(accepted_at_position) != len(verified_at_position) or not verified_at_position:
            raise ValueError(f"{source}: accepted_at_position and verified_at_position must be non-empty and as long")
        if not verified_at_position[0]:
            raise ValueError(f"{source}: no draft was verified, so there is no acceptance to read")
        rates, reached = [], verified_at_position[0]
        for position, accepted in enumerate(accepted_at_position):
            if position > 0:
                reached = min(accepted_at_position[position - 1], verified_at_position[position])
            if reached == 0:
                break
            rates.append(min(accepted / reached, 1.0))
        return cls(tuple(rates), source=source)

    @classmethod
    def from_file(cls, path: str | Path, strategy: str | None = None) -> AcceptanceProfile:
        """
        Reads a profile from a JSON file: `speculative_stats` (`to_dict()`), or `evaluate.py`'s `results.json`
        (the speculative `strategy`, or its only one).

        Raises:
            ValueError: naming the file when it holds no acceptance counters.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--acceptance_from {path}: cannot read it as JSON ({error})") from None
        entries = data.get("strategies", {}).values()
        written = [data, *(entry.get("speculative") for entry in entries if isinstance(entry, dict))]
        if any(isinstance(counters, dict) and "drafted_at_position" in counters for counters in written):
            raise ValueError(
                f"--acceptance_from {path}: written by an earlier version of specdec_hf (`drafted_at_position`, now "
                "`verified_at_position`); run evaluate.py again to write it with this version's counters."
            )
        if "accepted_at_position" in data:
            return cls.from_counts(data["accepted_at_position"], data["verified_at_position"], str(path))
        strategies = {
            name: entry
            for name, entry in data.get("strategies", {}).items()
            if isinstance(entry, dict) and "accepted_at_position" in (entry.get("speculative") or {})
        }
        if strategy is not None:
            if strategy not in strategies:
                raise ValueError(
                    f"--acceptance_from {path}: no speculative strategy {strategy!r} in {sorted(strategies)}"
                )
            strategies = {strategy: strategies[strategy]}
        if len(strategies) != 1:
            raise ValueError(
                f"--acceptance_from {path}: expected speculative_stats or one speculative strategy with acceptance "
                f"counters, found {sorted(strategies) or 'none'} (name one with --acceptance_strategy)."
            )
        ((name, entry),) = strategies.items()
        stats = entry["speculative"]
        return cls.from_counts(stats["accepted_at_position"], stats["verified_at_position"], f"{path} ({name})")

    def describe(self, num_draft_tokens: int) -> str:
        """A short text: the rates and the expected Tok. at `num_draft_tokens`."""
        shown = ", ".join(f"{rate:.2f}" for rate in self.rates[:num_draft_tokens])
        return f"{self.source}: rates [{shown}], Tok. {self.tokens_per_iteration(num_draft_tokens):.2f} at k={num_draft_tokens}"
