"""Choosing the draft length k as decoding runs, k = 0 (a plain verifier step) included.

A fixed k is right on one machine and wrong on another: what verifying k drafts costs depends on the CPU or GPU, the
verifier's shape and the batch, and what the drafts are worth depends on the drafter and the text. Adaptive draft
lengths (SpecDec++, Huang et al., 2024, arXiv 2405.19715; DISCO, Mamou et al., 2024, arXiv 2405.04304) choose k per
iteration; this module chooses it from two measured things:

- **what an iteration costs** ([`IterationCostTable`]): a verifier forward over the uncached tokens and w drafts, timed
  once per process, drafter, verifier, batch width and device in the loop's own first iterations at that width (above
  one row, those of drafting calls run as probes among plain calls; [`ForwardCalibration`]: they run every w in turn,
  from 0 up, so that calibrating costs no forward beyond decoding's, and stop at the first w whose forward alone costs
  more than any k is expected to bring, until a rule expecting more tokens reopens them), plus what the loop pays around
  it, read from the iterations' own wall time as decoding runs: without a drafter call, and with one as a base and a
  cost per draft (the drafter's queries, the wider logits), the latter from pairs of consecutive iterations whose k
  differs by one (every few drafting iterations run a k next to the best one);
- **what the drafts are worth** ([`AcceptanceEstimate`]): how often the first i drafts were all accepted so far by
  this verifier and drafter under this rule (kept for the process, so that the next `generate()` starts informed).

Each iteration takes the k that maximises expected tokens per second, ``(1 + Σ_{i<k} P(first i+1 accepted)) /
cost(k)``, as last chosen (chosen again every few iterations of a call, and when its cost table or length limit
changes); k = 0 costs a verifier step without a drafter call (not taken in a call that the call choices below chose to
draft: the best k of at least 1 there). A calibrated forward alone is not enough: a draft more costs the loop more than
it costs the verifier's forward, and the forward's own differences between adjacent widths are within a timing's noise,
so without the measured cost per draft every draft looks free and the largest k wins. While k = 0 wins, drafting is
probed now and then at the best k ≥ 1, with growing intervals, so that a drafter whose drafts start to pay is found
again. The choice is a pure function of the costs and acceptance counts when it is made ([`choose_draft_length`]), the
neighbouring k then placed by the table's count of drafting iterations, so it is deterministic for given measurements;
it never looks at the drafts being verified, so β=1 stays exactly greedy and speculative sampling keeps its
distribution whatever k is chosen.

A whole call can skip drafting ([`DraftLengthSchedule.drafts_this_call`]): the loop then runs with no drafter, every
iteration a plain verifier step (greedy decoding's tokens; sampling's distribution, its seeded draws other than
transformers' once a row finishes, as a finished row draws nothing), feeding only the rows still decoding once some
finish (unless rows are kept aligned), where transformers' loop feeds them all. Which kind of call runs is chosen by the
calls' own timings (`specdec_hf.generation.call_choice`), and before three of each kind were timed by the cost table:
plain when even the best k is expected to give fewer tokens per second than a plain decoding step (until plain calls
were timed: for one row the verifier's forward alone, with none of the loop's costs around it; above one row plain,
until a plain call of that width was timed as one of its choices under any rule). Above one row, calls are plain until
the width's table is first calibrated, by drafting calls run among them as probes: a first call at a wide batch would
otherwise time forwards that each cost several plain steps on a CPU, where a plain call, feeding only the rows still
decoding, was as fast as greedy decoding or faster in every pass of plain calls measured (docs/RESULTS.md). Since the
measurements are the machine's, the sequence of k is not reproducible from run to run: a seeded sampling run draws other
numbers, and the relaxed rule (β > 1), whose output depends on k, can write another output. The measurements are per
process and not guarded by a lock: calls of `generate()` in parallel threads share them and time each other's load.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from ..auto_draft_length import AUTO
from ..device_sync import synchronize
from .call_choice import CallChoices, ChosenCall

__all__ = [
    "AUTO",
    "AcceptanceEstimate",
    "DraftLengthSchedule",
    "ForwardCalibration",
    "IterationCostTable",
    "choose_draft_length",
    "clear_measurements",
    "non_decreasing",
]

_Result = TypeVar("_Result")

# the clock of every timing here (a module attribute, so that tests can give a clock of their own)
_clock = time.perf_counter

# prior of P(first i+1 drafts accepted) before any iteration was seen: optimistic enough that a drafter is tried
_PRIOR_FIRST = 0.6
# weight of that prior, in iterations
_PRIOR_WEIGHT = 2.0
# timed forwards of each width before a cost table is used, after one untimed (the first forward of a shape pays
# one-off kernel set-up): the least of them stands for the width
_CALIBRATION_ROUNDS = 2
# above one row, plain calls of a width whose table was never complete before a drafting call runs as a probe that
# calibrates it; the interval doubles after a probe slower per step than the plain calls by more than
# `_CHEAP_PROBE_SLOWDOWN`, up to the largest, and drops to none (the next call probes) after one that was not
# (docs/RESULTS.md: probes at 2 and 4 rows ran at 0.92-1.04 times a plain call's time per step, at 16 rows 1.56)
_FIRST_CALIBRATION_PROBE_INTERVAL = 2
_MAX_CALIBRATION_PROBE_INTERVAL = 32
_CHEAP_PROBE_SLOWDOWN = 1.25
# drafting calls in a row of a batch width that timed none of its table's forwards (their rows finished at their
# first iteration, into a narrower width; above one row, probes among plain calls) before that width's calls are
# chosen by their own timings alone
_MAX_IDLE_CALLS = 3
# iterations at k = 0 before the first probe of drafting; the interval doubles after a probe that did not pay
_FIRST_PROBE_INTERVAL = 8
_MAX_PROBE_INTERVAL = 128
# iterations of each kind (plain; drafting, with their k) whose time is remembered: 32 readings each (the rarer kind's
# reach further back in time, to the cheaper iterations of shorter caches)
_RECENT_ITERATIONS = 32
# cost-per-draft readings (pairs of consecutive iterations one draft apart) kept for their median, and how many it
# takes before the median is trusted over the forward's own cost per draft
_RECENT_PER_DRAFT = 256
_MIN_PER_DRAFT_READINGS = 5
# every this-many-th drafting iteration runs a k one above or below the best one (alternately), so that what one
# draft more or less costs stays measured; once a table has seen `_NEIGHBOUR_WARM_UP` drafting iterations (32
# neighbours, up to 64 readings) only every `_SETTLED_NEIGHBOUR_INTERVAL`-th: a neighbour is a k worse than the best,
# and one in five iterations at it costs a run a measurable share of its speed (the readings then come four times
# slower: a step the best k moves to is costed at the median of all steps until it has five of its own)
_NEIGHBOUR_INTERVAL = 5
_NEIGHBOUR_WARM_UP = 160
_SETTLED_NEIGHBOUR_INTERVAL = 20
# iterations of a call that take the k last chosen before it is chosen again from the measurements (at once when the
# cost table, a batch-width bucket, or the largest k allowed, `min(limit, max_draft_tokens)`, changes)
_RECHOOSE_INTERVAL = 4


def choose_draft_length(
    iteration_seconds: Sequence[float], acceptance: Sequence[float], drafting: bool = False
) -> int:
    """The draft length with the most expected tokens per second.

    Args:
        iteration_seconds (`Sequence[float]`): `iteration_seconds[k]`, what an iteration verifying k drafts costs in
            all (k = 0: a plain step, no drafter call); its length bounds k.
        acceptance (`Sequence[float]`): `acceptance[i]`, the probability that the first i + 1 drafts are all
            accepted; at least `len(iteration_seconds) - 1` entries.
        drafting (`bool`, *optional*, defaults to `False`): Choose among k ≥ 1 only (the k a probe of drafting runs
            at).

    Returns:
        `int`: k in `[0, len(iteration_seconds) - 1]`; the smallest of equally good ones.
    """
    best_k, best_rate = 0, 0.0 if drafting else 1.0 / iteration_seconds[0]
    expected = 1.0
    for k in range(1, len(iteration_seconds)):
        expected += acceptance[k - 1]
        rate = expected / iteration_seconds[k]
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


@dataclass
class AcceptanceEstimate:
    """Running counts of how far drafts were accepted, per draft position, with a prior for positions not yet seen.

    Args:
        verified (`list[int]`): `verified[i]`, iterations of a row in which draft i was asked for.
        accepted (`list[int]`): `accepted[i]`, those in which drafts 0..i were all accepted.
    """

    verified: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def update(self, scheduled: int, accepted: Sequence[int]) -> None:
        """Count one iteration: `scheduled` drafts asked of every row, and how many of them each row accepted (a
        draft the drafter declined to propose counts as a rejected one: it brought no token)."""
        if scheduled > len(self.verified):
            self.verified.extend([0] * (scheduled - len(self.verified)))
            self.accepted.extend([0] * (scheduled - len(self.accepted)))
        for position in range(scheduled):
            self.verified[position] += len(accepted)
        for row_accepted in accepted:
            for position in range(row_accepted):
                self.accepted[position] += 1

    def tokens_upper_bound(self, length: int) -> float:
        """The most tokens an iteration of any k up to `length` is expected to bring by these estimates:
        `1 + Σ P(first i + 1 accepted)` over `length` drafts, each position not verified yet taken at the estimate of
        the last one that was (P(first i + 1 accepted) cannot grow with i), every draft at 1 before any was verified.
        (The estimates are smoothed towards the prior: with few counts they may lie below the true rates; the bound
        grows as counts come, and a table's calibration stopped under a lower one is reopened.)"""
        probabilities = self.probabilities(length)
        verified = self.verified[:length]
        measured = verified.index(0) if 0 in verified else len(verified)  # the positions verified, from the first
        last = probabilities[measured - 1] if measured else 1.0
        return 1.0 + sum(probabilities[:measured]) + (length - measured) * last

    def probabilities(self, length: int) -> list[float]:
        """P(first i + 1 drafts all accepted) for i < `length`: the counts smoothed towards a geometric prior, made
        non-increasing in i (accepting i + 2 drafts needs the first i + 1)."""
        probabilities = []
        previous = 1.0
        for position in range(length):
            prior = _PRIOR_FIRST ** (position + 1)
            verified = self.verified[position] if position < len(self.verified) else 0
            accepted = self.accepted[position] if position < len(self.accepted) else 0
            estimate = (accepted + _PRIOR_WEIGHT * prior) / (verified + _PRIOR_WEIGHT)
            previous = min(previous, estimate)
            probabilities.append(previous)
        return probabilities


@dataclass
class ForwardCalibration:
    """The verifier forward's time per number of drafts w, read from the loop's own iterations while a cost table is
    made: each w runs `1 + _CALIBRATION_ROUNDS` times, the first untimed (a shape's first forward pays one-off kernel
    set-up), and the least of the timed ones stands for w (a timing is only ever slowed by what else runs).

    The widths are taken from 0 up (`record`): w + 1 joins once every w up to the frontier was timed and w's forward
    leaves the k from w up a chance to pay; the first w whose forward leaves them none ends the calibration there
    (`cap`), so that wide batches, where each draft widens a forward of many rows, do not time wider forwards that
    can only lose. Whether they can pay is judged by the most tokens an iteration is expected to bring, which rests on
    the acceptance counts of the rule that timed the table: a rule expecting more later opens the calibration again
    (`reopen`).

    Args:
        seen (`list[int]`): Per w (0..max k), the iterations that chose it whose forward was counted, the untimed
            first included.
        least (`list[float]`): Per w, the least timed forward (`inf` until one).
        idle_calls (`int`): Drafting calls in a row that started at this width while it was calibrated and after
            which no forward more was counted than after the one before (`DraftLengthSchedule.drafts_this_call`).
        seen_after_last_call (`int`): The forwards counted, all w together, after the last such call.
        frontier (`int`): The widest w run so far or next; the wider ones wait.
        cap (`int`, *optional*): The first w whose forward left no k from it up a chance to pay (timed, and the
            widest w the calibration times); `None` while every w may still be.
        reopened (`bool`): Whether the calibration was opened again above its cap (`reopen`).
        plain_calls_since_probe (`int`), probe_interval (`int`): Above one row, calls decode plainly while the table
            is first calibrated, and a drafting call runs as a probe that calibrates it after `probe_interval` plain
            ones (`probe_due`; 0: every call, after a cheap probe, `record_probe`); kept here, for the width, whatever
            the rule of each call.
        plain_call_steps (`deque[float]`): Those plain calls' times per step, what a probe's is judged against (not
            the width's call choices': they are the calls of its first moments, the shortest rows where rows are
            sorted by length, whose set-up weighs most per step).
    """

    seen: list[int]
    least: list[float]
    idle_calls: int = 0
    seen_after_last_call: int = 0
    frontier: int = 1
    cap: int | None = None
    reopened: bool = False
    plain_calls_since_probe: int = 0
    probe_interval: int = _FIRST_CALIBRATION_PROBE_INTERVAL
    plain_call_steps: deque = field(default_factory=lambda: deque(maxlen=_RECENT_ITERATIONS))

    @classmethod
    def for_widths(cls, widths: int) -> ForwardCalibration:
        """Nothing timed yet for w = 0..`widths` - 1."""
        return cls([0] * widths, [math.inf] * widths)

    def probe_due(self) -> bool:
        """Whether a call of this width, above one row, drafts as a probe that calibrates the table (after
        `probe_interval` plain calls since the last one), and count it."""
        if self.plain_calls_since_probe >= self.probe_interval:
            self.plain_calls_since_probe = 0
            return True
        self.plain_calls_since_probe += 1
        return False

    def record_probe(self, step_seconds: float) -> None:
        """Take a probe's time per step against the mean of `plain_call_steps` (nothing to judge by before one):
        after a probe slower by more than `_CHEAP_PROBE_SLOWDOWN` times (at a wide batch on a CPU a call timing the
        wide forwards costs as much as several plain ones) the next comes after twice as many plain calls (at least
        `_FIRST_CALIBRATION_PROBE_INTERVAL`); after one that was not, at once (calibrating then costs about what
        plain calls do, and where drafting pays it is the sooner done)."""
        if not self.plain_call_steps:
            return
        if step_seconds > _CHEAP_PROBE_SLOWDOWN * statistics.fmean(self.plain_call_steps):
            doubled = max(2 * self.probe_interval, _FIRST_CALIBRATION_PROBE_INTERVAL)
            self.probe_interval = min(doubled, _MAX_CALIBRATION_PROBE_INTERVAL)
        else:
            self.probe_interval = 0

    def count_call(self) -> None:
        """Count a drafting call that started at this width: idle if no forward was counted since the last one."""
        seen = sum(self.seen)
        self.idle_calls = self.idle_calls + 1 if seen == self.seen_after_last_call else 0
        self.seen_after_last_call = seen

    def complete_widths(self) -> int:
        """How many w, from 0 up, ran all their forwards."""
        count = 0
        for seen in self.seen:
            if seen <= _CALIBRATION_ROUNDS:
                break
            count += 1
        return count

    def widths_to_time(self) -> int:
        """How many w, from 0 up, the calibration times: up to the `cap` once one is set, else every w."""
        return len(self.seen) if self.cap is None else self.cap + 1

    def may_pay(self, width: int, plain_seconds: float | None, tokens_bound: float) -> bool:
        """Whether some k ≥ `width` may beat a plain step by `width`'s least forward.

        An iteration of such a k costs at least that forward plus the loop's own work of a plain iteration
        (`plain_seconds` less the plain forward; `None`: the plain forward, no work around it), and brings at most
        `tokens_bound` tokens (the most an iteration is expected to bring, [`AcceptanceEstimate.tokens_upper_bound`]):
        it can beat `tokens_bound` plain iterations only where the forward is below `(tokens_bound - 1) *
        plain_seconds` plus the plain forward."""
        if tokens_bound == math.inf:  # no bound: every width may
            return True
        plain_seconds = self.least[0] if plain_seconds is None else plain_seconds
        return self.least[width] < (tokens_bound - 1.0) * plain_seconds + self.least[0]

    def _advance(self, plain_seconds: float | None, tokens_bound: float) -> None:
        """Let the next w join while the frontier's may pay (`may_pay`), once each w up to it was timed; set the
        frontier as the `cap` where it may not, but only after all its forwards (one slow reading must not end the
        calibration)."""
        while self.cap is None and self.frontier < len(self.seen) - 1:
            frontier = self.frontier
            if any(seen < 2 for seen in self.seen[: frontier + 1]):  # each w up to it timed once
                return
            if self.may_pay(frontier, plain_seconds, tokens_bound):
                self.frontier += 1
            elif self.seen[frontier] > _CALIBRATION_ROUNDS:
                self.cap = frontier
            else:
                return

    def reopen(self, plain_seconds: float | None, tokens_bound: float) -> bool:
        """Drop the `cap` where its width may pay by `tokens_bound` after all (a rule whose drafts are accepted further
        than those of the rule that timed it), and let the next w join; returns whether it did. `plain_seconds` as
        for `record`."""
        if self.cap is None or not self.may_pay(self.cap, plain_seconds, tokens_bound):
            return False
        self.cap, self.reopened = None, True
        # calls that found it complete timed nothing of it: not idle ones (`count_call`)
        self.idle_calls, self.seen_after_last_call = 0, sum(self.seen)
        self._advance(plain_seconds, tokens_bound)
        return True

    def next_width(self, largest: int) -> int:
        """The w the next iteration runs at, among 0..`largest` up to the frontier and not complete: round by round
        (the fewest forwards first), alternately from the narrowest and from the widest. (A w that joins later runs
        its forwards at longer caches than the narrower ones ran theirs; the least of each is kept, and at these short
        caches a forward's cost is its layers', which the cache barely changes.)"""
        top = min(largest, self.frontier)
        candidates = [width for width in range(top + 1) if self.seen[width] <= _CALIBRATION_ROUNDS]
        fewest = min(self.seen[width] for width in candidates)
        this_round = [width for width in candidates if self.seen[width] == fewest]
        return this_round[0] if fewest % 2 == 0 else this_round[-1]

    def record(
        self, width: int, seconds: float, plain_seconds: float | None = None, tokens_bound: float = math.inf
    ) -> None:
        """Count one forward at `width` that took `seconds` (not timed if it is the width's first), and move the
        frontier or set the cap by what a plain iteration costs (`plain_seconds`; by default the plain forward) and
        the most tokens an iteration is expected to bring (`tokens_bound`; by default no bound: every w is timed)."""
        if self.seen[width]:
            self.least[width] = min(self.least[width], seconds)
        self.seen[width] += 1
        self._advance(plain_seconds, tokens_bound)


@dataclass
class IterationCostTable:
    """What one iteration costs for one batch width, in seconds.

    Args:
        verify_seconds (`list[float]`): The verifier forward's time when w drafts are chosen, w = 0..max k or up
            to the calibration's cap (a drafter may propose fewer: what choosing w costs); while the table is
            calibrated, for the w from 0 up whose forwards were all timed (`observe_forward`).
        calibration ([`ForwardCalibration`], *optional*): The forwards timed so far while the table is calibrated;
            `None` once every w up to its cap was (or where `verify_seconds` was given whole).
        stopped_calibration ([`ForwardCalibration`], *optional*): The calibration that ended at its cap, kept for
            `reopen_calibration`.
        plain_recent (`deque[float]`): The latest plain iterations' (k = 0) times.
        drafting_recent (`deque[tuple[int, float]]`): The latest drafting iterations' k (the k chosen: a drafter's
            `num_drafts` or the confidence threshold may verify fewer) and time (the drafter's call included).
        per_draft_recent (`deque[tuple[int, float]]`): Readings of what one draft more costs an iteration: the
            smaller k of two consecutive drafting iterations whose k differs by one (the step from it to the next),
            and the difference in their times per draft.
        drafting_iterations (`int`): Drafting iterations chosen with this table, across calls (every
            `_NEIGHBOUR_INTERVAL`-th runs a neighbouring k, every `_SETTLED_NEIGHBOUR_INTERVAL`-th after
            `_NEIGHBOUR_WARM_UP`).
    """

    verify_seconds: list[float]
    calibration: ForwardCalibration | None = None
    stopped_calibration: ForwardCalibration | None = None
    plain_recent: deque = field(default_factory=lambda: deque(maxlen=_RECENT_ITERATIONS))
    drafting_recent: deque = field(default_factory=lambda: deque(maxlen=_RECENT_ITERATIONS))
    per_draft_recent: deque = field(default_factory=lambda: deque(maxlen=_RECENT_PER_DRAFT))
    drafting_iterations: int = 0
    # `step_costs`' last result and what it was computed from: (width, count of readings, the newest reading object);
    # readings are only appended, so these change whenever the result may
    _step_costs_memo: tuple | None = field(default=None, repr=False, compare=False)

    @classmethod
    def uncalibrated(cls, largest_k: int) -> IterationCostTable:
        """A table for k = 0..`largest_k` with nothing measured: its forwards are timed as the loop runs."""
        return cls([], ForwardCalibration.for_widths(largest_k + 1))

    @property
    def largest_k(self) -> int:
        """The largest k the table is for: its calibration's widest (the cap once it is set)."""
        if self.calibration is not None:
            return self.calibration.widths_to_time() - 1
        return len(self.verify_seconds) - 1

    def plain_seconds(self) -> float | None:
        """What a plain iteration costs by the recent ones (their lower quartile); `None` before any."""
        return _lower_quartile(self.plain_recent)

    def reopen_calibration(self, tokens_bound: float) -> bool:
        """Time the widths above the cap after all where the cap's forward may pay by `tokens_bound` (the most tokens
        an iteration of the asking rule is expected to bring); returns whether the table is calibrated again."""
        stopped = self.stopped_calibration
        if stopped is None or not stopped.reopen(self.plain_seconds(), tokens_bound):
            return False
        self.calibration, self.stopped_calibration = stopped, None
        return True

    def covers(self, width: int) -> bool:
        """Whether the forwards of every k up to `width` were timed."""
        return width < len(self.verify_seconds)

    def observe_forward(self, k: int, seconds: float, tokens_bound: float = math.inf) -> None:
        """Count a forward of an iteration that chose `k` drafts while the table is calibrated (the drafter may have
        proposed fewer: what choosing k costs is what is timed); `verify_seconds` grows as the widths from 0 up
        complete, made non-decreasing in the width (feeding more tokens never costs less; pool-adjacent-violators).
        `tokens_bound`, the most tokens an iteration of any k is expected to bring, lets the calibration stop at the
        first width that cannot pay ([`ForwardCalibration.record`]); the table's largest k is then the `cap`, for
        every rule (the tables are per width, not per rule) until one expecting more tokens reopens it
        (`reopen_calibration`)."""
        calibration = self.calibration
        calibration.record(k, seconds, self.plain_seconds(), tokens_bound)
        complete = min(calibration.complete_widths(), calibration.widths_to_time())
        if complete > len(self.verify_seconds):
            self.verify_seconds = non_decreasing(calibration.least[:complete])
            self.__dict__.pop("forward_per_draft", None)  # derived from `verify_seconds`
            self._step_costs_memo = None
        if complete == calibration.widths_to_time():
            self.calibration = None
            if calibration.cap is not None:
                self.stopped_calibration = calibration

    @property
    def per_draft(self) -> float:
        """What a draft more costs an iteration, whatever the step: the median of every paired reading, never below
        what it costs the verifier's forward (the least-squares slope of the calibrated widths: the drafter's queries
        and the loop's wider logits only add to it), which is also the estimate until `_MIN_PER_DRAFT_READINGS`
        readings were made (one slow moment must not turn drafting off before it is measured again)."""
        return self._median_cost([reading for _, reading in self.per_draft_recent])

    @functools.cached_property
    def forward_per_draft(self) -> float:
        """What a draft more costs the verifier's forward: the least-squares slope of the calibrated widths (never
        below 0; forgotten when `verify_seconds` grows)."""
        return max(_slope(self.verify_seconds), 0.0)

    def step_costs(self, width: int) -> list[float]:
        """What going from j to j + 1 drafts costs an iteration, j = 1..`width` - 1: the median of that step's own
        readings once there are `_MIN_PER_DRAFT_READINGS` (steps differ: a kernel may change with the rows fed, and
        the choice between two k turns on the step between them), else `per_draft`."""
        readings_now = self.per_draft_recent
        key = (width, len(readings_now), readings_now[-1] if readings_now else None)
        memo = self._step_costs_memo
        # every iteration asks, readings come every few: the medians are kept until a reading arrives
        if memo is not None and memo[0][:2] == key[:2] and memo[0][2] is key[2]:
            return list(memo[1])
        costs = self._compute_step_costs(width)
        self._step_costs_memo = (key, costs)
        return list(costs)

    def _compute_step_costs(self, width: int) -> list[float]:
        by_step: dict[int, list[float]] = {}
        for step, reading in self.per_draft_recent:
            by_step.setdefault(step, []).append(reading)
        overall = None
        costs = []
        for step in range(1, width):
            readings = by_step.get(step, ())
            if len(readings) >= _MIN_PER_DRAFT_READINGS:
                costs.append(self._median_cost(readings))
                continue
            if overall is None:  # only where some step lacks readings of its own
                overall = self.per_draft
            costs.append(overall)
        return costs

    def _median_cost(self, readings: Sequence[float]) -> float:
        if len(readings) < _MIN_PER_DRAFT_READINGS:
            return self.forward_per_draft
        return max(statistics.median(readings), self.forward_per_draft)

    def iteration_seconds(self, width: int | None = None) -> list[float]:
        """What an iteration verifying k drafts costs, k = 0..`width` (default: the largest k whose forward was
        timed; `width` may be no larger, `covers`).

        A plain iteration costs the lower quartile of the recent plain ones (a slow moment only ever adds time; with
        few readings, the least); a drafting one a base (its cost at k = 1) plus the `step_costs` up to its k, the base
        the lower quartile of the recent drafting iterations' times less their steps'; the plain cost and the base
        are never less than the calibrated plain forward (an iteration of either kind runs at least that), the base
        never less than a plain iteration plus what one draft adds to the calibrated forward, and no k less than a
        plain iteration plus what its drafts add to it. Unseen, a plain iteration costs the calibrated forward alone,
        and a drafting iteration's base what a plain one costs plus its wider forward: both optimistic, so that each
        kind gets tried.
        """
        width = len(self.verify_seconds) - 1 if width is None else width
        plain = self.plain_seconds()
        plain = self.verify_seconds[0] if plain is None else plain
        # above k = 1: the steps' costs summed (the table's largest k, so that every recorded k has its offset)
        offsets = [0.0]
        for cost in self.step_costs(self.largest_k):
            offsets.append(offsets[-1] + cost)
        base = _lower_quartile([seconds - offsets[k - 1] for k, seconds in self.drafting_recent])
        base = plain if base is None else base
        floor = self.verify_seconds[0]
        plain = max(plain, floor)
        # a drafting iteration runs all a plain one does and a wider forward: the readings of the two kinds come from
        # other positions (drafts come where the drafter finds something, often early, at short caches) and cannot
        # make it cheaper than that; the base floored so (which also keeps it above the plain forward), the measured
        # steps still separate the k above it
        wider = [seconds - floor for seconds in self.verify_seconds]
        base = max(base, plain + wider[1])
        return [plain] + [max(base + offsets[k - 1], plain + wider[k]) for k in range(1, width + 1)]

    def observe(self, k: int, seconds: float, previous: tuple[int, float] | None = None) -> tuple[int, float] | None:
        """Record one timed iteration that chose `k` drafts, and, with the `previous` drafting iteration's
        `(k, seconds)` (the one just before it) when the two k differ by one, a reading of what a draft costs.

        Returns:
            `(k, seconds)` of this iteration for the next one's reading, `None` for a plain one.
        """
        if k == 0:
            self.plain_recent.append(seconds)
            return None
        self.drafting_recent.append((k, seconds))
        if previous is not None and abs(previous[0] - k) == 1:
            self.per_draft_recent.append((min(k, previous[0]), (seconds - previous[1]) / (k - previous[0])))
        return k, seconds


def _slope(values: Sequence[float]) -> float:
    """The least-squares slope of `values` against their index (0 for fewer than two)."""
    count = len(values)
    if count < 2:
        return 0.0
    mean_index, mean_value = (count - 1) / 2, sum(values) / count
    covariance = sum((index - mean_index) * (value - mean_value) for index, value in enumerate(values))
    return covariance / sum((index - mean_index) ** 2 for index in range(count))


def _lower_quartile(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


# per drafter and verifier (weakly held, so a deleted model takes its measurements with it): cost tables by (batch
# width, device, largest k), and acceptance counts (and how whole calls were decoded, by batch width) by rule
_COST_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ACCEPTANCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def clear_measurements() -> None:
    """Forget every cost table and acceptance count of this process (the next `generate()` measures again)."""
    _COST_TABLES.clear()
    _ACCEPTANCE.clear()


def _rows_bucket(rows: int) -> int:
    """Batch widths share a cost table by powers of two (a row more or less changes little)."""
    return 1 << (rows - 1).bit_length()


class DraftLengthSchedule:
    """The draft length of each iteration of one `generate()` call, from the process's measurements.

    Args:
        verifier (`PreTrainedModel`): The verifier (with the drafter, the key of the cost tables and acceptance
            counts).
        drafter_key (`object`): What identifies the drafter across calls: the user's drafter, unwrapped to its
            model.
        max_draft_tokens (`int`): The largest k to consider.
        rule (`tuple`): What changes acceptance besides the drafter (β, τ, sampling and its settings).
        device (`torch.device`): Where the verifier runs.
    """

    def __init__(self, verifier, drafter_key, max_draft_tokens: int, rule: tuple, device: torch.device):
        self.max_draft_tokens = max_draft_tokens
        self.device = device
        self._device_name = str(device)  # part of every table key, asked for at every iteration
        # whether the tables outlive this call (calls above one row calibrate them over several: probes among plain
        # calls); a drafter that cannot be weakly referenced has tables for this call only
        self._tables_kept = True
        try:  # what a drafter's call costs is part of an iteration's: tables per drafter and verifier
            self._tables = _COST_TABLES.setdefault(drafter_key, weakref.WeakKeyDictionary()).setdefault(verifier, {})
        except TypeError:
            self._tables, self._tables_kept = {}, False
        try:
            per_verifier = _ACCEPTANCE.setdefault(drafter_key, weakref.WeakKeyDictionary())
            per_rule = per_verifier.setdefault(verifier, {})
        except TypeError:  # a drafter that cannot be weakly referenced: counts for this call only
            per_rule = {}
        self.acceptance, self._call_choices = per_rule.setdefault(rule, (AcceptanceEstimate(), {}))
        self._every_rule = per_rule  # rule -> (acceptance, call choices per table key)
        self._table: IterationCostTable | None = None
        # this call's choices of its width (None: its table was being calibrated by this call when it started)
        self._call_choices_now: CallChoices | None = None
        # the kind of this call its choices chose (and its place in a head-to-head)
        self._call: ChosenCall | None = None
        self._call_started: float | None = None
        # whether this iteration's verifier forward is timed for its table's calibration (`run_verification`)
        self._times_forward = False
        self._plain_streak = 0
        self._probe_interval = _FIRST_PROBE_INTERVAL
        self._probing = False
        self._started: float | None = None
        self._first_iteration = True
        self._k = 0
        # the latest choice (best k, best k >= 1), what it was made for (cost table, largest k) and iterations since
        self._choice = (0, 0)
        self._chosen_for: tuple | None = None
        self._since_choice = 0
        # the last timed iteration's k and seconds, when it drafted: the first of a pair of readings; and its rows
        self._previous: tuple[int, float] | None = None
        self._rows = 0
        # the largest k this call can time (`drafts_this_call`): once the table covers it, the call's iterations
        # choose k from the table, up to the widest k it covers
        self._timed_width = max_draft_tokens
        # the key of the table this call started while it was calibrated (`observe_drafting_call`)
        self._calibrating_key: tuple | None = None
        # above one row, the calibration this call decodes for while its width's table is first calibrated: plainly,
        # or, if it drafts, as a probe that calibrates it
        self._calibration_probed: ForwardCalibration | None = None

    def _table_key(self, rows: int) -> tuple:
        return (_rows_bucket(rows), self._device_name, self.max_draft_tokens)

    def drafts_this_call(self, rows: int, largest_k: int | None = None) -> bool:
        """Whether a call of `rows` rows drafts at all, or decodes plainly (the loop with no drafter).

        Until the cost table of this batch width is calibrated up to the largest k the call can time, a call of one row
        runs the loop, which calibrates it; above one row, the first calibration is made by drafting calls run as probes
        among plain calls (the first after 2 plain calls, the next at once after a cheap probe and after twice as many
        plain calls after a costly one: [`ForwardCalibration.record_probe`]), whatever each call's rule, and by the loop
        at once where the calibration was reopened above its cap or the tables last this call only (a drafter that
        cannot be weakly referenced). Then the calls of this width decide, and before three of each kind were timed the
        table does: drafting when some k ≥ 1 is expected to beat a plain step (as plain calls measured it,
        [`observe_plain_call`]; before any, for one row the verifier's forward alone, above one row those timed under
        other rules, else plain: [`_table_expects_drafting`]). A call too short to time any k ≥ 1 whose table has none
        decodes plainly, unrecorded: drafting could time no k ≥ 1. After `_MAX_IDLE_CALLS` drafting calls in a row that
        timed none of the table's forwards (rows that finish at their first iteration go on in a narrower width), the
        calls of this width are chosen by their own timings alone. A table whose calibration stopped at its cap (no k
        above it expected to pay) is calibrated on above it first where the cap's width may pay by this rule's bound on
        the tokens of an iteration ([`IterationCostTable.reopen_calibration`]; `next_k` does the same for the table of a
        narrower width that rows finish into).

        Args:
            rows (`int`): The call's rows.
            largest_k (`int`, *optional*): The largest k an iteration of the call can take where it is timed (its
                length budget and positions allow no wider; a call never reaching a k cannot time its forward, and
                is chosen once the k it reaches were); default: every k of the table.
        """
        key = self._table_key(rows)
        table = self._tables.get(key)
        if table is not None and table.stopped_calibration is not None:  # a rule that may pay where it stopped
            self._reopen_if_paying(table)
        largest = self.max_draft_tokens if largest_k is None else min(largest_k, self.max_draft_tokens)
        self._timed_width = max(largest, 1)
        if largest < 1 and (table is None or not table.covers(1)):
            return False
        width = self._timed_width if table is None else min(self._timed_width, table.largest_k)
        if table is None or not table.covers(width):
            self._calibrating_key = key
            if table is None or table.calibration.idle_calls < _MAX_IDLE_CALLS:
                reopened = table is not None and table.calibration.reopened
                if key[0] == 1 or reopened or not self._tables_kept:  # the loop calibrates it
                    return True
                return self._plain_or_calibrating_probe(key, table)
            # its calls time none of its forwards: chosen by their own timings, drafting until plain ones are timed
            drafting_by_table = _expects_drafting
        else:
            drafting_by_table = functools.partial(self._table_expects_drafting, table, width, key)
        self._table = table
        choices = self._call_choices.get(key)
        if choices is None:
            # at one row, drafting calls too are timed early (the table's plain step there is the verifier's forward
            # alone and its acceptance counts those of the process's first rows), and probed sooner once clearly slower
            choices = self._call_choices[key] = CallChoices(one_row=key[0] == 1)
        self._call_choices_now = choices
        self._call = choices.next_call(drafting_by_table)
        return self._call.drafts

    def _plain_or_calibrating_probe(self, key: tuple, table: IterationCostTable | None) -> bool:
        """Above one row, while the width's table is first calibrated: a plain call, or a drafting call as a probe
        that calibrates the table ([`ForwardCalibration.probe_due`]); neither is a choice of the width's calls, and
        their times per step go to the calibration (`plain_call_steps`, `record_probe`: a probe's iterations take
        every k in turn, so it is no drafting call's time). Calling the loop to calibrate at once, as at one row,
        would time forwards that at a wide batch on a CPU cost several plain steps each, in a first call that a plain
        one, feeding only the rows still decoding, makes about as fast as greedy decoding or faster."""
        if table is None:
            table = self._tables[key] = IterationCostTable.uncalibrated(self.max_draft_tokens)
        self._calibration_probed = table.calibration
        return table.calibration.probe_due()

    def _reopen_if_paying(self, table: IterationCostTable) -> None:
        """Calibrate `table` above its cap where the cap's width may pay by this rule's acceptance counts."""
        table.reopen_calibration(self.acceptance.tokens_upper_bound(self.max_draft_tokens))

    def _table_expects_drafting(
        self, table: IterationCostTable, width: int, key: tuple, plain_call_steps: Sequence[float]
    ) -> bool:
        """Whether some k in 1..`width` is expected to give more tokens per second than a plain step: a plain step as
        plain calls measured it (lower quartile); before any, for one row the verifier's forward alone (optimistic for
        plain decoding: it wins every call drafting cannot clearly win), and above one row the plain calls of this
        width timed under any rule, and before any of those none (plain): there the table's k = 0 iterations, in
        drafting calls, re-feed rows that advanced unevenly, so they are no plain call's steps (at batch 16 on the demo
        pair about twice one), and a plain call is timed first."""
        plain_step = _lower_quartile(plain_call_steps)
        if plain_step is None and key[0] > 1:
            # sampling settings that change every call are each a rule of its own: their plain steps are alike enough
            # to judge by until this rule's own are timed
            plain_step = _lower_quartile(self._plain_call_steps_of_every_rule(key))
            if plain_step is None:
                return False
        if plain_step is None:
            plain_step = table.verify_seconds[0]
        acceptance = self.acceptance.probabilities(width)
        return choose_draft_length([plain_step, *table.iteration_seconds(width)[1:]], acceptance) > 0

    def _plain_call_steps_of_every_rule(self, key: tuple) -> list[float]:
        """The times per step of the plain calls of the width `key` timed so far, under every rule."""
        steps = []
        for _, choices in self._every_rule.values():
            if key in choices:
                steps.extend(choices[key].plain_call_steps)
        return steps

    def start_plain_call(self) -> None:
        """Start timing a call decoded plainly (after `drafts_this_call` said so)."""
        synchronize(self.device)
        self._started = _clock()

    def observe_plain_call(self, steps: int) -> None:
        """End the timing of a plain call of `steps` decoding steps (its output is on the host or waited for)."""
        synchronize(self.device)
        if steps > 0 and self._call_choices_now is not None:  # else a call too short to be chosen
            self._call_choices_now.record(self._call, False, (_clock() - self._started) / steps)
        elif steps > 0 and self._calibration_probed is not None:
            self._calibration_probed.plain_call_steps.append((_clock() - self._started) / steps)

    def start_drafting_call(self) -> None:
        """Start timing a call that drafts (after `drafts_this_call` said so), before the drafter's set-up."""
        synchronize(self.device)
        self._call_started = _clock()

    def observe_drafting_call(self, steps: int) -> None:
        """End the timing of a drafting call whose output took `steps` steps (what a plain call would have taken);
        not recorded for a call that started while its width's table was calibrated (no choice was made for it),
        unless that width's calls are chosen by their own timings (`drafts_this_call`), and counted towards that; a
        probe's time per step above one row goes to its calibration (`ForwardCalibration.record_probe`).
        Iterations that calibrated a narrower width once rows finished are part of its time: they decoded (at a k
        not the best), and at a width where drafting pays most."""
        synchronize(self.device)
        if steps > 0 and self._call_choices_now is not None:
            self._call_choices_now.record(self._call, True, (_clock() - self._call_started) / steps)
        table = None if self._calibrating_key is None else self._tables.get(self._calibrating_key)
        if steps > 0 and self._calibration_probed is not None:  # a drafting call with it: a probe
            self._calibration_probed.record_probe((_clock() - self._call_started) / steps)
        if table is not None and table.calibration is not None:  # still calibrated: did anything time it?
            table.calibration.count_call()

    def next_k(self, rows: int, limit: int) -> int:
        """This iteration's k (at most `limit`), and the start of its timing.

        Until the forwards of every k up to this iteration's largest were timed in the table of its batch width, the
        iteration calibrates it: it takes the k [`ForwardCalibration.next_width`] says, and the loop times its
        forward (`run_verification`). The iterations of a table's calibration decode like any other; they only take
        every k in turn. A call's first iteration, whose forward also projects the source, is not timed, and while
        a table is calibrated it takes a plain step: it commits one token, so that the next iteration may still take
        the widest k the call's length budget allows (`drafts_this_call`'s `largest_k`).

        Args:
            rows (`int`): Active rows.
            limit (`int`): The largest k this iteration may take (length and position limits).
        """
        key = self._table_key(rows)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = IterationCostTable.uncalibrated(self.max_draft_tokens)
        if table is not self._table or rows != self._rows:  # rows finished: no pair across the two widths
            self._previous = None
            if table.stopped_calibration is not None:  # a narrower width's table, stopped under another rule
                self._reopen_if_paying(table)
        self._table, self._rows = table, rows
        width = min(limit, self.max_draft_tokens)
        if table.covers(min(width, self._timed_width, table.largest_k)):
            self._times_forward = False
            # the first iteration may take a k wider than the call can time: the widest the table covers
            self._k = self._chosen_k(table, min(width, len(table.verify_seconds) - 1))
        else:
            self._probing = False
            # a call's first forward also projects the source: not what a forward of its width costs; a plain step
            # then commits one token, so that the next iteration can still take the widest k the call can time
            self._times_forward = not self._first_iteration
            self._k = 0 if self._first_iteration else table.calibration.next_width(width)
        synchronize(self.device)
        self._started = _clock()
        return self._k

    def _chosen_k(self, table: IterationCostTable, width: int) -> int:
        """The k of an iteration whose table covers every k up to `width`: the best by its costs and the acceptance
        counts (chosen again every few iterations; the best k ≥ 1 in a call the call choices chose to draft), a probe
        of drafting now and then while k = 0 wins, and a neighbour of the best k now and then."""
        # the measurements move a little with each iteration and the choice seldom: choosing costs a Python pass over
        # the readings (tens of microseconds between a step's kernels), so it is made again every few iterations
        chosen_for = self._chosen_for
        if (
            chosen_for is None
            or chosen_for[0] is not table
            or chosen_for[1] != width
            or self._since_choice >= _RECHOOSE_INTERVAL
        ):
            costs = table.iteration_seconds(width)
            acceptance = self.acceptance.probabilities(width)
            self._choice = (
                choose_draft_length(costs, acceptance),
                choose_draft_length(costs, acceptance, drafting=True),
            )
            self._chosen_for, self._since_choice = (table, width), 0
        self._since_choice += 1
        # a call the call choices chose to draft drafts at every iteration: timed calls chose it, and plain iterations
        # there would give the call no drafting call's time, nor the acceptance counts a reading (in the main job, the
        # process's first row, its drafts rejected 40 times in a row, turned every later drafting call into plain
        # iterations and probes, slower than a plain call: docs/RESULTS.md)
        k = self._choice[1] if self._call is not None and self._call.drafts else self._choice[0]
        self._probing = k == 0 and self._plain_streak >= self._probe_interval
        if self._probing:  # the best k if drafting were on: what it is worth is read at the k it would run at
            k = self._choice[1]
        elif k > 0:  # drafting pays again: probe early the next time it stops paying
            self._probe_interval = _FIRST_PROBE_INTERVAL
        if k > 0:
            table.drafting_iterations += 1
            k = _neighbour_now_and_then(k, width, table.drafting_iterations)
        return k

    def run_verification(self, forward: Callable[[], _Result]) -> _Result:
        """Run this iteration's verifier `forward` and return what it returns, timing it where the iteration
        calibrates its table (`next_k`)."""
        if not self._times_forward:
            return forward()
        synchronize(self.device)
        started = _clock()
        result = forward()
        synchronize(self.device)
        seconds = _clock() - started
        self._table.observe_forward(self._k, seconds, self.acceptance.tokens_upper_bound(self.max_draft_tokens))
        return result

    def observe(self, accepted: Sequence[int]) -> None:
        """End the iteration's timing (the loop has read its outcome on the host: the device is done) and count
        what its drafts were worth.

        The time is recorded for the k chosen, whatever the verifier's forward took (fewer drafts where a drafter's
        `DraftProposal.num_drafts` or the confidence threshold cut them): it is what choosing that k costs.

        Args:
            accepted (`Sequence[int]`): Per active row, the drafts it accepted. Every row counts as scheduled for
                the k chosen: drafts a drafter declined to propose are worth as little as rejected ones.
        """
        seconds = _clock() - self._started
        if not self._first_iteration:  # the first forward of a call also projects the source for cross-attention
            self._previous = self._table.observe(self._k, seconds, self._previous)
        self._first_iteration = False
        self.acceptance.update(self._k, accepted)
        if self._k > 0:
            if self._probing:
                self._probe_interval = min(2 * self._probe_interval, _MAX_PROBE_INTERVAL)
            self._plain_streak = 0
        else:
            self._plain_streak += 1

    def skip(self) -> None:
        """An iteration the schedule did not choose (a length limit left it no draft, or a drafter reading the
        verifier's states had none yet) ran: the next timed one is not its predecessor's pair, and not the call's
        first (this one projected the source)."""
        self._previous = None
        self._first_iteration = False


def _expects_drafting(plain_call_steps: Sequence[float]) -> bool:
    """A width whose table has no say: drafting until the calls' own timings decide."""
    return True


def _neighbour_now_and_then(k: int, width: int, drafting_iterations: int) -> int:
    """`k`, except every `_NEIGHBOUR_INTERVAL`-th drafting iteration with a cost table (every
    `_SETTLED_NEIGHBOUR_INTERVAL`-th after its first `_NEIGHBOUR_WARM_UP`), which runs a k one above or one below it
    (alternately; the other where one is out of `[1, width]`), so that what a draft costs is read from pairs of
    consecutive iterations on every machine and drafter."""
    interval = _NEIGHBOUR_INTERVAL if drafting_iterations <= _NEIGHBOUR_WARM_UP else _SETTLED_NEIGHBOUR_INTERVAL
    if drafting_iterations % interval or width < 2:
        return k
    step = 1 if (drafting_iterations // interval) % 2 else -1
    if not 1 <= k + step <= width:
        step = -step
    return k + step


def non_decreasing(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean_a, count_a), (mean_b, count_b) = blocks[-2], blocks.pop()
            blocks[-1] = [(mean_a * count_a + mean_b * count_b) / (count_a + count_b), count_a + count_b]
    return [mean for mean, count in blocks for _ in range(int(count))]
