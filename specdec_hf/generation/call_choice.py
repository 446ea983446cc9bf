"""Choosing the kind of each whole call under `num_draft_tokens="auto"`: the speculative loop drafting, or the loop
without a drafter (every iteration a plain verifier step, no drafter set-up or call: greedy decoding's tokens,
sampling's distribution).

Which kind runs is decided by the calls themselves once three of each were timed (the time per step of the latest ones,
each kind with all it costs around the verifier: a cost table of single iterations and a plain call's average do not
compare alike). The kind expected is mostly run and the other rarely, so their windows hold readings of other moments,
and a burst of other work on the machine slows mostly the expected kind's: when the windows' means say the other kind
is faster, the two kinds run head to head ([`HeadToHead`]: alternately, in pairs of adjacent calls that a burst slows
alike) until the pairs settle it, and the pairs' readings then replace both windows. Before three of each were timed,
the caller's cost table decides (`specdec_hf.generation.draft_length`). The kind not chosen still runs now and then, at
growing intervals (a drafting call after 2, 4, ... 32 plain calls, at one row every 2 until three were timed, after 256
(at one row 64) while the timed drafting calls are clearly slower, the latest one included; a plain call after 8, 16,
... 64 drafting calls, every 2 until three were timed), so that both stay measured. A drafting call's own k = 0
iterations cannot stand in for plain calls: at batch > 1 they still re-feed the rows that advanced unevenly.

The choices ([`CallChoices`]) are kept by the caller (`DraftLengthSchedule`: per drafter, verifier, rule and cost
table); nothing here reads a clock, so the choice is a deterministic function of the times it is given
(`lab/call_choice_scenarios.py` drives the schedule on a fake clock).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["CallChoices", "ChosenCall", "HeadToHead"]

# calls of each kind (plain; drafting) whose time per step is remembered
_RECENT_CALLS = 16
# whole calls decoded without drafting before one probes it; the interval doubles after each such probe
_FIRST_CALL_PROBE_INTERVAL = 2
_MAX_CALL_PROBE_INTERVAL = 32
# ... and while the timed drafting calls are clearly slower per step than the plain ones (their means apart by
# `_CLEARLY_SLOWER_ERRORS` standard errors of the difference and by `_CLEARLY_SLOWER_SHARE` of the plain mean), this
# many above one row: a drafting call at batch 16 on a CPU took ~1.4 times a plain one of transformers' loop, and a
# probe every 32 calls cost ~1.3%
_CLEARLY_SLOWER_PROBE_INTERVAL = 256
# ... at one row, this many: the first rows of a process can be its hardest for the drafter, and three drafting calls
# among them kept plain calls for 256 calls (lab/call_choice_scenarios.py, "one row, the first 12 rows hard")
_ONE_ROW_CLEARLY_SLOWER_PROBE_INTERVAL = 64
_CLEARLY_SLOWER_ERRORS = 3.0
_CLEARLY_SLOWER_SHARE = 0.1
# drafting calls before one is decoded plainly, to keep plain decoding's cost measured; doubling likewise
_FIRST_PLAIN_PROBE_INTERVAL = 8
_MAX_PLAIN_PROBE_INTERVAL = 64
# ... but every this many calls until `_MIN_TIMED_CALLS` plain calls were timed (and drafting ones, with
# `CallChoices.one_row`)
_WARM_UP_PROBE_INTERVAL = 2
# calls of each kind timed before their measured costs per step decide between them
_MIN_TIMED_CALLS = 3
# a change of the expected kind is settled head to head: the two kinds run alternately, in pairs of adjacent calls
# (a burst of other work slows both calls of a pair alike), at least `_MIN_PAIRS` and at most `_MAX_PAIRS` pairs, until
# the log ratio of the pairs' sums exceeds `_SURE_ERRORS` times their spread over √pairs (`HeadToHead.verdict`)
_MIN_PAIRS = 4
_MAX_PAIRS = 6
_SURE_ERRORS = 2.0
# ... a pair left out of it as half in a burst only where its slow call took more than this many times the fastest
# call of its kind (and the call next to it was slowed too: `HeadToHead.kept_pairs`)
_BURST_SLOWDOWN = 2.0
# calls of the expected kind after a head-to-head before the windows' means may call another (after a verdict the
# windows hold only the pairs' readings, and a mean of a few noisy calls would call one after another)
_FRESH_CALLS = 8


def _clearly_slower(slower: Sequence[float], faster: Sequence[float]) -> bool:
    """Whether the calls timed in `slower` (times per step) are slower than those in `faster` by more than their
    noise explains: at least `_MIN_TIMED_CALLS` of each, the means apart by `_CLEARLY_SLOWER_ERRORS` standard errors
    of their difference and by `_CLEARLY_SLOWER_SHARE` of the faster mean, and the latest of `slower` slower by that
    share too (a probe that ran fast ends the verdict at once, not after the window's older calls age out; with a
    few calls, three standard errors alone would also be a weak test)."""
    if len(slower) < _MIN_TIMED_CALLS or len(faster) < _MIN_TIMED_CALLS:
        return False
    slower_mean, faster_mean = statistics.fmean(slower), statistics.fmean(faster)
    if slower[-1] <= (1 + _CLEARLY_SLOWER_SHARE) * faster_mean:
        return False
    error = (_variance(slower) / len(slower) + _variance(faster) / len(faster)) ** 0.5
    gap = slower_mean - faster_mean
    return gap > _CLEARLY_SLOWER_ERRORS * error and gap > _CLEARLY_SLOWER_SHARE * faster_mean


def _variance(values: Sequence[float]) -> float:
    """The sample variance of `values` (at least two) in floats: `statistics.variance` computes it exactly, in
    fractions, at tens of microseconds a call, and every call of a plain-decoding width asks for it."""
    mean = math.fsum(values) / len(values)
    return math.fsum((value - mean) ** 2 for value in values) / (len(values) - 1)


@dataclass
class HeadToHead:
    """Calls of the two kinds run alternately, in pairs of adjacent calls (the kind challenging the expected one
    first in every other pair), and their times per step.

    Args:
        challenger_drafts (`bool`): Whether the challenging kind is drafting (the expected kind is the other).
        calls (`int`): Calls of the head-to-head so far.
        pairs (`list[list[float | None]]`): Per pair, the plain and the drafting call's time per step (`None`
            until timed; a call may end untimed).
    """

    challenger_drafts: bool
    calls: int = 0
    pairs: list[list[float | None]] = field(default_factory=list)

    def next_drafts(self) -> bool:
        """Whether the next call of the head-to-head drafts (and count it)."""
        drafts = self._drafts_at(self.calls)
        self.calls += 1
        return drafts

    def record(self, call: int, drafting: bool, seconds: float) -> None:
        """Keep the time per step of the head-to-head's `call`-th call (from 0), of the kind `drafting` says."""
        while len(self.pairs) <= call // 2:
            self.pairs.append([None, None])
        self.pairs[call // 2][int(drafting)] = seconds

    def _timed(self) -> list[tuple[int, float, float]]:
        """The pairs whose two calls were timed: (pair index, plain, drafting time per step)."""
        return [(index, plain, drafting) for index, (plain, drafting) in enumerate(self.pairs) if plain and drafting]

    def _drafts_at(self, call: int) -> bool:
        """Whether the head-to-head's `call`-th call (from 0) drafts."""
        # the challenger first in pairs 0, 2, 4, ... and second in the others: a trend in the calls' costs (rows
        # sorted by length) favours neither kind over two pairs
        challenger_first = (call // 2) % 2 == 0
        return self.challenger_drafts if (call % 2 == 0) == challenger_first else not self.challenger_drafts

    def kept_pairs(self) -> list[tuple[float, float]]:
        """The timed pairs' (plain, drafting) times per step, less one pair half in a burst.

        The pair whose log ratio is farthest from the pairs' median is left out when its slower call took more than
        `_BURST_SLOWDOWN` times the fastest call of its kind (in the timed pairs) and the call next to it outside
        the pair was slowed more than half as much (in log, against the same baseline): a burst lasts. Kept
        otherwise: a call slow alone (as when a drafting call's drafts are rejected), or at either end of the
        head-to-head or next to an untimed call (where nothing tells a burst from what the call costs), is what
        that kind costs, and the sums then compare what the windows' means compare.
        """
        timed = self._timed()
        ratios = [math.log(drafting / plain) for _, plain, drafting in timed]
        return self._kept(timed, ratios, statistics.median(ratios) if ratios else 0.0)

    def _kept(self, timed: list, ratios: list[float], median: float) -> list[tuple[float, float]]:
        """`kept_pairs` from the timed pairs, their log ratios and the ratios' median."""
        pairs = [(plain, drafting) for _, plain, drafting in timed]
        if len(timed) < 2:
            return pairs
        farthest = max(range(len(timed)), key=lambda index: abs(ratios[index] - median))
        # a burst only ever slows a call: the fastest call of each kind is the baseline a burst does not move
        fastest = (min(plain for plain, _ in pairs), min(drafting for _, drafting in pairs))

        def slowed(call: int) -> float | None:
            """The `call`-th call's log time over its kind's fastest; `None` if there is no such timed call."""
            if not 0 <= call < 2 * len(self.pairs):
                return None
            drafts = self._drafts_at(call)
            seconds = self.pairs[call // 2][int(drafts)]
            return math.log(seconds / fastest[int(drafts)]) if seconds else None

        first = 2 * timed[farthest][0]
        slower = first if slowed(first) >= slowed(first + 1) else first + 1
        slowdown = slowed(slower)
        neighbour = slowed(first - 1 if slower == first else first + 2)
        if slowdown > math.log(_BURST_SLOWDOWN) and neighbour is not None and neighbour > slowdown / 2:
            return pairs[:farthest] + pairs[farthest + 1 :]
        return pairs

    def verdict(self) -> bool | None:
        """Whether drafting calls are the faster ones, `None` while the pairs leave it open.

        Decided at an even count of timed pairs from `_MIN_PAIRS` on (the order within pairs alternates, so with
        no pair missing a trend in the calls' costs cancels over two pairs), or at whatever count once
        `2 * _MAX_PAIRS` calls ran. The pairs compared by the ratio of their sums (of mean times per step, as the
        windows' means compare them), a pair half in a burst left out (`kept_pairs`); decided before `_MAX_PAIRS`
        pairs only if that ratio's log exceeds `_SURE_ERRORS` times the spread of the timed pairs' log ratios (their
        median absolute deviation, which one pair does not widen) over √pairs. A ratio of exactly 1 keeps the
        expected kind.
        """
        timed = self._timed()
        count, final = len(timed), self.calls >= 2 * _MAX_PAIRS
        if count < _MIN_PAIRS or (not final and count % 2):
            return None
        ratios = [math.log(drafting / plain) for _, plain, drafting in timed]
        median = statistics.median(ratios)
        kept = self._kept(timed, ratios, median)
        log_ratio = math.log(sum(drafting for _, drafting in kept) / sum(plain for plain, _ in kept))
        # the median absolute deviation scaled to a normal distribution's standard deviation
        spread = 1.4826 * statistics.median(abs(ratio - median) for ratio in ratios)
        if not final and count < _MAX_PAIRS and abs(log_ratio) <= _SURE_ERRORS * spread / math.sqrt(count):
            return None
        return log_ratio < 0 if log_ratio else not self.challenger_drafts


@dataclass(frozen=True, eq=False)
class ChosenCall:
    """The kind of call [`CallChoices.next_call`] chose, and where its time per step goes.

    Args:
        drafts (`bool`): Whether the call drafts (else the loop runs without a drafter).
        head_to_head ([`HeadToHead`], *optional*): The head-to-head the call runs in.
        place (`int`): The call's place in that head-to-head (from 0; 0 outside one).
    """

    drafts: bool
    head_to_head: HeadToHead | None = None
    place: int = 0


@dataclass
class CallChoices:
    """How whole calls of one cost table's batch width were decoded under one rule: what calls of each kind cost per
    step, which kind was last expected to be faster, the calls of that kind since the other was last run, and how
    many to run before running the other once (a probe).

    Args:
        plain_call_steps (`deque[float]`): The time per step of the latest calls decoded plainly (the loop without a
            drafter).
        drafting_call_steps (`deque[float]`): The time per step of the latest drafting calls (the drafter's set-up and
            the loop, per step of output). Both are kept per rule: what drafts are worth depends on it, and sampling's
            plain steps cost more than greedy's.
        drafting_expected (`bool`, *optional*): The kind expected to be faster (`None` before the first call).
        one_row (`bool`): Whether the width is one row (batch 1), where a call's time per step varies with its row
            more than with its kind (in the main job's rows, k=3 ran 0.80-2.01 times greedy's speed row by row): while
            plain calls are expected, drafting calls run every 2 calls until three were timed, as plain calls do while
            drafting ones are, and while drafting calls are clearly slower, after
            `_ONE_ROW_CLEARLY_SLOWER_PROBE_INTERVAL` plain calls (a process's first rows can be its hardest).
    """

    plain_call_steps: deque = field(default_factory=lambda: deque(maxlen=_RECENT_CALLS))
    drafting_call_steps: deque = field(default_factory=lambda: deque(maxlen=_RECENT_CALLS))
    drafting_expected: bool | None = None
    one_row: bool = False
    since_probe: int = 0
    probe_interval: int = _FIRST_CALL_PROBE_INTERVAL
    # the head-to-head under way, and the calls of the expected kind timed since the last one ended
    head_to_head: HeadToHead | None = None
    fresh_calls: int = _FRESH_CALLS

    def expect(self, drafting: bool) -> None:
        """Expect `drafting` (or plain) calls from now on: the other kind's probes start over at its first interval."""
        self.drafting_expected, self.since_probe = drafting, 0
        self.probe_interval = _FIRST_CALL_PROBE_INTERVAL if not drafting else _FIRST_PLAIN_PROBE_INTERVAL

    def settle(self, drafting: bool, head_to_head: HeadToHead) -> None:
        """End a head-to-head whose verdict is `drafting`: its pairs (`HeadToHead.kept_pairs`) become both kinds'
        windows (readings of the same moments, where the windows held readings of other times), the verdict the
        expected kind, and the next probe of the other kind is counted from here (both were just timed)."""
        timed = head_to_head.kept_pairs()
        self.plain_call_steps = deque((plain_step for plain_step, _ in timed), maxlen=_RECENT_CALLS)
        self.drafting_call_steps = deque((drafting_step for _, drafting_step in timed), maxlen=_RECENT_CALLS)
        if drafting != self.drafting_expected:
            self.expect(drafting)
        self.since_probe = 0

    def next_call(self, drafting_by_table: Callable[[Sequence[float]], bool]) -> ChosenCall:
        """The kind of the next call of this width.

        Once at least `_MIN_TIMED_CALLS` of each kind were timed, the faster kind is expected from the calls
        themselves (the means of the latest ones' times per step: both measured alike, each with all it costs around
        the verifier), a change of the expected kind settled head to head ([`HeadToHead`]; the next one only after
        `_FRESH_CALLS` calls of the kind then expected); before that, `drafting_by_table(plain_call_steps)` says
        whether drafting is expected to pay (the caller's cost table, given the plain calls timed so far). The other
        kind runs now and then so that both stay measured: a drafting call after 2, 4, ... 32 plain calls (with
        `one_row`, every 2 until three were timed), a plain call after 8, 16, ... 64 drafting calls, after
        every 2 until three plain calls were timed (the interval doubles after each probe, once three were timed
        where it came every 2, and starts over when the expected kind changes); while the timed drafting calls are
        clearly slower per step than the plain ones (`_clearly_slower`: their means three standard errors and a tenth
        apart, the latest drafting call a tenth slower too), a drafting call only after 256 plain ones (64 with
        `one_row`).

        Args:
            drafting_by_table (`Callable[[Sequence[float]], bool]`): Whether the cost table expects drafting calls
                to be faster, given the times per step of the plain calls timed so far; called only while fewer than
                `_MIN_TIMED_CALLS` of either kind were timed.
        """
        if self.head_to_head is not None:
            head_to_head = self.head_to_head
            verdict = head_to_head.verdict()
            if verdict is None and head_to_head.calls < 2 * _MAX_PAIRS:
                return self._in_head_to_head(head_to_head)
            self.head_to_head = None
            self.fresh_calls = 0
            if verdict is not None:
                self.settle(verdict, head_to_head)
        plain, drafting_steps = self.plain_call_steps, self.drafting_call_steps
        timed = min(len(plain), len(drafting_steps)) >= _MIN_TIMED_CALLS
        if timed:
            # means, not lower quartiles: a drafting call's time per step also varies with how well its drafts did,
            # so its lower quartile would stand for its luckiest calls. No margin for plain decoding: drafting calls
            # vary more (a third and more per step) and are rare while plain decoding is expected, so a margin of one
            # standard error kept a drafter that pays decoding plainly for a whole pass once (docs/RESULTS.md)
            drafting = statistics.fmean(drafting_steps) < statistics.fmean(plain)
        else:
            drafting = drafting_by_table(plain)
        if self.drafting_expected is not None and timed and drafting != self.drafting_expected:
            # the windows' means say the other kind: settled head to head, unless fewer than `_FRESH_CALLS` calls of
            # the expected kind were timed since the last one ended
            drafting = self.drafting_expected
            if self.fresh_calls >= _FRESH_CALLS:
                self.head_to_head = HeadToHead(not drafting)
                return self._in_head_to_head(self.head_to_head)
        if drafting != self.drafting_expected:
            self.expect(drafting)
        interval = self.probe_interval
        if not drafting and _clearly_slower(drafting_steps, plain):
            interval = max(
                interval, _ONE_ROW_CLEARLY_SLOWER_PROBE_INTERVAL if self.one_row else _CLEARLY_SLOWER_PROBE_INTERVAL
            )
        other_timed = len(plain if drafting else drafting_steps)
        # until three calls of the other kind were timed it runs every 2 calls: the cost table can be wrong either way.
        # Its drafting iterations can look cheaper than drafting calls are (docs/RESULTS.md: a batch width of one call
        # a pass, its rows the longest, drafted at 0.8x greedy); at one row (`one_row`) its acceptance
        # counts are those of the process's first rows (the main job's longest and hardest: first drafts accepted 38%
        # of the time, 61% over the pass, and the pass's first 36 calls decoded plainly). Above one row a plain
        # expectation stands on timed plain calls, and a drafting call can cost several plain ones: probes double
        warming_up = other_timed < _MIN_TIMED_CALLS and (drafting or self.one_row)
        if warming_up:
            interval = min(interval, _WARM_UP_PROBE_INTERVAL)
        if self.since_probe >= interval:
            self.since_probe = 0
            if not warming_up or other_timed + 1 >= _MIN_TIMED_CALLS:
                limit = _MAX_PLAIN_PROBE_INTERVAL if drafting else _MAX_CALL_PROBE_INTERVAL
                self.probe_interval = min(2 * self.probe_interval, limit)
            return ChosenCall(not drafting)
        self.since_probe += 1
        return ChosenCall(drafting)

    @staticmethod
    def _in_head_to_head(head_to_head: HeadToHead) -> ChosenCall:
        """The head-to-head's next call."""
        place = head_to_head.calls
        return ChosenCall(head_to_head.next_drafts(), head_to_head, place)

    def record(self, call: ChosenCall, drafting: bool, seconds: float) -> None:
        """Keep the time per step of a timed call, chosen as `call` and run as `drafting` says, in that kind's window
        and in the head-to-head it ran in; outside a head-to-head, a call of the expected kind counts towards the
        `_FRESH_CALLS` before the next one."""
        if call.head_to_head is not None:
            call.head_to_head.record(call.place, drafting, seconds)
        elif drafting == self.drafting_expected:
            self.fresh_calls += 1
        (self.drafting_call_steps if drafting else self.plain_call_steps).append(seconds)
