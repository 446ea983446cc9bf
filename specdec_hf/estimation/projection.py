"""From measured costs to expected speed-ups: the arithmetic of draft-then-verify (pure functions).

A sentence of N new tokens costs greedy decoding `T_g` (measured). Speculative decoding pays a fixed cost F per
sentence (the encoder, the drafter's set-up) and N / Tok. iterations of `c(k) = verify(k) + drafter(k) + loop(k)`, so

    speed-up(Tok., k) = T_g / (F + N / Tok. * c(k)),

with `c(k)` and F measured once per shape and k and Tok. the acceptance a drafter reaches. (Xia et al., 2023, give
the same decomposition for the GPU; on a CPU the verification cost grows with k, hence one `c(k)` per k.)
"""

from __future__ import annotations

from .measurement import IterationCost

__all__ = ["cost_in_greedy_steps", "predicted_speedup"]


def predicted_speedup(
    greedy_s: float, cost: IterationCost, sentences: int, new_tokens: int, tokens_per_iteration: float
) -> float:
    """
    The expected speed-up of speculative over greedy decoding of the same sentences.

    Args:
        greedy_s (`float`): Greedy decoding's time for all the sentences.
        cost (`IterationCost`): The measured cost of an iteration at the k in question, and the fixed cost.
        sentences (`int`): Number of sentences (each pays the fixed cost once).
        new_tokens (`int`): Tokens generated over all sentences.
        tokens_per_iteration (`float`): Tok., in [1, k + 1].
    """
    if not 1.0 <= tokens_per_iteration <= cost.num_draft_tokens + 1 + 1e-9:
        raise ValueError(f"Tok. {tokens_per_iteration} is outside [1, k + 1] for k={cost.num_draft_tokens}")
    speculative_s = sentences * cost.fixed_s + new_tokens / tokens_per_iteration * cost.iteration_s
    return greedy_s / speculative_s


def cost_in_greedy_steps(cost: IterationCost, greedy_step_s: float) -> dict[str, float]:
    """An iteration's parts in units of one greedy step (greedy time per generated token)."""
    return {
        "verify": cost.verify_s / greedy_step_s,
        "drafter": cost.drafter_s / greedy_step_s,
        "loop": cost.loop_s / greedy_step_s,
        "iteration": cost.iteration_s / greedy_step_s,
    }
