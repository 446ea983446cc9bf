"""Whole calls under `num_draft_tokens="auto"`: drafting, or the loop without a drafter, chosen by the
calls' own timings (`specdec_hf.generation.call_choice`) or, before three of each kind were timed, the cost table; on
the test clock, so that the machine's load does not decide."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from conftest import WeakKey

from specdec_hf.generation.call_choice import CallChoices, HeadToHead, _variance
from specdec_hf.generation.draft_length import DraftLengthSchedule, IterationCostTable, choose_draft_length

pytestmark = pytest.mark.usefixtures("fresh_draft_length_measurements")


def test_a_call_decides_from_the_tables_and_counts_of_its_width():
    schedule = DraftLengthSchedule(object, None, 2, (1, 0.0, False), torch.device("cpu"))
    assert schedule.drafts_this_call(1)  # no table for this width yet: the loop measures it
    table = IterationCostTable([1.0, 1.1, 1.2])
    schedule._tables[(1, "cpu", 2)] = table
    table.drafting_recent.append((1, 1.6))
    schedule.acceptance.update(2, [0] * 50)  # drafts never accepted: no k beats a plain forward of 1.0
    decisions = [schedule.drafts_this_call(1) for _ in range(12)]
    assert decisions == [False, False, True] * 4  # at one row a drafting call after every 2 until three were timed
    choices = schedule._call_choices[(1, "cpu", 2)]
    choices.drafting_call_steps.extend([1.6, 1.6, 1.6])  # three timed: the next after 2, then 4, 8
    decisions = [schedule.drafts_this_call(1) for _ in range(15)]
    assert decisions == [False, False, True, False, False, False, False, True] + [False] * 7
    schedule.acceptance.update(2, [2] * 500)  # drafts now sure: drafting expected
    decisions = [schedule.drafts_this_call(1) for _ in range(6)]
    assert decisions == [True, True, False] * 2  # a plain call after every 2 until three were timed (none is)


def test_at_one_row_drafting_calls_come_every_two_until_three_were_timed_then_the_interval_doubles():
    """With `one_row` (the schedule's choices at one row) and plain calls expected, a drafting call runs after
    every 2 plain ones until three were timed, then after 4, 8, ... (the doubling starts at the third); without it,
    after 2, 4, 8 from the first."""

    def kinds(choices: CallChoices, calls: int) -> str:
        made = ""
        for _ in range(calls):
            call = choices.next_call(lambda plain_call_steps: False)  # the table expects plain calls
            choices.record(call, call.drafts, 1.0)  # every call timed, both kinds alike (no clear verdict)
            made += "D" if call.drafts else "."
        return made

    assert kinds(CallChoices(one_row=True), 23) == "..D..D..D....D........D"
    assert kinds(CallChoices(), 23) == "..D....D........D" + "." * 6


def test_a_call_chosen_to_draft_takes_a_k_of_at_least_one_at_every_iteration():
    """Drafts never accepted make k = 0 the table's best, but a call the call choices chose to draft (here the
    warm-up's drafting call at one row) drafts at every iteration: plain iterations would give it no drafting call's
    time, nor the acceptance counts a reading."""
    keys, table = (WeakKey(), WeakKey()), IterationCostTable([1.0, 1.1, 1.2])
    kinds = []
    for _ in range(3):  # a schedule per call, the process's measurements shared, as `generate()` makes them
        schedule = DraftLengthSchedule(keys[0], keys[1], 2, (1, 0.0, False), torch.device("cpu"))
        if not kinds:
            schedule._tables[(1, "cpu", 2)] = table
            schedule.acceptance.update(2, [0] * 50)
        kinds.append(schedule.drafts_this_call(1))
    assert kinds == [False, False, True]
    assert choose_draft_length(table.iteration_seconds(2), schedule.acceptance.probabilities(2)) == 0
    drafted = []
    for _ in range(12):
        drafted.append(schedule.next_k(1, 2))
        schedule.observe([0])
    assert min(drafted) >= 1 and schedule.acceptance.verified[0] == 50 + 12


def _process_expecting(expected: str) -> tuple[WeakKey, WeakKey]:
    """A verifier and a drafter whose batch-16 cost table exists and whose acceptance counts make it expect `expected`
    ("plain" or "drafting") calls before any call is timed."""
    keys = (WeakKey(), WeakKey())
    schedule = DraftLengthSchedule(keys[0], keys[1], 2, (1, 0.0, False), torch.device("cpu"))
    schedule._tables[schedule._table_key(16)] = IterationCostTable([1.0, 1.1, 1.2])
    schedule.acceptance.update(2, [0] * 50 if expected == "plain" else [2] * 500)
    return keys


def _choose_calls(clock, keys, step_costs) -> str:
    """Batch-16 calls choosing between the loop and plain decoding as `generate()` makes them (a new schedule per
    call, the process's measurements shared; the loop's own choice of k is not exercised): call i costs
    `step_costs[i]` = (plain, drafting) time per step on the test clock. Returns the calls' kinds, `D` drafting and
    `.` plain."""
    steps, kinds = 10, ""
    for plain_step, drafting_step in step_costs:
        schedule = DraftLengthSchedule(keys[0], keys[1], 2, (1, 0.0, False), torch.device("cpu"))
        if schedule.drafts_this_call(16):
            schedule.start_drafting_call()
            clock.spend(drafting_step * steps - 1)  # the clock adds one unit per reading
            schedule.observe_drafting_call(steps)
            kinds += "D"
        else:
            schedule.start_plain_call()
            clock.spend(plain_step * steps - 1)
            schedule.observe_plain_call(steps)
            kinds += "."
    return kinds


def test_a_lasting_change_of_the_expected_kind_is_followed_within_tens_of_calls(clock):
    """Drafting pays, then its calls become slower than plain ones for good (its drafts no longer accepted): plain
    calls take over within tens of calls, not after the probes of the other kind have turned over."""
    keys = _process_expecting("drafting")
    before = _choose_calls(clock, keys, [(1.0, 0.8)] * 300)
    assert before[-100:].count(".") <= 5
    after = _choose_calls(clock, keys, [(1.0, 1.4)] * 300)
    assert ".." in after[:40], after[:80]  # two plain calls in a row: plain decoding expected
    assert after[-200:].count("D") <= 10


@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize(
    ("drafting_over_plain", "expected_first", "faster"), [(0.9, "plain", "D"), (1.1, "drafting", ".")]
)
def test_rows_sorted_by_length_keep_the_faster_kind(clock, order, drafting_over_plain, expected_first, faster):
    """Passes over rows sorted by length (six calls a pass, the time per step of each a tenth of the first's above the
    one before it, or below in descending order, as `evaluate.py` sorts them): whichever kind the cost table expected
    first, the faster kind runs nearly every call once both were timed."""
    growth = [1.0 + 0.1 * position for position in range(6)]
    if order == "descending":
        growth.reverse()
    costs = [(factor, drafting_over_plain * factor) for _ in range(200) for factor in growth]
    kinds = _choose_calls(clock, _process_expecting(expected_first), costs)
    assert kinds[-600:].count(faster) >= 0.9 * 600


def test_calls_slowed_by_a_burst_of_other_work_do_not_decide_after_it(clock):
    """Drafting calls cost 1.4 times a plain call per step (as at batch 16 on a CPU); other work then slows every call
    tenfold for 15 calls, most of them plain. Once the burst is over, plain calls should go on, drafting running only
    as a probe (without the burst, 0 of the 200 calls after draft: their probes wait 256 calls)."""
    keys = _process_expecting("plain")
    _choose_calls(clock, keys, [(1.0, 1.4)] * 40)
    _choose_calls(clock, keys, [(10.0, 14.0)] * 15)
    after = _choose_calls(clock, keys, [(1.0, 1.4)] * 200)
    assert after.count("D") <= 8  # a few probes at most


def test_timed_calls_decide_over_the_cost_table_head_to_head(clock):
    """The table expects drafting to pay, but drafting calls take 1.25 times a plain call per step. Above one row the
    table judges only once a plain call was timed (its k = 0 iterations are no plain call's steps), so the first call
    is plain; then plain calls run after every 2 drafting ones until three were timed, the two kinds then run
    alternately (plain first, then in turn which goes first: `.DD..DD.`) and plain decoding takes over. Once drafting
    calls become faster, the probes of drafting find it and, after another head-to-head, drafting takes over."""
    keys = _process_expecting("drafting")
    kinds = _choose_calls(clock, keys, [(1.0, 1.25)] * 60)
    assert kinds == "." + "DD." * 2 + ".DD..DD." + "." * 45
    kinds = _choose_calls(clock, keys, [(1.0, 0.8)] * 600)
    assert kinds[:200] == "." * 200  # clearly slower: a drafting call only after 256 plain ones
    switch = kinds.index("D..DD..D")  # a head-to-head, drafting challenging
    assert "DD" not in kinds[:switch]  # nothing but probes before it
    after = kinds[switch + 8 :]  # then drafting, a plain call after 8, 16, 32, 64, 64, ... drafting ones
    assert ".." not in after and after.count(".") <= len(after) // 40


def test_one_slow_call_right_after_a_head_to_head_does_not_start_another(clock):
    """Both kinds' windows hold only a head-to-head's readings after it: the means of the expected kind's window
    start another only once it holds `_FRESH_CALLS` calls of its own, not at the first slow one."""
    keys = _process_expecting("drafting")
    kinds = _choose_calls(clock, keys, [(1.0, 1.25)] * 20)
    assert kinds.endswith(".DD..DD." + "." * 5)  # a head-to-head, then plain
    # seven plain calls at 1 and one at 3.5: the plain window's mean above the drafting window's 1.25 for two calls
    kinds = _choose_calls(clock, keys, [(3.5, 1.25)] + [(1.0, 1.25)] * 10)
    assert kinds.startswith(".") and "DD" not in kinds, kinds  # probes of drafting, but no head-to-head


def test_a_head_to_head_runs_the_kinds_in_turn_and_the_challenger_first_every_other_pair():
    """Pairs of adjacent calls, the challenger first in every other pair: a trend in the calls' costs (rows sorted by
    length) cancels over two pairs."""
    head_to_head = HeadToHead(challenger_drafts=True)
    assert [head_to_head.next_drafts() for _ in range(8)] == [True, False, False, True, True, False, False, True]


def _head_to_head(ratios) -> HeadToHead:
    """A head-to-head of plain calls at 1 per step, drafting calls at `ratios`, the expected kind plain, its calls so
    far two per pair."""
    return HeadToHead(challenger_drafts=True, calls=2 * len(ratios), pairs=[[1.0, ratio] for ratio in ratios])


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        ([0.8] * 3, None),  # fewer than four pairs: open
        ([0.8] * 4, True),  # four pairs alike: drafting faster
        ([1.3, 1.25, 1.3, 1.35], False),
        ([0.8, 0.8, 0.8, 0.8, 0.8], None),  # an odd number of pairs decides only at the end (a trend would favour one)
        ([0.8, 10.0, 0.85, 0.8], False),  # one slow drafting call alone: what drafting costs, kept in the sums
        ([0.8, 0.85, 0.8, 10.0], False),  # ... at the head-to-head's end too (nothing after it tells a burst)
        ([10.0, 0.85, 0.8, 0.8], False),  # ... and at its start
        ([0.8, 2.5, 0.85, 0.8, 2.5, 0.85], False),  # mostly faster, now and then much slower: slower on the sums
        ([0.9, 1.1, 0.85, 1.15], None),  # the sums' ratio within the pairs' noise: more pairs
        ([0.9, 1.1, 0.85, 1.15, 0.9, 0.95], True),  # six pairs: the sums' side decides
        ([1.0] * 6, False),  # a tie at six: the expected kind (plain, here) stays
    ],
)
def test_a_head_to_head_decides_by_its_pairs_sums(ratios, verdict):
    """The verdict compares the pairs' sums (what the windows' means compare) once their ratio is sure, or at six
    pairs; an odd count decides only when the head-to-head's calls ran out."""
    assert _head_to_head(ratios).verdict() is verdict


def test_a_pair_half_in_a_burst_is_left_out_of_a_head_to_head():
    """Drafting calls at 0.8 per step, plain at 1; from the fourth call (the second pair's drafting call) on, every
    call ten times slower. The second pair, half in the burst, is left out (the call after its slow one slowed
    too); the others decide for drafting. A slow call whose neighbour was not slowed stays (the case above)."""
    head_to_head = HeadToHead(
        challenger_drafts=True, calls=8, pairs=[[1.0, 0.8], [1.0, 8.0], [10.0, 8.0], [10.0, 8.0]]
    )
    assert head_to_head.kept_pairs() == [(1.0, 0.8), (10.0, 8.0), (10.0, 8.0)]
    assert head_to_head.verdict() is True


def test_a_call_slowed_less_than_twice_is_not_taken_for_a_burst():
    """The second pair is farthest from the others and the call after its slow drafting call was slowed too, but
    only 1.75 and 1.625 times the fastest drafting call: the spread of drafting's own costs, every pair kept. A
    fast call alone is kept too (its pair is farthest, but nothing in it is slower than its kind's fastest)."""
    head_to_head = HeadToHead(challenger_drafts=True, calls=8, pairs=[[1.0, 0.8], [1.0, 1.4], [1.0, 1.3], [1.0, 0.8]])
    assert head_to_head.kept_pairs() == [(1.0, 0.8), (1.0, 1.4), (1.0, 1.3), (1.0, 0.8)]
    head_to_head = HeadToHead(challenger_drafts=True, calls=8, pairs=[[1.0, 1.2], [1.0, 0.5], [1.0, 1.2], [1.0, 1.21]])
    assert len(head_to_head.kept_pairs()) == 4


def test_a_settled_head_to_head_replaces_both_windows_with_its_kept_pairs():
    """The verdict becomes the expected kind, its pairs both kinds' windows (readings of the same moments), less the
    pair half in a burst (its slow reading would stand for the kind until the rare probes replaced it)."""
    choices = CallChoices(drafting_expected=False, since_probe=5)
    choices.plain_call_steps.extend([3.0] * 16)  # slowed by a burst: what started the head-to-head
    head_to_head = HeadToHead(
        challenger_drafts=True, calls=8, pairs=[[1.0, 0.8], [1.0, 8.0], [10.0, 8.0], [10.0, 8.0]]
    )
    choices.settle(True, head_to_head)
    assert list(choices.plain_call_steps) == [1.0, 10.0, 10.0]
    assert list(choices.drafting_call_steps) == [0.8, 8.0, 8.0]
    assert choices.drafting_expected is True and choices.since_probe == 0


@pytest.mark.parametrize(
    ("logs", "verdict"),
    [
        # no pair left out; the sums -0.146 in log, the spread 1.4826 * 0.05: 3.9 errors over √4
        ([-0.30, -0.05, -0.10, -0.15], True),
        # no pair left out; the sums -0.159 in log, the spread 1.4826 * 0.125: 1.7 errors
        ([-0.45, 0.05, -0.10, -0.20], None),
    ],
)
def test_a_head_to_head_is_sure_at_four_pairs_only_beyond_twice_its_noise(logs, verdict):
    """Four pairs decide when their sums differ by more than `_SURE_ERRORS` (2) times the pairs' spread (the median
    absolute deviation of their log ratios, times 1.4826) over √4, and leave it open below."""
    assert _head_to_head([math.exp(value) for value in logs]).verdict() is verdict


def test_a_head_to_head_pairs_its_calls_by_their_place_when_one_was_not_timed():
    """A call that ended untimed leaves its pair incomplete; the later pairs stay pairs of adjacent calls, and once
    the head-to-head's calls ran out the five timed pairs decide."""
    head_to_head = HeadToHead(challenger_drafts=True)
    plain = [1.0, 1.3, 0.9, 1.2, 1.0, 1.1]
    drafting = [None, 1.25, 0.55, 0.9, 0.7, 0.8]  # the first drafting call calibrated a table: not timed
    for call in range(12):
        drafts = head_to_head.next_drafts()
        step = drafting[call // 2] if drafts else plain[call // 2]
        if step is not None:
            head_to_head.record(call, drafts, step)
    assert head_to_head.pairs[1] == [1.3, 1.25] and head_to_head.pairs[0] == [1.0, None]
    assert head_to_head.verdict() is True


def test_a_head_to_head_of_calls_not_timed_ends_without_a_verdict():
    """Calls that were not timed (no step of output) give no pairs: after twice `_MAX_PAIRS` calls the head-to-head
    ends and the expected kind stays."""
    schedule = DraftLengthSchedule(object, None, 2, (1, 0.0, False), torch.device("cpu"))
    schedule._tables[(1, "cpu", 2)] = IterationCostTable([1.0, 1.1, 1.2])
    schedule.acceptance.update(2, [0] * 50)  # plain expected
    assert not schedule.drafts_this_call(1)
    choices = schedule._call_choices[(1, "cpu", 2)]
    choices.plain_call_steps.extend([1.0, 1.1, 1.0])
    choices.drafting_call_steps.extend([0.8, 0.7, 0.8])  # drafting faster on the means: a head-to-head
    decisions = [schedule.drafts_this_call(1) for _ in range(12)]
    assert decisions == [True, False, False, True] * 3
    assert choices.head_to_head is not None
    schedule.drafts_this_call(1)
    assert choices.head_to_head is None and choices.drafting_expected is False


def test_drafting_calls_clearly_slower_than_plain_ones_are_probed_rarely():
    """Drafting calls timed slower per step than plain ones by more than their noise explains (as at batch 16 on a
    CPU) are probed after 256 plain calls instead of 2, 4, ... 32; once a probe makes the difference unclear, the
    doubling intervals apply again. (At one row after 64: the next test.)"""
    schedule = DraftLengthSchedule(object, None, 2, (1, 0.0, False), torch.device("cpu"))
    schedule._tables[(16, "cpu", 2)] = IterationCostTable([1.0, 1.1, 1.2])
    schedule.acceptance.update(2, [0] * 50)  # the table expects plain calls
    assert not schedule.drafts_this_call(16)
    choices = schedule._call_choices[(16, "cpu", 2)]
    choices.plain_call_steps.extend([1.0, 1.1, 1.0])
    choices.drafting_call_steps.extend([1.4, 1.45, 1.35])  # 0.37 slower on the mean, 8 standard errors
    decisions = [schedule.drafts_this_call(16) for _ in range(256)]
    assert decisions == [False] * 255 + [True]  # the first call above counted towards the interval
    choices.drafting_call_steps.append(1.0)  # that probe ran at plain speed (and the means are 2.5 errors apart)
    decisions = [schedule.drafts_this_call(16) for _ in range(5)]
    assert decisions == [False] * 4 + [True]  # the interval doubled after the probe, from 2 to 4
    choices.drafting_call_steps.extend([1.4, 1.45, 1.35, 1.4])  # clearly slower again, then a fast probe
    assert not any(schedule.drafts_this_call(16) for _ in range(255))
    choices.drafting_call_steps.append(1.02)  # the means still 5 errors apart, but the latest call is not slower
    assert schedule.drafts_this_call(16)  # the doubling intervals at once: 255 calls since the last probe exceed 8
    choices.plain_call_steps.extend([1.0] * 13)
    # the latest a tenth slower and the means 5 errors apart, but less than a tenth
    choices.drafting_call_steps.extend([1.05, 1.06, 1.05] * 5 + [1.2])
    decisions = [schedule.drafts_this_call(16) for _ in range(17)]
    assert decisions == [False] * 16 + [True]


def test_at_one_row_clearly_slower_drafting_calls_are_probed_after_64_plain_ones():
    """A process's first rows can be its hardest for the drafter: at one row, drafting calls timed clearly slower are
    probed after 64 plain calls, not 256; a probe that runs fast brings back the doubling intervals at once."""
    choices = CallChoices(one_row=True)
    drafting_steps = iter([1.4] * 4 + [0.9] * 2)  # the warm-up's three and the first probe slow, then fast ones
    made = ""
    for _ in range(9 + 65 + 65 + 17):
        call = choices.next_call(lambda plain_call_steps: False)  # the table expects plain calls
        choices.record(call, call.drafts, next(drafting_steps) if call.drafts else 1.0)
        made += "D" if call.drafts else "."
    # the warm-up, then 64 plain calls and a slow probe, 64 more and a fast one, after which the doubling interval
    # applies at once (2 doubled at the warm-up's third probe and at each probe since: 16)
    assert made[:9] == "..D..D..D" and made[9:74] == "." * 64 + "D"
    assert made[74:139] == "." * 64 + "D" and made[139:] == "." * 16 + "D"


def test_a_drafting_call_is_timed_per_step_whole_unless_its_width_was_calibrated(clock):
    """A call that started while its width's table was calibrated is not timed (no choices were made for it); one
    whose rows finished into a width being calibrated is timed whole (those iterations decoded too)."""
    schedule = DraftLengthSchedule(object, None, 2, (1, 0.0, False), torch.device("cpu"))
    assert schedule.drafts_this_call(1)  # no table yet: this call calibrates it
    schedule.start_drafting_call()
    schedule.observe_drafting_call(4)
    assert not schedule._call_choices
    schedule._tables[(1, "cpu", 2)] = IterationCostTable([1.0, 1.1, 1.2])
    assert schedule.drafts_this_call(1)
    schedule.start_drafting_call()
    clock.spend(7.0)  # 8 units from start to end: 2 per step of 4
    schedule.observe_drafting_call(4)
    assert list(schedule._call_choices[(1, "cpu", 2)].drafting_call_steps) == [2.0]
    schedule._tables[(4, "cpu", 2)] = IterationCostTable([1.0, 1.1, 1.2])
    assert not schedule.drafts_this_call(4)  # above one row a plain call is timed before the table judges
    schedule.start_plain_call()
    clock.spend(15.0)  # 16 units: 4 per step of 4, slower than the table's drafting
    schedule.observe_plain_call(4)
    assert schedule.drafts_this_call(4)
    schedule.start_drafting_call()
    assert schedule.next_k(2, 2) == 0  # rows finished into width 2: its table is calibrated, from k = 0
    schedule.observe([0, 0])
    clock.spend(5.0)  # 8 units from start to end, the iteration's two readings included
    schedule.observe_drafting_call(4)
    assert list(schedule._call_choices[(4, "cpu", 2)].drafting_call_steps) == [2.0]
    assert not schedule._tables[(2, "cpu", 2)].covers(0)


def test_the_cost_table_is_asked_only_until_both_kinds_were_timed():
    """Before three calls of each kind were timed, the caller's table decides (given the plain calls timed so far);
    after, the calls' means do and the table is not consulted."""
    asked = []

    def table(plain_call_steps):
        asked.append(list(plain_call_steps))
        return True

    choices = CallChoices()
    assert choices.next_call(table).drafts and asked == [[]]
    choices.plain_call_steps.extend([1.0, 1.1, 1.0])
    choices.drafting_call_steps.extend([1.4, 1.5])
    choices.next_call(table)
    assert asked[-1] == [1.0, 1.1, 1.0]
    choices.drafting_call_steps.append(1.45)
    asked.clear()
    choices.next_call(table)
    assert asked == []


def test_the_variance_is_the_sample_variance():
    values = [1.0, 1.1, 1.05, 0.98, 1.2, 1.01, 0.97, 1.03]
    assert _variance(values) == pytest.approx(statistics.variance(values), rel=1e-12)
    assert _variance([2.0, 2.0]) == 0.0
