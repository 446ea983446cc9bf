"""The estimator's run: for each verifier shape, measure the costs, project the speed-ups, check two of them directly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..evaluation.interleaved import paired_speedups, spread
from ..evaluation.timing import median
from ..linear_kernel_selection import kernel_choices_to_json
from .measurement import (
    IterationCost,
    MeasurementSettings,
    build_shape_models,
    measure_greedy_reference,
    measure_iteration_cost,
    speculative_run,
    time_direct_runs,
)
from .profile import AcceptanceProfile
from .projection import cost_in_greedy_steps, predicted_speedup
from .shapes import load_verifier_config

__all__ = ["estimate_shape"]


def estimate_shape(
    name: str,
    profile: AcceptanceProfile,
    num_draft_tokens_values: Sequence[int],
    tokens_grid: Sequence[float],
    settings: MeasurementSettings,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """
    Measure one verifier shape and project its speed-ups.

    Args:
        name (`str`): A built-in shape, a directory with `config.json` or a Hub id (`load_verifier_config`).
        profile (`AcceptanceProfile`): The drafter's expected acceptance.
        num_draft_tokens_values (`Sequence[int]`): The k to measure (each ≥ 1).
        tokens_grid (`Sequence[float]`): Tok. values at which to project the speed-up of every k (where ≤ k + 1).
        settings (`MeasurementSettings`): Inputs, repeats, device, dtype.
        log (`Callable[[str], None]`): Receives one line per finished stage.

    Returns:
        `dict` with the shape's figures: `parameters`, `greedy_ms_per_token`, `costs` (per k: the split in
        milliseconds and in greedy steps, the profile's Tok. and projected speed-up), `grid` (per k and Tok.), `best_k`,
        `curve_at_best_k` ((Tok., speed-up) points) and `validation` (the direct runs: measured and projected
        speed-up, Tok., outputs differing from greedy).
    """
    if not num_draft_tokens_values or min(num_draft_tokens_values) < 1:
        raise ValueError(f"every k must be at least 1, got {list(num_draft_tokens_values)}")
    config = load_verifier_config(name)
    models = build_shape_models(name, config, settings, max(num_draft_tokens_values))
    measure_greedy_reference(models, settings)
    # the first speculative call pays one-off costs (the drafter's first kernels, allocations): not a k's cost
    speculative_run(models, 0, profile, max(num_draft_tokens_values), settings)
    sentences, new_tokens = len(models.sources), models.new_tokens

    costs: dict[int, IterationCost] = {}
    mismatches = 0
    for num_draft_tokens in num_draft_tokens_values:
        costs[num_draft_tokens], wrong = measure_iteration_cost(models, profile, num_draft_tokens, settings)
        mismatches += wrong

    # the profile's expected Tok. per k (EOS and the length limit aside); the calibration runs' own is shown too
    expected = {k: profile.tokens_per_iteration(k) for k in num_draft_tokens_values}
    # the fastest k for the profile (greedy's time is a common factor: 1.0 stands for it)
    best_k = max(
        num_draft_tokens_values, key=lambda k: predicted_speedup(1.0, costs[k], sentences, new_tokens, expected[k])
    )
    largest_k = max(num_draft_tokens_values)
    direct = time_direct_runs(
        models, {"profile": (profile, best_k), "perfect": (AcceptanceProfile.perfect(), largest_k)}, settings
    )
    greedy_s = median(direct["greedy"]["times_s"])
    greedy_step_s = greedy_s / new_tokens
    log(f"{name}: greedy {1000 * greedy_step_s:.2f} ms/token, best k for the profile {best_k}")

    cost_rows = {}
    for num_draft_tokens, cost in costs.items():
        cost_rows[num_draft_tokens] = {
            "ms": {
                "verify": 1000 * cost.verify_s,
                "drafter": 1000 * cost.drafter_s,
                "loop": 1000 * cost.loop_s,
                "fixed_per_sentence": 1000 * cost.fixed_s,
            },
            "greedy_steps": cost_in_greedy_steps(cost, greedy_step_s),
            "profile_tokens_per_iteration": expected[num_draft_tokens],
            "calibration_tokens_per_iteration": cost.tokens_per_iteration,
            "profile_speedup": predicted_speedup(greedy_s, cost, sentences, new_tokens, expected[num_draft_tokens]),
        }
    grid = {
        num_draft_tokens: {
            str(tokens): predicted_speedup(greedy_s, cost, sentences, new_tokens, tokens)
            for tokens in (*tokens_grid, float(num_draft_tokens + 1))
            if tokens <= num_draft_tokens + 1
        }
        for num_draft_tokens, cost in costs.items()
    }
    best = costs[best_k]
    curve = [
        (tokens, predicted_speedup(greedy_s, best, sentences, new_tokens, tokens))
        for tokens in (1 + best_k * step / 100 for step in range(101))
    ]
    validation = {}
    for run, num_draft_tokens in (("profile", best_k), ("perfect", largest_k)):
        speedups = paired_speedups(direct["greedy"]["times_s"], direct[run]["times_s"])
        measured, low, high = spread(speedups)
        tokens = direct[run]["tokens_per_iteration"]
        projected = predicted_speedup(greedy_s, costs[num_draft_tokens], sentences, new_tokens, tokens)
        validation[run] = {
            "num_draft_tokens": num_draft_tokens,
            "tokens_per_iteration": tokens,
            "measured_speedup": measured,
            "measured_speedup_min": low,
            "measured_speedup_max": high,
            "projected_speedup": projected,
            "relative_error": projected / measured - 1.0,
            "mismatches": direct[run]["mismatches"],
        }
    return {
        "shape": name,
        "model_type": config.model_type,
        "parameters": models.parameters,
        "drafter_parameters": sum(p.numel() for p in models.drafter.parameters()),
        "sentences": sentences,
        "new_tokens": new_tokens,
        "greedy_ms_per_token": 1000 * greedy_step_s,
        "greedy_times_s": direct["greedy"]["times_s"],
        "costs": cost_rows,
        "grid": grid,
        "best_k": best_k,
        "curve_at_best_k": curve,
        "validation": validation,
        "calibration_mismatches": mismatches,
        "linear_kernels": kernel_choices_to_json(models.kernel_choices),
    }
