"""The interleaved timing scheme on fake strategies with known costs: call order, totals, paired speed-ups."""

from __future__ import annotations

import time

import pytest
import torch

from specdec_hf.evaluation.interleaved import (
    format_spread,
    interleave,
    paired_speedups,
    rotation,
    spread,
    time_interleaved,
    timing_summary,
)

CPU = torch.device("cpu")


def test_rotation_starts_with_strategy_step_mod_n():
    names = ["a", "b", "c"]
    assert [rotation(names, step) for step in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert rotation(["only"], 7) == ["only"]


def test_call_order_rotates_over_groups_and_repeats():
    calls = []

    def recorder(name):
        def measure(group):
            calls.append((name, group))
            return 0.0

        return measure

    interleave({name: recorder(name) for name in "abc"}, num_groups=3, repeats=2)
    assert calls == [
        ("a", 0), ("b", 0), ("c", 0),  # repeat 0, group 0: starts with strategy (0 + 0) mod 3
        ("b", 1), ("c", 1), ("a", 1),  # repeat 0, group 1
        ("c", 2), ("a", 2), ("b", 2),  # repeat 0, group 2
        ("b", 0), ("c", 0), ("a", 0),  # repeat 1, group 0: another order than in repeat 0, though 3 groups % 3 == 0
        ("c", 1), ("a", 1), ("b", 1),  # repeat 1, group 1
        ("a", 2), ("b", 2), ("c", 2),  # repeat 1, group 2
    ]  # fmt: skip


def test_a_single_group_rotates_over_the_repeats():
    first = []
    interleave({name: (lambda group, name=name: first.append(name) or 0.0) for name in "ab"}, 1, repeats=4)
    assert first[::2] == ["a", "b", "a", "b"]


def test_totals_sum_the_groups_of_each_repeat():
    calls_of_a = iter(range(1, 100))  # a's n-th call costs n: each repeat's total is its own calls' sum
    totals = interleave({"a": lambda group: next(calls_of_a), "b": lambda group: 10 * group}, num_groups=3, repeats=2)
    assert list(totals) == ["a", "b"]
    assert totals["a"] == [1 + 2 + 3, 4 + 5 + 6]
    assert totals["b"] == [0 + 10 + 20, 0 + 10 + 20]


@pytest.mark.parametrize("repeats", [1, 3])
def test_one_total_per_repeat(repeats):
    totals = time_interleaved({"x": lambda group: None, "y": lambda group: None}, 4, repeats, CPU)
    assert {name: len(values) for name, values in totals.items()} == {"x": repeats, "y": repeats}
    assert all(value > 0 for values in totals.values() for value in values)


@pytest.mark.parametrize("order", [("slow", "fast"), ("fast", "slow")])
def test_sleeping_strategies_give_the_paired_speed_up_of_their_costs(order):
    costs = {"slow": 0.002, "fast": 0.001}
    runners = {name: (lambda group, seconds=costs[name]: time.sleep(seconds)) for name in order}
    totals = time_interleaved(runners, num_groups=10, repeats=3, device=CPU)
    assert list(totals) == list(order)
    speedup, low, high = spread(paired_speedups(totals["slow"], totals["fast"]))
    assert 1.6 < speedup < 2.5  # sleeps overshoot by a fraction of a millisecond
    assert low <= speedup <= high


def test_paired_speedups_and_summary():
    reference = [2.0, 6.0, 4.0]  # the machine drifts between repeats; the ratio within each does not
    times = [1.0, 3.0, 1.0]
    assert paired_speedups(reference, times) == [2.0, 2.0, 4.0]
    summary = timing_summary(times, reference)
    assert (summary["time_s"], summary["time_s_min"], summary["time_s_max"]) == (1.0, 1.0, 3.0)
    assert (summary["speedup"], summary["speedup_min"], summary["speedup_max"]) == (2.0, 2.0, 4.0)
    assert summary["times_s"] == times and summary["speedups"] == [2.0, 2.0, 4.0]
    assert timing_summary(times, None)["speedup"] is None
    with pytest.raises(ValueError):
        paired_speedups(reference, times[:2])


def test_format_spread():
    assert format_spread(1.234, 1.18, 1.27, 2, "×") == "1.23× (1.18–1.27)"
    assert format_spread(0.5, 0.25, 1.0, 3) == "0.500 (0.250–1.000)"


def test_nothing_to_time_is_an_error():
    with pytest.raises(ValueError, match="0 group"):
        interleave({"a": lambda group: 0.0}, num_groups=0, repeats=1)
    with pytest.raises(ValueError, match="0 measure"):
        interleave({}, num_groups=1, repeats=1)
