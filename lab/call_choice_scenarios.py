"""How `num_draft_tokens="auto"` chooses whole calls (drafting, or the loop's plain decoding) under load
bursts, noise, length-sorted inputs and real changes: the scenarios a rule for that choice must be checked against.

Each scenario is a sequence of calls, each with the time per step a plain and a drafting call would take at that
moment (a base cost per kind, times the machine's load, times per-call noise). A fake clock stands in for the
machine's: the schedule (`DraftLengthSchedule.drafts_this_call`, `start_*_call`, `observe_*_call`, as `generate()`
calls them, a new schedule per call sharing the process's measurements) is driven call by call, and each call costs
what its scenario says. Reported per scenario: the time paid over the time of always running the kind whose base
cost is lower (1.000 is the best a rule can do without knowing the future), and the calls of the other kind ("wrong
calls"). Scenarios with randomness run several seeds and report the mean and the worst. No model is run: seconds.

    python -m lab.call_choice_scenarios
    python -m lab.call_choice_scenarios --compare /tmp/draft_length_candidate.py

`--compare` loads another version of `specdec_hf/generation/draft_length.py` from a file and prints it beside the
package's (a candidate rule, or an older revision: `git show <rev>:specdec_hf/generation/draft_length.py`); from
2026-12-05 the call choice lives in `call_choice.py` beside it, which the file imports from its own folder
(`load_module`).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import random
import statistics
import sys
import types
from dataclasses import dataclass

import torch

from specdec_hf.generation import draft_length

CPU = torch.device("cpu")
# greedy's time over k=3's per row on the main job's 100 rows in its order (longest source first: the first rows are
# the hardest for the drafter), min of 3 interleaved repeats each (2-core AMD EPYC, 2 threads, the shipped pair in
# float32 on its chosen kernels; 2026-12-06, a throwaway script): what drafting is worth row by row at one row
MAIN_JOB_ROW_SPEED_UPS = (
    0.992, 0.853, 0.977, 1.459, 1.575, 1.198, 1.219, 1.535, 1.255, 1.214, 0.928, 1.297, 1.303, 1.303, 1.335, 0.945,
    1.459, 1.354, 1.404, 1.407, 0.977, 1.078, 1.248, 1.565, 1.059, 1.150, 1.339, 1.347, 0.868, 1.351, 1.348, 1.231,
    1.096, 0.912, 1.334, 1.692, 1.132, 0.967, 0.866, 1.440, 1.490, 2.008, 1.440, 1.620, 1.402, 1.429, 1.409, 1.150,
    1.542, 1.521, 1.405, 1.275, 1.131, 1.015, 0.844, 1.093, 1.139, 1.701, 1.842, 0.960, 1.158, 1.358, 1.386, 1.074,
    1.150, 1.308, 1.261, 1.122, 0.801, 1.565, 1.567, 1.091, 1.287, 1.365, 1.196, 1.127, 1.256, 1.065, 1.428, 1.496,
    1.602, 1.289, 1.390, 1.146, 1.083, 1.273, 1.246, 1.157, 1.586, 1.640, 1.374, 1.168, 1.639, 1.450, 1.091, 1.271,
    1.984, 1.815, 1.213, 1.194,
)  # fmt: skip
RULE = (1, 0.0, False)
STEPS = 10


@dataclass
class Call:
    """One call's time per step for each kind, and which kind is the faster at base cost (without load or noise)."""

    plain: float
    drafting: float
    drafting_faster: bool


class Key:
    """A weakly referable stand-in for a verifier or a drafter (the schedule keeps measurements per pair)."""


class FakeClock:
    """The schedule's clock: a reading returns the time spent so far on the scenario's calls."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def choose_calls(module, calls: list[Call], expected_first: str, widths: tuple[int, ...] = (16,)) -> tuple[float, int]:
    """Drive `module`'s schedule through `calls` (call i at batch width `widths[i % len(widths)]`, each width's cost
    table present and its acceptance counts expecting `expected_first`). Returns the cost ratio and the wrong calls."""
    clock = FakeClock()
    module._clock = clock
    module.clear_measurements()
    keys = (Key(), Key())
    seed = module.DraftLengthSchedule(keys[0], keys[1], 2, RULE, CPU)
    for width in widths:
        seed._tables[seed._table_key(width)] = module.IterationCostTable([1.0, 1.1, 1.2])
    seed.acceptance.update(2, [0] * 50 if expected_first == "plain" else [2] * 500)
    paid = best = 0.0
    wrong = 0
    for index, call in enumerate(calls):
        schedule = module.DraftLengthSchedule(keys[0], keys[1], 2, RULE, CPU)
        drafting = schedule.drafts_this_call(widths[index % len(widths)])
        step = call.drafting if drafting else call.plain
        if drafting:
            schedule.start_drafting_call()
            clock.now += step * STEPS
            schedule.observe_drafting_call(STEPS)
        else:
            schedule.start_plain_call()
            clock.now += step * STEPS
            schedule.observe_plain_call(STEPS)
        paid += step
        best += call.drafting if call.drafting_faster else call.plain
        wrong += drafting != call.drafting_faster
    return paid / best, wrong


def steady(n: int, drafting_over_plain: float, sigma: float, rng: random.Random, load: float = 1.0) -> list[Call]:
    """`n` calls at fixed base costs (plain 1), under `load`, each kind's time drawn log-normally (`sigma`)."""
    return [
        Call(
            load * math.exp(rng.gauss(0, sigma)),
            load * drafting_over_plain * math.exp(rng.gauss(0, sigma)),
            drafting_over_plain < 1,
        )
        for _ in range(n)
    ]


def skewed(n: int, usual: float, slow: float, slow_share: float, sigma: float, rng: random.Random) -> list[Call]:
    """`n` calls (plain 1) whose drafting calls take `usual` per step, or `slow` for a `slow_share` of them (calls
    whose drafts are mostly rejected), each kind's time also drawn log-normally (`sigma`)."""
    mean = (1 - slow_share) * usual + slow_share * slow
    return [
        Call(
            math.exp(rng.gauss(0, sigma)),
            (slow if rng.random() < slow_share else usual) * math.exp(rng.gauss(0, sigma)),
            mean < 1,
        )
        for _ in range(n)
    ]


def scenarios() -> list[tuple[str, str, int, object]]:
    """(name, the kind the table expects first, seeds, `make(rng) -> (calls, widths)`) per scenario."""
    found = []

    def add(name, expected_first, seeds, make):
        found.append((name, expected_first, seeds, make))

    for sigma in (0.1, 0.3, 0.5, 0.7):
        for ratio in (0.85, 1.4):
            expected = "drafting" if ratio < 1 else "plain"
            add(f"noise σ {sigma}, drafting {ratio}", expected, 4, lambda r, s=sigma, q=ratio: steady(2000, q, s, r))
    for ratio in (0.97, 1.03):
        add(f"near parity σ 0.3, drafting {ratio}", "drafting", 4, lambda r, q=ratio: steady(2000, q, 0.3, r))
    for usual, slow, share in ((0.9, 1.6, 0.2), (0.85, 2.5, 0.15)):
        mean = (1 - share) * usual + share * slow
        for expected in ("plain", "drafting"):
            add(
                f"drafting {usual}, {slow} in {share:.0%} of calls (mean {mean:.2f}), σ 0.1, {expected} first",
                expected,
                4,
                lambda r, u=usual, s=slow, q=share: skewed(2000, u, s, q, 0.1, r),
            )
    for length in (2, 3, 4, 15):
        for ratio in (1.4, 0.8):
            expected = "drafting" if ratio < 1 else "plain"

            def burst(r, q=ratio, n=length):
                return steady(40, q, 0.0, r) + steady(n, q, 0.0, r, load=10.0) + steady(300, q, 0.0, r)

            add(f"one tenfold burst of {length} calls, drafting {ratio}", expected, 1, burst)
    for mean_length, loaded_share in ((4, 0.1), (10, 0.1), (30, 0.2)):
        for ratio in (1.4, 0.8):
            expected = "drafting" if ratio < 1 else "plain"

            def repeated(r, q=ratio, m=mean_length, share=loaded_share):
                calls, loaded = [], False
                end = 1 / m
                start = end * share / (1 - share)
                for _ in range(3000):
                    loaded = (r.random() > end) if loaded else (r.random() < start)
                    calls += steady(1, q, 0.0, r, load=r.uniform(3, 10) if loaded else 1.0)
                return calls

            add(f"random bursts (mean {mean_length} calls, 3-10x), drafting {ratio}", expected, 8, repeated)

    for ratio in (1.4, 0.8):
        expected = "drafting" if ratio < 1 else "plain"

        def erratic(r, q=ratio):
            calls = steady(100, q, 0.1, r)
            calls += [c for _ in range(30) for c in steady(1, q, 0.7, r, load=r.uniform(3, 10))]
            return calls + steady(300, q, 0.1, r)

        add(f"one erratic burst of 30 calls (3-10x, σ 0.7), drafting {ratio}", expected, 8, erratic)

    for calls in (30, 100):
        # a batch width that takes one call a pass (the remainder batch of a pass over rows sorted by length)
        add(
            f"a width's first {calls} calls, the table expecting drafting, drafting 1.25",
            "drafting",
            4,
            lambda r, n=calls: steady(n, 1.25, 0.1, r),
        )

    for ratio in (0.8, 1.25):
        # one row (batch 1), the table's acceptance counts from the process's first rows: the main job's first, its
        # longest and hardest, made it expect plain calls while drafting ones ran 0.8 times their time per step
        for calls in (40, 100):
            add(
                f"one row's first {calls} calls, the table expecting plain, drafting {ratio}",
                "plain",
                4,
                lambda r, n=calls, q=ratio: (steady(n, q, 0.1, r), (1,)),
            )

    for calls in (1000, 3000):
        # one row, a drafter that never pays (the untrained drafter, the summarization pair's): what its probes cost
        add(
            f"one row, {calls} calls, the table expecting plain, drafting 1.25",
            "plain",
            4,
            lambda r, n=calls: (steady(n, 1.25, 0.1, r), (1,)),
        )

    for hard, calls in ((12, 400), (100, 1000), (250, 1000)):
        # one row: the first rows hard for the drafter (drafting 1.35 times a plain step), then drafting pays; the
        # longer hard stretches show what a longer one-row probe interval costs (it finds the change later)
        add(
            f"one row, the first {hard} rows hard (drafting 1.35), then drafting 0.8",
            "plain",
            4,
            lambda r, n=hard, m=calls: (steady(n, 1.35, 0.1, r) + steady(m - n, 0.8, 0.1, r), (1,)),
        )

    def main_job_rows(r):
        # 4 passes (the instrumented one and 3 timed repeats) over the main job's rows in its order
        calls = []
        for _ in range(4):
            for speed_up in MAIN_JOB_ROW_SPEED_UPS:
                noise = math.exp(r.gauss(0, 0.1)), math.exp(r.gauss(0, 0.1))
                calls.append(Call(noise[0], noise[1] / speed_up, speed_up > 1))
        return calls, (1,)

    for expected in ("plain", "drafting"):
        add(f"the main job's rows at one row, 4 passes, the table expecting {expected}", expected, 8, main_job_rows)

    def widths(r):
        calls = steady(80, 1.4, 0.1, r) + steady(15, 1.4, 0.1, r, load=10.0) + steady(600, 1.4, 0.1, r)
        return calls, (16, 8, 4, 2)

    add("four batch widths in turn, one tenfold burst of 15 calls, drafting 1.4", "plain", 4, widths)
    for spread in (1.5, 3.0):
        for order in ("ascending", "descending"):
            for ratio in (0.9, 1.1):
                expected = "plain" if ratio < 1 else "drafting"  # the table expects the slower kind first

                def sorted_passes(r, q=ratio, s=spread, o=order):
                    growth = [s ** (position / 5) for position in range(6)]
                    if o == "descending":
                        growth.reverse()
                    return [c for _ in range(300) for g in growth for c in steady(1, q, 0.3, r, load=g)]

                add(
                    f"length-sorted passes of 6 ({order}, {spread}x), σ 0.3, drafting {ratio}",
                    expected,
                    4,
                    sorted_passes,
                )
    for after in (1.4, 2.5):

        def lasting(r, q=after):
            return steady(1000, 0.8, 0.1, r) + steady(1500, q, 0.1, r)

        add(f"drafting 0.8 then {after} for good", "drafting", 4, lasting)

    def cheaper(r):
        return steady(1000, 1.4, 0.1, r) + steady(1500, 0.8, 0.1, r)

    add("drafting 1.4 then 0.8 for good", "plain", 4, cheaper)

    def drift(r):
        return [c for i in range(2000) for c in steady(1, 0.8 + 0.6 * i / 1999, 0.1, r)]

    add("drafting drifting from 0.8 to 1.4", "drafting", 4, drift)
    return found


def load_module(path: str):
    """A draft_length.py from `path`, as a module of its own (its measurements apart from the package's).

    The file is loaded as a module of a package of its own whose folder is the file's: a revision that split the
    rule over several files (`call_choice.py` beside it since 2026-12-05) imports them from that folder, so write
    them there, e.g. `git show <rev>:specdec_hf/generation/call_choice.py > /tmp/rule/call_choice.py`.
    """
    package_name = "specdec_hf.generation_compared"
    for loaded in [name for name in sys.modules if name == package_name or name.startswith(package_name + ".")]:
        del sys.modules[loaded]  # another folder's modules, from an earlier load in this process
    package = types.ModuleType(package_name)
    package.__path__ = [os.path.dirname(os.path.abspath(path))]
    sys.modules[package_name] = package
    name = f"{package_name}.draft_length"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", help="Another draft_length.py (its call_choice.py beside it), printed beside.")
    args = parser.parse_args()
    rules = {"package": draft_length}
    if args.compare:
        rules["compared"] = load_module(args.compare)
    header = " | ".join(f"{name}: cost (worst), wrong calls" for name in rules)
    print(f"| scenario | {header} |")
    print("|---|" + "---|" * len(rules))
    for name, expected_first, seeds, make in scenarios():
        cells = []
        for module in rules.values():
            costs, wrongs = [], []
            for seed in range(seeds):
                made = make(random.Random(seed))
                calls, widths = made if isinstance(made, tuple) else (made, (16,))
                cost, wrong = choose_calls(module, calls, expected_first, widths)
                costs.append(cost)
                wrongs.append(wrong)
            worst = f" ({max(costs):.3f})" if seeds > 1 else ""
            cells.append(f"{statistics.fmean(costs):.3f}{worst}, {statistics.fmean(wrongs):.0f} of {len(calls)}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
