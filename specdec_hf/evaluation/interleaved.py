"""Interleaved timing: every strategy timed on the same group of inputs back to back, in a rotating order.

Why: a machine's speed drifts over minutes (more so on a shared CPU), and timing each strategy in its own block of time
turns that drift into a difference between strategies. Here all strategies run on group g within moments of each
other; the order rotates (group g of repeat r starts with strategy (r + g) mod n, so each group is decoded in a
different order in every repeat and, with one group, the repeats take turns), so that no strategy always runs first (right after
another strategy's work) or last; and a speed-up is the ratio of two totals *of the same repeat*, so drift between
repeats cancels out of each ratio. The spread over repeats is reported with every median.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .progress import progress_bar
from .timing import median, timed

__all__ = [
    "format_spread",
    "interleave",
    "paired_speedups",
    "rotation",
    "spread",
    "time_interleaved",
    "timing_summary",
]


def rotation(names: Sequence[str], step: int) -> list[str]:
    """The order in which `names` run at `step`: from `names[step % len(names)]` on, cyclically.

    Example: `rotation(["a", "b", "c"], 4) == ["b", "c", "a"]`.
    """
    start = step % len(names)
    return [*names[start:], *names[:start]]


def interleave(
    measures: Mapping[str, Callable[[int], float]],
    num_groups: int,
    repeats: int,
    desc: str = "interleaved timing",
    disable_tqdm: bool = False,
) -> dict[str, list[float]]:
    """Run every measurement on each group in a rotating order, and sum what each returns per repeat.

    Group `g` of repeat `r` calls the measures in `rotation(names, r + g)` order: every group starts with another
    strategy in each repeat (also when `num_groups` is a multiple of their number), and a single group rotates over
    the repeats.

    Args:
        measures (`Mapping[str, Callable[[int], float]]`): Name → `measure(group)`: does the work of group `group`
            (0 to `num_groups - 1`) and returns its seconds (measured by itself, so that it can leave set-up out).
        num_groups (`int`): Groups of inputs per repeat.
        repeats (`int`): Passes over all groups.
        desc (`str`): The progress bar's label.
        disable_tqdm (`bool`): Hide the progress bar.

    Returns:
        `dict[str, list[float]]`: per name (in the order of `measures`), one total per repeat.
    """
    if not measures or num_groups < 1 or repeats < 1:
        raise ValueError(
            f"interleaved timing needs measures, groups and repeats; got {len(measures)} measure(s), "
            f"{num_groups} group(s), {repeats} repeat(s)."
        )
    names = list(measures)
    totals = {name: [0.0] * repeats for name in names}
    for step in progress_bar(range(repeats * num_groups), desc, disable_tqdm):
        repeat, group = divmod(step, num_groups)
        for name in rotation(names, repeat + group):
            totals[name][repeat] += measures[name](group)
    return totals


def time_interleaved(
    runners: Mapping[str, Callable[[int], object]],
    num_groups: int,
    repeats: int,
    device: torch.device,
    desc: str = "interleaved timing",
    disable_tqdm: bool = False,
) -> dict[str, list[float]]:
    """`interleave` with each runner's wall time as its measure (synchronised on CUDA).

    Args:
        runners (`Mapping[str, Callable[[int], object]]`): Name → `run(group)`, the work of one strategy on a group.
        num_groups, repeats, desc, disable_tqdm: As in `interleave`.
        device (`torch.device`): Synchronised before and after each call.

    Returns:
        `dict[str, list[float]]`: per name, its wall time summed over the groups, one total per repeat.
    """
    measures = {name: (lambda group, run=run: timed(lambda: run(group), device)[0]) for name, run in runners.items()}
    return interleave(measures, num_groups, repeats, desc, disable_tqdm)


def paired_speedups(reference_times: Sequence[float], times: Sequence[float]) -> list[float]:
    """Per repeat r, `reference_times[r] / times[r]`: the speed-up within one repeat, where drift hit both alike."""
    return [reference / time for reference, time in zip(reference_times, times, strict=True)]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """`(median, min, max)` of `values`."""
    return median(values), min(values), max(values)


def timing_summary(times_s: Sequence[float], reference_times_s: Sequence[float] | None) -> dict[str, Any]:
    """The figures reported for one strategy's interleaved totals, and its speed-up over a reference.

    Args:
        times_s (`Sequence[float]`): The strategy's totals, one per repeat.
        reference_times_s (`Sequence[float]`, *optional*): The reference's totals of the same repeats; `None`: no
            reference was timed (speed-up fields `None`).

    Returns:
        `dict`: `time_s` (median), `time_s_min`, `time_s_max`, `times_s`, `speedup` (median of the paired ratios),
        `speedup_min`, `speedup_max` and `speedups` (the ratio of each repeat).
    """
    time_s, time_min, time_max = spread(times_s)
    summary: dict[str, Any] = {
        "time_s": time_s,
        "time_s_min": time_min,
        "time_s_max": time_max,
        "times_s": list(times_s),
    }
    if reference_times_s is None:
        return {**summary, "speedup": None, "speedup_min": None, "speedup_max": None, "speedups": None}
    speedups = paired_speedups(reference_times_s, times_s)
    speedup, speedup_min, speedup_max = spread(speedups)
    return {
        **summary,
        "speedup": speedup,
        "speedup_min": speedup_min,
        "speedup_max": speedup_max,
        "speedups": speedups,
    }


def format_spread(value: float, low: float, high: float, digits: int = 2, suffix: str = "") -> str:
    """`value` with its range, as the tables show it.

    Example: `format_spread(1.234, 1.18, 1.27, 2, "×") == "1.23× (1.18–1.27)"`.
    """
    return f"{value:.{digits}f}{suffix} ({low:.{digits}f}–{high:.{digits}f})"
