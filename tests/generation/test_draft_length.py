"""A draft length chosen as decoding runs (`num_draft_tokens="auto"`): exact whatever k it takes, k = 0 a plain
verifier step, and the choice a deterministic function of the cost table and the acceptance counts."""

from __future__ import annotations

import math
import weakref

import pytest
import torch
from conftest import VOCAB_SIZE, StepClock, WeakKey, build_verifier, generate_with_drafter, make_source_batch
from oracle_drafters import OracleDrafter
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from specdec_hf.generation import draft_length
from specdec_hf.generation.draft_length import (
    AcceptanceEstimate,
    DraftLengthSchedule,
    ForwardCalibration,
    IterationCostTable,
    choose_draft_length,
    non_decreasing,
)

GREEDY = dict(do_sample=False, num_beams=1)


class SlowWrongDrafter(OracleDrafter):
    """Always wrong, and its call costs ten verifier forwards on the test clock: drafting never pays."""

    def __init__(self, *args, clock, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = clock

    def propose(self, *args, **kwargs):
        self.clock.spend(10.0)
        return super().propose(*args, **kwargs)


pytestmark = pytest.mark.usefixtures("fresh_draft_length_measurements")


def _generate_auto(model, inputs, drafter, **kwargs):
    return generate_with_drafter(model, inputs, drafter, num_draft_tokens="auto", **kwargs)


def _calibrate(model, inputs, drafter, **kwargs) -> None:
    """Call `generate()` with `"auto"` until the cost table of the batch's width is calibrated (in the loop's own
    iterations: over one call or several, by how many iterations a call runs; above one row, in the drafting calls
    run as probes among plain ones)."""
    for _ in range(30):
        _generate_auto(model, inputs, drafter, **kwargs)
        if _calibrated(model, drafter, inputs["input_ids"].shape[0]):
            return
    raise AssertionError("the table of the batch's width was not calibrated in 30 calls")


def _calibrated(model, drafter, rows: int) -> bool:
    """Whether the cost table of a batch width of `rows` rows is calibrated."""
    tables = draft_length._COST_TABLES.get(drafter, {}).get(model, {})
    return any(key[0] == draft_length._rows_bucket(rows) and not table.calibration for key, table in tables.items())


def _with_rows_ending_apart(model, inputs, max_new_tokens: int) -> torch.LongTensor:
    """Set an EOS token on `model` that ends some rows of greedy decoding early and others later or never; returns
    greedy's output with it."""
    plain = model.generate(**inputs, **GREEDY, max_new_tokens=max_new_tokens)
    for candidate in plain[0, 3:].tolist():
        model.generation_config.eos_token_id = candidate
        reference = model.generate(**inputs, **GREEDY, max_new_tokens=max_new_tokens)
        lengths = (reference != model.generation_config.pad_token_id).sum(dim=1)
        if len(set(lengths.tolist())) > 1:
            return reference
    raise AssertionError("no EOS candidate ends the rows at different steps")


# ---------------------------------------------------------------------------------------------------------------
# the choice, on hand-written costs and acceptance
# ---------------------------------------------------------------------------------------------------------------


def test_a_free_verification_of_sure_drafts_takes_the_largest_k():
    assert choose_draft_length([1.0] * 5, [1.0] * 4) == 4


def test_drafts_never_accepted_take_a_plain_step():
    assert choose_draft_length([1.0, 1.1, 1.1], [0.0, 0.0]) == 0


def test_the_choice_weighs_tokens_against_seconds():
    # k=1: 1.5 tokens / 1.2 s = 1.25; k=2: 1.75 / 1.6 = 1.09; k=0: 1 / 1.0
    assert choose_draft_length([1.0, 1.2, 1.6], [0.5, 0.25]) == 1
    # the drafter's call costs more than the drafts bring: a plain step
    assert choose_draft_length([1.0, 1.7, 2.1], [0.5, 0.25]) == 0
    # a probe of drafting takes the best k >= 1 even so
    assert choose_draft_length([1.0, 1.7, 2.1], [0.5, 0.25], drafting=True) == 1


def test_the_choice_is_deterministic_and_takes_the_smallest_of_ties():
    costs, acceptance = [1.0, 2.0, 3.0], [1.0, 1.0]  # every k gives one token per second
    assert {choose_draft_length(costs, acceptance) for _ in range(5)} == {0}


def test_an_iteration_costs_a_base_and_a_cost_per_draft():
    table = IterationCostTable([1.0, 1.0, 1.0, 1.0])
    table.plain_recent.extend([1.2, 1.3])
    # unseen drafting: the forward's own cost per draft (flat here: 0), the base what a plain iteration costs
    assert table.iteration_seconds() == pytest.approx([1.2, 1.2, 1.2, 1.2])
    previous = table.observe(2, 1.5)
    assert previous == (2, 1.5)
    for _ in range(3):  # enough readings for their median to count
        previous = table.observe(3, 1.7, previous)  # one draft more: 0.2 more
        previous = table.observe(2, 1.5, previous)  # one draft less: 0.2 less
    assert table.per_draft == pytest.approx(0.2)
    # base: the lower quartile of the drafting iterations' times less their drafts' (1.5 - 2 * 0.2 = 1.1)
    assert table.iteration_seconds() == pytest.approx([1.2, 1.3, 1.5, 1.7])
    assert table.iteration_seconds(1) == pytest.approx([1.2, 1.3])


def test_the_cost_per_draft_is_read_only_from_consecutive_iterations_one_draft_apart():
    table = IterationCostTable([1.0, 1.5, 2.0, 2.5])
    assert table.per_draft == pytest.approx(0.5)  # before any reading: the forward's own cost per draft
    previous = table.observe(1, 2.0)
    previous = table.observe(3, 4.0, previous)  # two drafts apart: no reading
    assert not table.per_draft_recent
    assert table.observe(0, 1.5, previous) is None  # a plain iteration ends the pair
    previous = table.observe(2, 2.0, None)
    table.observe(1, 2.5, previous)  # one draft less cost more: a reading below the forward's own cost per draft
    assert list(table.per_draft_recent) == [(1, pytest.approx(-0.5))]  # the step from 1 to 2 drafts
    assert table.per_draft == pytest.approx(0.5)  # too few readings: the verifier forward's own cost per draft
    table.per_draft_recent.extend([(1, -0.5)] * 5)
    assert table.per_draft == pytest.approx(0.5)  # a median below what a draft costs the verifier's forward: floored
    flat = IterationCostTable([1.0, 1.0, 1.0])
    flat.per_draft_recent.extend(
        [(1, 0.3), (1, 5.0), (1, 0.2), (1, 0.4)]
    )  # too few yet: a slow moment must not decide
    assert flat.per_draft == 0.0
    flat.per_draft_recent.append((1, 0.35))
    assert flat.per_draft == pytest.approx(0.35)  # the median holds against the slow moment


def test_each_step_between_two_k_costs_what_its_own_readings_say():
    table = IterationCostTable([1.0] * 5)
    table.per_draft_recent.extend([(2, 0.1)] * 5 + [(3, 0.5)] * 5)  # 2 -> 3 drafts cheap, 3 -> 4 dear
    assert table.step_costs(4) == pytest.approx([0.3, 0.1, 0.5])  # 1 -> 2 unread: the median of all readings
    table.drafting_recent.append((3, 2.0))  # k=3 took 2.0: the base (k=1) is 2.0 - 0.3 - 0.1
    assert table.iteration_seconds() == pytest.approx([1.0, 1.6, 1.9, 2.0, 2.5])


def test_step_costs_kept_between_readings_are_what_the_readings_give():
    """The steps' medians are kept until a reading arrives (also once the readings are at their limit, where each
    new one drops the oldest): always what computing them afresh gives."""
    table = IterationCostTable([1.0] * 5)
    generator = torch.Generator().manual_seed(0)
    for index in range(2 * draft_length._RECENT_PER_DRAFT):
        step = 1 + index % 3
        table.per_draft_recent.append((step, float(torch.rand(1, generator=generator))))
        for width in (4, 3):
            expected = table._compute_step_costs(width)
            assert table.step_costs(width) == expected
            assert table.step_costs(width) == expected  # the kept copy, unchanged by a caller
            table.step_costs(width).append(99.0)


def test_no_iteration_costs_less_than_a_plain_forward_and_drafts_still_cost():
    table = IterationCostTable([1.0, 1.1, 1.2])
    table.drafting_recent.extend([(1, 0.2), (2, 0.3)])  # a short cache: less than the calibration's forward
    table.plain_recent.append(0.5)
    # the base floored, and each k at least the plain cost plus what its drafts add to the calibrated forward
    assert table.iteration_seconds() == pytest.approx([1.0, 1.1, 1.2])


def test_drafting_never_looks_cheaper_than_a_plain_iteration_and_its_wider_forward():
    """Drafts come where the drafter finds something (often early, at short caches): their iterations' readings
    can undercut the plain ones taken elsewhere, but a drafting iteration runs all a plain one does and more."""
    table = IterationCostTable([1.0, 1.3, 1.5])
    table.plain_recent.extend([2.0] * 4)
    table.drafting_recent.extend([(1, 2.05)] * 4)  # read where caches were short: barely above a plain iteration
    costs = table.iteration_seconds()
    # k=1: plain + 0.3; k=2: that and one step at the forward's own cost per draft (the slope, 0.25)
    assert costs == pytest.approx([2.0, 2.3, 2.55])
    # what one draft in ten accepted is worth there: not enough for the wider forward (1.1 / 2.3 < 1 / 2.0)
    assert choose_draft_length(costs, [0.1, 0.01]) == 0
    table.drafting_recent.clear()
    table.drafting_recent.extend([(1, 2.6)] * 4)  # dearer than the floor: the readings stand
    assert table.iteration_seconds()[1] == pytest.approx(2.6)


def test_a_floored_base_keeps_the_measured_cost_of_each_draft_above_it():
    """Where the floor lifts k = 1, each draft above it still costs what its step was measured to: the floor must not
    leave only the forward's small differences between k, which would make every draft look nearly free."""
    table = IterationCostTable([1.0, 1.05, 1.10, 1.15, 1.20])
    table.plain_recent.extend([2.0] * 4)
    table.drafting_recent.extend([(1, 1.5)] * 4)  # read at short caches: below a plain iteration
    table.per_draft_recent.extend([(step, 0.2) for step in (1, 2, 3)] * 5)  # each draft more: 0.2
    costs = table.iteration_seconds()
    assert costs == pytest.approx([2.0, 2.05, 2.25, 2.45, 2.65])
    # k = 2, as the measured steps say; at the forward's costs alone ([2.0, 2.05, 2.10, 2.15, 2.20]) k = 4 would win
    assert choose_draft_length(costs, [0.5, 0.25, 0.125, 0.0625]) == 2
    assert choose_draft_length([2.0, 2.05, 2.10, 2.15, 2.20], [0.5, 0.25, 0.125, 0.0625]) == 4


def test_the_schedule_pairs_only_consecutive_timed_drafting_iterations_of_one_table(clock):
    """Readings of a draft's cost come from two iterations one after the other, one k apart, timed with one table:
    not the first iteration of a call, not across an iteration the schedule did not time, not across tables."""
    drafter_key = StepClock()  # any object that can be weakly referenced stands for a drafter
    schedule = DraftLengthSchedule(object, drafter_key, 4, (1, 0.0, False), torch.device("cpu"))
    table = IterationCostTable([1.0] * 5)
    schedule._tables[(1, "cpu", 4)] = table
    schedule.acceptance.update(4, [4] * 200)  # sure drafts: k = 4 is best, its neighbour 3 runs now and then
    ks = []

    def iteration(rows=1):
        k = schedule.next_k(rows, 4)
        clock.spend(0.1 * k)  # a draft costs 0.1 on the test clock
        schedule.observe([k] * rows)
        ks.append(k)

    for _ in range(3 * draft_length._NEIGHBOUR_INTERVAL):
        iteration()
    assert set(ks) == {3, 4} and ks.count(3) == 3  # every fifth drafting iteration a neighbour
    readings = list(table.per_draft_recent)
    assert readings == [(3, pytest.approx(0.1))] * 5  # into and out of each neighbour: the step from 3 to 4
    assert len(table.drafting_recent) == len(ks) - 1  # the call's first iteration is not timed
    schedule.skip()  # an untimed iteration (a length limit) between two timed ones: no pair across it
    before = len(table.per_draft_recent)
    while (table.drafting_iterations + 1) % draft_length._NEIGHBOUR_INTERVAL:
        iteration()
    schedule.skip()
    iteration()  # the neighbour, right after the skip: no reading
    assert ks[-1] == 3 and len(table.per_draft_recent) == before
    other = IterationCostTable([1.0] * 5)
    schedule._tables[(2, "cpu", 4)] = other
    iteration(rows=2)  # another batch width: not paired with the last iteration of the first table
    assert not other.per_draft_recent
    wider = IterationCostTable([1.0] * 5)
    schedule._tables[(4, "cpu", 4)] = wider
    iteration(rows=4)
    wider.drafting_iterations = draft_length._NEIGHBOUR_INTERVAL - 1  # the next is a neighbour, one k apart
    iteration(rows=3)  # a row finished: one table (widths 3 and 4 share it), but no pair across the two widths
    assert ks[-2:] == [4, 3] and not wider.per_draft_recent
    # a later call goes on counting drafting iterations where the table is: short calls take their neighbours too
    count = table.drafting_iterations
    later = DraftLengthSchedule(object, drafter_key, 4, (1, 0.0, False), torch.device("cpu"))
    assert later._tables[(1, "cpu", 4)] is table  # the process's tables, per drafter and verifier
    assert not DraftLengthSchedule(object, StepClock(), 4, (1, 0.0, False), torch.device("cpu"))._tables
    later.next_k(1, 4)
    assert table.drafting_iterations == count + 1


def test_every_few_drafting_iterations_run_a_neighbouring_k():
    neighbour = draft_length._neighbour_now_and_then
    interval = draft_length._NEIGHBOUR_INTERVAL
    choices = [neighbour(3, 8, iteration) for iteration in range(1, 4 * interval + 1)]
    assert choices.count(3) == 4 * interval - 4
    assert sorted(choices[interval - 1 :: interval]) == [2, 2, 4, 4]  # above and below, alternately
    assert {neighbour(1, 8, iteration) for iteration in range(1, 4 * interval + 1)} == {1, 2}  # never k = 0
    assert {neighbour(8, 8, iteration) for iteration in range(1, 4 * interval + 1)} == {7, 8}  # never above the width
    assert {neighbour(1, 1, iteration) for iteration in range(1, 4 * interval + 1)} == {1}


def test_neighbours_run_rarer_once_a_table_has_seen_many_drafting_iterations():
    neighbour = draft_length._neighbour_now_and_then
    warm_up = draft_length._NEIGHBOUR_WARM_UP
    settled = draft_length._SETTLED_NEIGHBOUR_INTERVAL
    early = [neighbour(3, 8, iteration) for iteration in range(1, warm_up + 1)]
    assert early.count(3) == warm_up - warm_up // draft_length._NEIGHBOUR_INTERVAL
    later = [neighbour(3, 8, iteration) for iteration in range(warm_up + 1, warm_up + 8 * settled + 1)]
    assert later.count(3) == 8 * settled - 8 and later.count(2) == later.count(4) == 4  # still both sides


def test_costs_are_made_non_decreasing_in_the_width():
    assert non_decreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert non_decreasing([2.0, 1.0, 1.0]) == pytest.approx([4 / 3] * 3)
    assert non_decreasing([1.0, 2.0]) == [1.0, 2.0]


def test_a_calibration_keeps_the_least_timed_forward_of_each_width_after_its_first():
    calibration = ForwardCalibration.for_widths(3)
    assert calibration.complete_widths() == 0
    order = []
    readings = {0: [100.0, 1.0, 1.5], 1: [100.0, 52.0, 2.0], 2: [100.0, 3.0, 3.5]}  # one slow reading of width 1
    while calibration.complete_widths() < 3:
        width = calibration.next_width(2)
        order.append(width)
        calibration.record(width, readings[width][calibration.seen[width]])
    # round by round, from the narrowest, then from the widest (the cache grows over a call); width 2 joins once
    # widths 0 and 1 were timed
    assert order == [0, 1, 1, 0, 2, 2, 0, 1, 2]
    assert calibration.least == [1.0, 2.0, 3.0]  # each width's first forward untimed, its least kept
    partial = ForwardCalibration.for_widths(3)
    assert [partial.next_width(1) for _ in range(1)] == [0]  # never above the largest width asked for
    partial.record(0, 1.0), partial.record(1, 1.0)
    assert partial.next_width(1) == 1  # the next round, from the widest of those asked for


def _calibrate_by_readings(
    widths: int, readings: dict, plain_seconds: float, tokens_bound: float
) -> tuple[ForwardCalibration, list[int]]:
    """Run a calibration to its end on `readings[width][i]`, the width's i-th forward; returns it and the widths
    run, in order."""
    calibration = ForwardCalibration.for_widths(widths)
    order = []
    while calibration.complete_widths() < calibration.widths_to_time():
        width = calibration.next_width(widths - 1)
        order.append(width)
        calibration.record(width, readings[width][calibration.seen[width]], plain_seconds, tokens_bound)
    return calibration, order


def test_a_calibration_stops_at_the_first_width_no_k_can_pay_at():
    """A plain iteration costs 1.0 and any k is expected to bring at most 2 tokens: a k ≥ w pays only where w's
    forward costs less than 1 + (2 - 1) * 1.0 = 2.0. Width 1 (1.5) leaves a chance; width 2 (3.0) none, for any k
    above it either: the calibration ends there, the wider forwards never run."""
    readings = {width: [cost] * 3 for width, cost in enumerate([1.0, 1.5, 3.0, 4.0, 5.0])}
    calibration, order = _calibrate_by_readings(5, readings, plain_seconds=1.0, tokens_bound=2.0)
    assert calibration.cap == 2 and calibration.widths_to_time() == 3
    assert set(order) == {0, 1, 2} and calibration.seen[3:] == [0, 0]
    # the loop's own work (a plain iteration beyond its forward) is paid once per iteration: with it, wider pays
    calibration, order = _calibrate_by_readings(5, readings, plain_seconds=4.0, tokens_bound=2.0)
    assert calibration.cap is None and set(order) == {0, 1, 2, 3, 4}


def test_one_slow_forward_at_the_frontier_does_not_end_the_calibration():
    """Width 2's first timed forward is slow (9.0), its second fast (1.2): the calibration waits for all of a
    width's forwards before it stops there, and goes on to width 3."""
    readings = {0: [1.0] * 3, 1: [1.0] * 3, 2: [9.0, 9.0, 1.2], 3: [1.3] * 3}
    calibration, order = _calibrate_by_readings(4, readings, plain_seconds=1.0, tokens_bound=2.0)
    assert calibration.cap is None and calibration.least == [1.0, 1.0, 1.2, 1.3]
    assert order.index(3) > order.index(2) + 2  # width 3 only after width 2's last forward


def test_without_a_bound_every_width_is_timed_even_at_zero_cost():
    readings = {width: [0.0] * 3 for width in range(4)}  # a clock that never moves
    calibration, order = _calibrate_by_readings(4, readings, plain_seconds=0.0, tokens_bound=math.inf)
    assert calibration.cap is None and set(order) == {0, 1, 2, 3}


def test_a_table_whose_calibration_stops_is_for_the_widths_it_timed_until_a_rule_expects_more():
    """The table stops at width 2 for a rule expecting at most 2 tokens an iteration: its largest k is 2. A rule
    expecting 3.5 reopens it (width 2's forward, 3.0, is below 1 + (3.5 - 1) * 1.0) and its calibration goes on above
    the cap, keeping what it timed; one expecting no more than the first does not."""
    table = IterationCostTable.uncalibrated(4)
    table.plain_recent.append(1.0)  # a plain iteration: its forward and nothing around it
    costs = [1.0, 1.5, 3.0, 3.2, 3.4]
    while table.calibration is not None:
        width = table.calibration.next_width(4)
        table.observe_forward(width, costs[width], tokens_bound=2.0)
    assert table.largest_k == 2 and table.covers(2) and table.verify_seconds == [1.0, 1.5, 3.0]
    assert len(table.iteration_seconds()) == 3 and table.stopped_calibration.cap == 2
    assert not table.reopen_calibration(2.0) and table.calibration is None
    assert table.reopen_calibration(3.5)
    assert table.calibration is not None and table.calibration.frontier == 3 and table.largest_k == 4
    assert table.covers(2) and not table.covers(3)  # the timed widths kept, the wider ones to time
    while table.calibration is not None:
        width = table.calibration.next_width(4)
        assert width >= 3  # the widths up to the old cap are complete
        table.observe_forward(width, costs[width], tokens_bound=3.5)
    assert table.largest_k == 4 and table.verify_seconds == costs


def test_a_rule_expecting_more_tokens_calibrates_a_stopped_table_again(clock):
    """A table stopped at k = 1 under a rule whose drafts are seldom accepted is shared by every rule of the pair: a
    call of that rule chooses from it; a call of a rule whose drafts are mostly accepted calibrates it again."""
    verifier, drafter = WeakKey(), WeakKey()
    seldom = DraftLengthSchedule(verifier, drafter, 4, ("greedy", 1, 0.0), torch.device("cpu"))
    seldom.acceptance.update(2, [0] * 200)
    table = seldom._tables[(1, "cpu", 4)] = IterationCostTable.uncalibrated(4)
    table.plain_recent.append(1.0)
    while table.calibration is not None:
        width = table.calibration.next_width(4)
        table.observe_forward(width, [1.0, 1.5, 3.0, 3.2, 3.4][width], seldom.acceptance.tokens_upper_bound(4))
    assert table.largest_k == 1
    seldom.drafts_this_call(1)
    assert table.calibration is None and seldom._call_choices_now is not None  # chosen from the stopped table
    often = DraftLengthSchedule(verifier, drafter, 4, ("greedy", 3, 1.0), torch.device("cpu"))
    often.acceptance.update(2, [2] * 200)
    assert often.drafts_this_call(1) and often._call_choices_now is None  # calibrating again
    assert table.calibration is not None and table.largest_k == 4


def _stopped_table(costs: list[float], tokens_bound: float, plain_seconds: float = 1.0) -> IterationCostTable:
    """A table whose calibration ran to its end on `costs[w]` per width under `tokens_bound`."""
    table = IterationCostTable.uncalibrated(len(costs) - 1)
    table.plain_recent.append(plain_seconds)
    while table.calibration is not None:
        width = table.calibration.next_width(len(costs) - 1)
        table.observe_forward(width, costs[width], tokens_bound)
    return table


def test_a_reopened_calibration_judges_by_the_plain_iteration_and_forgets_idle_calls():
    """Reopening weighs the cap's forward against the recent plain iterations (the loop's own work is paid once per
    iteration), not the plain forward alone; and calls that found the table complete were not idle calls."""
    table = _stopped_table([1.0, 1.5, 3.0, 3.2, 3.4], tokens_bound=2.0)
    table.stopped_calibration.idle_calls = draft_length._MAX_IDLE_CALLS
    assert not table.reopen_calibration(2.5)  # 3.0 < 1.0 + 1.5 * 1.0: no
    table.plain_recent.extend([2.0] * 4)  # the loop's own work: a plain iteration costs twice its forward
    assert table.reopen_calibration(2.5)  # 3.0 < 1.0 + 1.5 * 2.0
    assert table.calibration.idle_calls == 0 and table.calibration.seen_after_last_call == sum(table.calibration.seen)


def test_a_narrower_width_rows_finish_into_is_reopened_for_a_rule_expecting_more(clock):
    """A call of a rule whose drafts are mostly accepted starts at batch 4 and goes on at batch 2 once rows finish:
    the batch-2 table, stopped at k = 1 under a rule whose drafts were seldom accepted, is calibrated on above it."""
    verifier, drafter = WeakKey(), WeakKey()
    often = DraftLengthSchedule(verifier, drafter, 4, ("greedy", 3, 1.0), torch.device("cpu"))
    often.acceptance.update(2, [2] * 200)
    narrow = often._tables[(2, "cpu", 4)] = _stopped_table([1.0, 1.5, 3.0, 3.2, 3.4], tokens_bound=1.03)
    often._tables[(4, "cpu", 4)] = IterationCostTable([1.0, 1.0, 1.0, 1.0, 1.0])
    assert narrow.largest_k == 1 and narrow.stopped_calibration is not None
    often.drafts_this_call(4)
    often.next_k(4, 4)
    often.observe([2] * 4)
    often.next_k(2, 4)  # rows finished: the narrower table
    assert narrow.calibration is not None and narrow.largest_k == 4 and often._times_forward


def test_the_tokens_bound_takes_unverified_drafts_at_the_last_verified_ones_estimate():
    estimate = AcceptanceEstimate()
    assert estimate.tokens_upper_bound(8) == 9.0  # nothing verified: every draft may be accepted
    estimate.update(2, [2] * 98 + [0] * 2)  # the first two drafts of 100 rows: 98 accepted both
    first, second = estimate.probabilities(2)
    assert estimate.tokens_upper_bound(8) == pytest.approx(1.0 + first + second + 6 * second)
    assert estimate.tokens_upper_bound(8) > 1.0 + sum(estimate.probabilities(8))  # the prior's 0.6^i is no bound
    assert estimate.tokens_upper_bound(1) == pytest.approx(1.0 + first)  # fewer drafts than were verified


def test_a_table_grows_its_forwards_from_width_zero_up_as_they_complete():
    table = IterationCostTable.uncalibrated(2)
    assert table.largest_k == 2 and not table.covers(0) and table.calibration is not None
    for width, seconds in [(0, 9.0), (1, 9.0), (2, 9.0), (2, 3.0), (1, 2.5), (0, 1.0), (0, 1.0), (1, 2.5)]:
        table.observe_forward(width, seconds)
    # widths 0 and 1 ran all their forwards, width 2 one timed of two: the table covers k up to 1
    assert table.covers(1) and not table.covers(2) and table.verify_seconds == [1.0, 2.5]
    assert table.forward_per_draft == pytest.approx(1.5)
    table.observe_forward(2, 2.0)  # cheaper than width 1: made non-decreasing
    assert table.calibration is None and table.covers(2)
    assert table.verify_seconds == [1.0, 2.25, 2.25]
    assert table.forward_per_draft == pytest.approx(0.625)  # derived again from the grown forwards


def test_a_table_is_calibrated_in_the_loops_own_iterations(clock):
    """A batch width without a cost table takes every k in turn, its forwards timed where the loop runs them (not
    the call's first iteration), with no forward of its own; above one row, calls decode plainly until then, and the
    drafting calls they run as probes calibrate it, their time not taken as a drafting call's; a width rows finish into
    is calibrated the same way; once complete, k is chosen from the table."""
    verifier, drafter = WeakKey(), WeakKey()
    schedule = DraftLengthSchedule(verifier, drafter, 2, (1, 0.0, False), torch.device("cpu"))
    schedule.acceptance.update(2, [2] * 500)  # drafts sure: drafting pays

    def plain_call(rows: int) -> None:
        call = DraftLengthSchedule(verifier, drafter, 2, (1, 0.0, False), torch.device("cpu"))
        assert not call.drafts_this_call(rows)  # no table, or one being calibrated: plain above one row
        call.start_plain_call()
        call.observe_plain_call(10)
        assert call._calibration_probed is schedule._tables[(rows, "cpu", 2)].calibration  # timed for it

    def iteration(rows: int, limit: int = 2) -> int:
        k = schedule.next_k(rows, limit)
        forwards = []
        schedule.run_verification(lambda: forwards.append(k))  # the loop's forward, timed or not
        assert forwards == [k]  # run once, by the schedule
        schedule.observe([k] * rows)
        return k

    plain_call(4)
    plain_call(4)
    calibration = schedule._tables[(4, "cpu", 2)].calibration
    assert len(calibration.plain_call_steps) == 2
    assert schedule.drafts_this_call(4)  # a drafting call after two plain ones: the loop calibrates the table
    schedule.start_drafting_call()
    ks = [iteration(4) for _ in range(10)]
    table = schedule._tables[(4, "cpu", 2)]
    # the first iteration is not timed: width 0 again, then round by round, width 2 once 0 and 1 were timed
    assert ks == [0, 0, 1, 1, 0, 2, 2, 0, 1, 2] and table.calibration is None
    assert table.verify_seconds == [1.0, 1.0, 1.0]  # the step clock: one unit a forward
    assert schedule.next_k(4, 2) == 2  # chosen from the table now: sure drafts
    schedule.observe([2] * 4)
    schedule.observe_drafting_call(10)
    assert (4, "cpu", 2) not in schedule._call_choices  # no choice made: plain calls and a probe calibrating it
    # rows finished into a width without a table: it is calibrated as decoding goes on
    assert iteration(2) == 0 and not schedule._tables[(2, "cpu", 2)].covers(0)
    assert iteration(2, limit=1) == 1  # the next round goes as high as the length limit allows
    assert schedule._tables[(2, "cpu", 2)].calibration.seen == [1, 1, 0]
    plain_call(2)  # still being calibrated: plain
    later = DraftLengthSchedule(verifier, drafter, 2, (1, 0.0, False), torch.device("cpu"))
    later.drafts_this_call(4)
    assert later._call is not None and later._table is table  # a table: the calls choose, by it


def test_the_iteration_after_an_unscheduled_first_one_is_timed(clock):
    """A drafter reading the verifier's states has none at a call's first iteration, which runs unscheduled
    (`skip`): it projected the source, so the next iteration's forward is timed for the calibration."""
    schedule = DraftLengthSchedule(WeakKey(), WeakKey(), 2, (1, 0.0, False), torch.device("cpu"))
    schedule.skip()
    assert schedule.next_k(1, 2) == 0
    schedule.run_verification(lambda: None)
    assert schedule._tables[(1, "cpu", 2)].calibration.seen == [1, 0, 0]


def test_calls_that_cannot_reach_the_wider_k_choose_once_the_k_they_reach_are_calibrated(clock):
    """A call whose timed iterations can take k ≤ 2 never times the forwards of k = 3 or 4: once those up to 2 are,
    its kind is chosen (else short calls would draft without a choice for ever), from the k it can reach; calls of a
    larger budget wait for all. A call too short to time any drafting k decodes plainly, unrecorded, until k = 1 is
    timed (in the loop, its calibrating first iteration a plain step, it would take plain steps only)."""
    schedule = DraftLengthSchedule(WeakKey(), WeakKey(), 4, (1, 0.0, False), torch.device("cpu"))
    table = schedule._tables[(1, "cpu", 4)] = IterationCostTable.uncalibrated(4)
    for width in (0, 1, 2):
        for _ in range(1 + draft_length._CALIBRATION_ROUNDS):
            table.observe_forward(width, 1.0 + width)
    assert table.covers(2) and not table.covers(3)
    assert schedule.drafts_this_call(1, largest_k=10) and schedule._call_choices_now is None  # waits for k = 3, 4
    asked = []
    schedule._table_expects_drafting = lambda table, width, several_rows, steps: asked.append(width) or True
    assert schedule.drafts_this_call(1, largest_k=2) and schedule._call_choices_now is not None
    assert asked == [2]  # the table asked about the k the call reaches only
    assert schedule.drafts_this_call(1, largest_k=0) and asked == [2, 1]  # k = 1 was timed: chosen
    later = DraftLengthSchedule(WeakKey(), WeakKey(), 4, (1, 0.0, False), torch.device("cpu"))
    later._tables[(1, "cpu", 4)] = IterationCostTable.uncalibrated(4)
    later._tables[(1, "cpu", 4)].observe_forward(0, 1.0)
    assert not later.drafts_this_call(1, largest_k=0) and later._call_choices_now is None  # k = 1 never timed
    later.start_plain_call()
    later.observe_plain_call(2)  # not recorded: no choice was made
    assert not later._call_choices
    assert not later.drafts_this_call(2, largest_k=0)  # no table at all: plainly too


def test_a_call_whose_widest_timed_k_is_calibrated_drafts_from_its_first_iteration(clock):
    """The table covers k ≤ 3, all a call of this budget can time: its first iteration (whose length limit allows
    k = 4) takes the best covered k, untimed, instead of the plain step a calibrating call's first iteration takes."""
    schedule = DraftLengthSchedule(WeakKey(), WeakKey(), 4, (1, 0.0, False), torch.device("cpu"))
    table = schedule._tables[(1, "cpu", 4)] = IterationCostTable.uncalibrated(4)
    for width in range(4):
        for _ in range(1 + draft_length._CALIBRATION_ROUNDS):
            table.observe_forward(width, 1.0 + 0.01 * width)
    schedule.acceptance.update(4, [4] * 500)  # sure drafts
    schedule.drafts_this_call(1, largest_k=3)
    assert schedule.next_k(1, 4) == 3 and not schedule._times_forward
    wider = DraftLengthSchedule(WeakKey(), WeakKey(), 4, (1, 0.0, False), torch.device("cpu"))
    wider._tables[(1, "cpu", 4)] = table
    assert wider.drafts_this_call(1, largest_k=4)  # a call that can time k = 4 calibrates it
    assert wider.next_k(1, 4) == 0  # its first iteration a plain step


def test_the_largest_timed_k_is_the_second_iterations_limit():
    """After a first iteration that commits one token: the length limit, and the learned positions."""
    from transformers.generation.stopping_criteria import MaxLengthCriteria, StoppingCriteriaList

    from specdec_hf.generation.api import _largest_timed_k

    class Model:
        config = type("Config", (), {"max_position_embeddings": 10})()

    class Drafter:
        max_positions = None

    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=20)])
    prompt = torch.zeros(2, 3, dtype=torch.long)  # a decoder prompt of three tokens
    assert _largest_timed_k(Model(), Drafter(), criteria, prompt) == 10 - 4  # the positions: 4 held at iteration 2
    Drafter.max_positions = 64
    Model.config.max_position_embeddings = None
    assert _largest_timed_k(Model(), Drafter(), criteria, prompt) == 20 - 4 - 1  # the length: k ≤ max_length - len - 1


def test_a_width_whose_calls_never_time_its_table_is_chosen_by_the_calls_alone(clock):
    """Rows that finish at a call's first iteration go on in a narrower width. Above one row, calls decode plainly
    while their width's table is first calibrated, and drafting calls run among them as probes calibrate it (no
    choice of the width's calls); probes that time none of its forwards, `_MAX_IDLE_CALLS` in a row, hand the choice
    to the calls' own timings (drafting until plain calls are timed); a probe that times one starts the count again."""
    verifier, drafter = WeakKey(), WeakKey()
    table = IterationCostTable.uncalibrated(2)
    table.observe_forward(0, 1.0)

    def call(times_a_forward: bool) -> tuple[DraftLengthSchedule, bool]:
        schedule = DraftLengthSchedule(verifier, drafter, 2, (1, 0.0, False), torch.device("cpu"))
        schedule._tables[(4, "cpu", 2)] = table
        drafts = schedule.drafts_this_call(4)
        if drafts:
            schedule.start_drafting_call()
            if times_a_forward:
                table.observe_forward(1, 1.0)
            schedule.observe_drafting_call(3)
        else:
            schedule.start_plain_call()
            schedule.observe_plain_call(3)
        return schedule, drafts

    def calls_until_a_probe(times_a_forward: bool) -> str:
        kinds = ""
        while not kinds.endswith("D"):
            schedule, drafts = call(times_a_forward)
            assert schedule._call_choices_now is None and schedule._calibration_probed is table.calibration
            kinds += "D" if drafts else "."
        return kinds

    assert calls_until_a_probe(False) == "..D"  # plain calls first, a drafting one after two
    for _ in range(draft_length._MAX_IDLE_CALLS - 1):
        calls_until_a_probe(False)
    assert table.calibration.idle_calls == draft_length._MAX_IDLE_CALLS - 1
    calls_until_a_probe(True)
    assert table.calibration.idle_calls == 0  # progress: counted anew
    for _ in range(draft_length._MAX_IDLE_CALLS):
        calls_until_a_probe(False)
    chosen, drafts = call(False)
    assert chosen._call_choices_now is not None and drafts  # the calls decide, drafting first
    choices = chosen._call_choices_now
    assert len(choices.drafting_call_steps) == 1 and not choices.plain_call_steps  # timed as a drafting call
    assert table.calibration.seen == [1, 1, 0]  # the table left as its calls timed it, not taken as calibrated


def test_calibrating_probes_come_at_once_after_cheap_ones_and_less_often_after_costly_ones():
    """Above one row, a drafting call runs as a probe that calibrates the width's table after 2 plain calls; after a
    probe at most `_CHEAP_PROBE_SLOWDOWN` times slower per step than the plain calls timed for the calibration the
    next call probes too (where drafting may pay, calibrating costs about what plain calls do), after a costlier one
    the interval doubles (at a wide batch on a CPU a probe costs several plain calls), from 2 and up to 32."""
    calibration = ForwardCalibration.for_widths(3)

    def kinds(calls: int) -> str:
        return "".join("D" if calibration.probe_due() else "." for _ in range(calls))

    assert kinds(3) == "..D"
    calibration.record_probe(1.1)  # no plain call timed: nothing to judge by
    assert kinds(3) == "..D"
    calibration.plain_call_steps.extend([0.9, 1.1])
    calibration.record_probe(1.2)  # cheap
    assert kinds(2) == "DD"
    calibration.record_probe(1.3)  # costly: after 2 (twice none, at least 2)
    assert kinds(3) == "..D"
    calibration.record_probe(2.5)
    assert kinds(5) == "....D"
    for _ in range(4):
        calibration.record_probe(2.5)
    assert calibration.probe_interval == draft_length._MAX_CALIBRATION_PROBE_INTERVAL == 32


def test_calibrating_probes_are_counted_for_the_width_whatever_each_calls_rule(clock):
    """Sampling settings that change every call (each a rule of its own) share the width's calibration and its
    probes: above one row a drafting probe still comes after 2 plain calls, and the table is calibrated."""
    model = build_verifier("bart")
    model.register_forward_hook(lambda *args: clock.spend(10.0))
    inputs = make_source_batch(4, seed=3, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 2, "right")
    drafted = []
    for call in range(30):
        sampled = dict(do_sample=True, top_k=1, temperature=0.5 + 0.01 * call)  # a rule never seen before
        output = _generate_auto(model, inputs, drafter, max_new_tokens=20, **sampled)
        assert torch.equal(output.sequences, reference)
        drafted.append(output.speculative_stats.drafter_calls > 0)
        if _calibrated(model, drafter, 4):
            break
    assert drafted[:3] == [False, False, True] and _calibrated(model, drafter, 4)


def test_tables_that_last_one_call_are_calibrated_by_the_loop_at_once_above_one_row_too():
    """A drafter that cannot be weakly referenced has cost tables for its call only: above one row too, its calls draft
    and calibrate at once (plain calls waiting for probes counted across calls would never draft)."""
    unhashable = []  # as a dataclass drafter without `eq=False` or `__weakref__` would be
    schedule = DraftLengthSchedule(WeakKey(), unhashable, 2, (1, 0.0, False), torch.device("cpu"))
    assert not schedule._tables_kept
    assert schedule.drafts_this_call(4) and schedule._calibration_probed is None


def test_a_calibration_reopened_above_its_cap_is_timed_by_the_loop_at_once(clock):
    """A width whose calibration stopped at its cap and was reopened (a rule expecting more tokens) was found worth
    drafting up to the cap: above one row too, its calls draft to time the widths above it, without plain calls
    first."""
    schedule = DraftLengthSchedule(WeakKey(), WeakKey(), 2, (1, 0.0, False), torch.device("cpu"))
    table = schedule._tables[(4, "cpu", 2)] = IterationCostTable.uncalibrated(2)
    table.calibration.reopened = True
    assert schedule.drafts_this_call(4) and schedule._call_choices_now is None


def test_calls_whose_rows_finish_at_their_first_iteration_are_chosen_by_their_timings(clock):
    """Three of four rows end at their first token: every call goes on at batch width 1 after its first iteration,
    which is untimed, so the width-4 table is never timed: its calls decode plainly, and the drafting calls run among
    them as probes, which would calibrate it, count as idle; after `_MAX_IDLE_CALLS` of them the calls' own timings
    decide (drafting first)."""
    model = build_verifier("bart")
    inputs = make_source_batch(4, seed=0, pad_token_id=model.config.pad_token_id)
    firsts = model.generate(**inputs, **GREEDY, max_new_tokens=12)[:, 1].tolist()
    model.generation_config.eos_token_id = max(set(firsts), key=firsts.count)
    assert firsts.count(model.generation_config.eos_token_id) == 3, "precondition (this seed): three rows end at once"
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=12)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 4, "half")

    def call_choices() -> dict:
        return draft_length._ACCEPTANCE.get(drafter, {}).get(model, {}).get(("greedy", 1, 0.0), (None, {}))[1]

    kinds = ""
    while (4, "cpu", 4) not in call_choices():  # plain calls, and drafting ones as probes, until the calls decide
        assert len(kinds) < 60
        output = _generate_auto(model, inputs, drafter, max_new_tokens=12)
        assert torch.equal(output.sequences, reference)
        kinds += "D" if output.speculative_stats.drafter_calls else "."
    table = draft_length._COST_TABLES[drafter][model][(4, "cpu", 4)]
    assert table.calibration is not None and not any(table.calibration.seen)  # never timed
    # the probes timed none of its forwards, `_MAX_IDLE_CALLS` of them: the last call was chosen, drafting, and timed
    assert kinds.count("D") == draft_length._MAX_IDLE_CALLS + 1 and kinds.endswith("D"), kinds
    assert table.calibration.idle_calls == draft_length._MAX_IDLE_CALLS + 1  # the chosen call timed none either
    assert len(call_choices()[(4, "cpu", 4)].drafting_call_steps) == 1


def test_calls_of_a_short_length_budget_calibrate_what_they_reach_and_are_then_chosen(clock):
    """`max_new_tokens=5`, k up to 4: a timed iteration (from the second on, after the first committed a token) can
    take k ≤ 3; the table is calibrated up to 3 over the calls, and then whole calls are chosen and timed."""
    model = build_verifier("bart")
    inputs = make_source_batch(1, seed=3, pad_token_id=model.config.pad_token_id)
    model.generation_config.eos_token_id = None  # every call runs its whole budget
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=5)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 4, "half")
    for _ in range(30):
        assert torch.equal(_generate_auto(model, inputs, drafter, max_new_tokens=5).sequences, reference)
    table = draft_length._COST_TABLES[drafter][model][(1, "cpu", 4)]
    assert table.covers(3) and not table.covers(4)
    _, call_choices = draft_length._ACCEPTANCE[drafter][model][("greedy", 1, 0.0)]
    choices = call_choices[(1, "cpu", 4)]
    assert len(choices.plain_call_steps) + len(choices.drafting_call_steps) > 5  # calls chosen and timed


def test_acceptance_estimate_starts_from_its_prior_and_follows_the_counts():
    estimate = AcceptanceEstimate()
    prior = estimate.probabilities(3)
    assert prior[0] > prior[1] > prior[2] > 0
    for _ in range(200):
        estimate.update(3, [3, 0])  # one row always accepts all three, the other none
    assert estimate.probabilities(3) == pytest.approx([0.5, 0.5, 0.5], abs=0.01)


def test_acceptance_estimate_never_rises_with_the_position():
    estimate = AcceptanceEstimate()
    estimate.update(1, [0])  # position 0 seen once, rejected; position 1 only has its prior
    first, second = estimate.probabilities(2)
    assert second <= first


def test_k_is_chosen_again_every_few_iterations_and_when_the_limit_changes():
    """Between choices an iteration takes the k last chosen; a new length limit or batch width chooses at once."""
    table = IterationCostTable([1.0, 1.1, 1.2, 1.3, 1.4])
    schedule = DraftLengthSchedule(object, None, 4, (1, 0.0, False), torch.device("cpu"))
    schedule._tables[(1, "cpu", 4)] = table
    schedule.acceptance.update(4, [4] * 500)  # sure drafts: k = 4
    no_neighbour = draft_length._SETTLED_NEIGHBOUR_INTERVAL * 100  # the next drafting iteration takes the best k
    table.drafting_iterations = no_neighbour
    ks = []
    for _ in range(draft_length._RECHOOSE_INTERVAL):
        ks.append(schedule.next_k(1, 4))
        schedule.observe([4])
        schedule.acceptance.update(4, [0] * 5000)  # drafts now never accepted: plain steps pay more
        table.drafting_iterations = no_neighbour
    # the choice holds after the counts changed, until it is made again
    assert ks == [4] * draft_length._RECHOOSE_INTERVAL and draft_length._RECHOOSE_INTERVAL > 1
    assert schedule.next_k(1, 4) == 0  # made again: no draft pays
    schedule.observe([0])
    schedule.acceptance.update(4, [4] * 100_000)  # sure again
    assert schedule.next_k(1, 3) == 3  # a new limit: chosen at once
    schedule.observe([3])
    assert schedule.next_k(1, 4) == 4
    schedule.observe([4])
    assert schedule.next_k(1, 2) == 2  # a smaller limit never takes the kept k = 4
    schedule.observe([2])
    other = IterationCostTable([1.0, 1.1, 1.2, 1.3, 1.4])
    schedule._tables[(2, "cpu", 4)] = other
    schedule.acceptance.update(4, [0] * 10_000_000)  # never accepted now
    # another batch-width bucket at the same limit: chosen at once
    assert schedule.next_k(2, 2) == 0


def test_a_useless_drafter_is_probed_less_and_less_often():
    table = IterationCostTable([1.0, 1.0, 1.0])
    schedule = DraftLengthSchedule(object, None, 2, (1, 0.0, False), torch.device("cpu"))
    schedule._tables[(1, "cpu", 2)] = table
    choices = []
    for _ in range(120):
        k = schedule.next_k(1, 2)
        choices.append(k)
        schedule.observe([0])
        # pin the costs the timing would read
        table.plain_recent.clear(), table.drafting_recent.clear(), table.per_draft_recent.clear()
        table.plain_recent.append(1.0), table.drafting_recent.append((1, 1.5))
    probes = [index for index, k in enumerate(choices) if k > 0]
    gaps = [later - earlier for earlier, later in zip(probes, probes[1:], strict=False)]
    assert choices[-20:].count(0) >= 19
    assert len(gaps) >= 3 and gaps == sorted(gaps) and gaps[-1] > gaps[0]


# ---------------------------------------------------------------------------------------------------------------
# in generate(): exact, and k = 0 a greedy step
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("accuracy", ["right", "wrong", "half"])
def test_auto_draft_length_equals_greedy(family, batch_size, accuracy, clock):
    model = build_verifier(family)
    # a forward costs ten units, a plain call's too (the step clock alone charges a unit per reading, and a drafting
    # iteration reads it a few times where a whole plain call reads it twice)
    model.register_forward_hook(lambda *args: clock.spend(10.0))
    inputs = make_source_batch(batch_size, seed=3, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 6, accuracy)

    def call():
        output = _generate_auto(model, inputs, drafter, max_new_tokens=20)
        assert torch.equal(output.sequences, reference)
        return output.speculative_stats

    # later calls start from the earlier ones' measurements; above one row, calls decode plainly until drafting calls
    # run as probes (after every two plain ones) have calibrated the width's table
    calls = []
    while len(calls) < 2 or not _calibrated(model, drafter, batch_size):
        assert len(calls) < 30, "the table of the batch's width was not calibrated in 30 calls"
        calls.append(call())
    # chosen with the table complete: above one row a plain call first (timed as one of the width's choices)
    calls += [call(), call()]
    drafting = [stats for stats in calls if stats.drafter_calls]
    assert drafting  # the drafting path ran
    assert sum(drafting[-1].generated_tokens) == (reference.shape[1] - 1) * batch_size
    if accuracy == "right":  # sure drafts are verified, several at a time
        assert calls[-1].drafter_calls and calls[-1].tokens_per_iteration > 2.0


def test_above_one_row_a_new_rule_judges_drafting_by_plain_calls_of_any_rule(clock):
    """Above one row the table judges drafting only once a plain call of the width was timed; sampling settings that
    change every call (each a rule of its own, as per-request temperatures would be) judge by the plain calls timed
    under another rule, and draft where drafting pays (`top_k=1`: greedy's tokens)."""
    model = build_verifier("bart")
    # a forward costs ten units, a plain call's too (the step clock alone charges a unit per reading, and a drafting
    # iteration reads it a few times where a whole plain call reads it twice)
    model.register_forward_hook(lambda *args: clock.spend(10.0))
    inputs = make_source_batch(4, seed=3, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 6, "right")
    _calibrate(model, inputs, drafter, max_new_tokens=20)  # plain calls, and drafting ones as probes, calibrate it
    first = _generate_auto(model, inputs, drafter, max_new_tokens=20)
    assert first.speculative_stats.drafter_calls == 0  # no plain call of this width timed as a choice yet: one is
    for call in range(6):
        sampled = dict(do_sample=True, top_k=1, temperature=0.5 + 0.01 * call)  # a rule never seen before
        output = _generate_auto(model, inputs, drafter, max_new_tokens=20, **sampled)
        assert torch.equal(output.sequences, reference)
        assert output.speculative_stats.drafter_calls > 0, call


def test_a_wide_batch_never_runs_the_forwards_no_k_can_pay_at(clock):
    """A forward that costs by the tokens it is fed, as a wide batch's does on a CPU: the calibration of batch 4's
    table stops at the first width that cannot pay, no iteration drafts more than the table's largest k, and every
    output is greedy's."""
    model = build_verifier("bart")
    model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: clock.spend(float(kwargs["input_ids"].numel())), with_kwargs=True
    )
    inputs = make_source_batch(4, seed=3, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=30)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 6, "half")
    asked = []  # (the batch width's table, k) of every drafter call
    propose = drafter.propose

    def recording_propose(state, ids, lengths, k, *args):
        asked.append(((draft_length._rows_bucket(ids.shape[0]), "cpu", 6), k))
        return propose(state, ids, lengths, k, *args)

    drafter.propose = recording_propose
    for _ in range(4):
        assert torch.equal(_generate_auto(model, inputs, drafter, max_new_tokens=30).sequences, reference)
    tables = draft_length._COST_TABLES[drafter][model]
    assert tables[(4, "cpu", 6)].calibration is None and 1 <= tables[(4, "cpu", 6)].largest_k < 6
    assert any(key == (4, "cpu", 6) for key, _ in asked)
    assert all(k <= tables[key].largest_k for key, k in asked)


def test_k_zero_iterations_are_greedy_steps(family, clock):
    """Drafts that are always wrong: after the prior is spent, the loop steps without drafting, one token each."""
    model = build_verifier(family)
    inputs = make_source_batch(1, seed=4, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=40)
    drafter = SlowWrongDrafter(reference, VOCAB_SIZE, 4, "wrong", clock=clock)
    output = _generate_auto(model, inputs, drafter, max_new_tokens=40)  # learns that the drafts are worthless
    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    assert 0 < stats.drafter_calls < stats.verifier_calls / 2


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_call_where_drafting_cannot_pay_decodes_plainly_and_probes_now_and_then(family, batch_size, clock):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=4, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=30, output_scores=True, return_dict_in_generate=True)
    drafter = SlowWrongDrafter(reference.sequences, VOCAB_SIZE, 4, "wrong", clock=clock)
    _calibrate(model, inputs, drafter, max_new_tokens=30)  # measures this width, learns the drafts are worthless
    drafted_calls = []
    for _ in range(16):
        output = _generate_auto(model, inputs, drafter, max_new_tokens=30, output_scores=True)
        assert torch.equal(output.sequences, reference.sequences)
        drafted_calls.append(output.speculative_stats.drafter_calls > 0)
    # plain calls, with a probe of drafting after 2, then after 4 more (the interval doubles), at one row after every 2
    # until three were timed; then the calls' own times show the drafting ones clearly slower, and the next waits
    if batch_size == 1:
        assert drafted_calls == [False, False, True] * 3 + [False] * 7
    else:
        assert drafted_calls == [False, False, True, False, False, False, False, True] + [False] * 8
    plain = output.speculative_stats
    pad = model.generation_config.pad_token_id
    generated = reference.sequences[:, 1:]
    ends = [int((row != pad).sum()) for row in generated]
    assert plain.drafter_calls == 0 and plain.verifier_calls == generated.shape[1]
    assert plain.generated_tokens == ends and plain.tokens_per_iteration == 1.0
    for ours, theirs in zip(output.scores, reference.scores, strict=True):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize(("family", "sampling"), [("bart", {}), ("t5", {}), ("bart", dict(do_sample=True, top_k=1))])
def test_a_plain_call_feeds_only_the_rows_still_decoding_and_never_asks_the_drafter(family, sampling, clock):
    """A call decoded without drafting runs the loop with no drafter: each row leaves the batch after the step that
    finishes it (transformers' loop keeps feeding it pad), the output is greedy's (sampling with `top_k=1` too) and
    the statistics count one verifier pass per step of each row."""
    model = build_verifier(family)
    inputs = make_source_batch(4, seed=11, pad_token_id=model.config.pad_token_id)
    reference = _with_rows_ending_apart(model, inputs, max_new_tokens=16)
    generated = (reference[:, 1:] != model.generation_config.pad_token_id).sum(dim=1).tolist()
    drafter = SlowWrongDrafter(reference, VOCAB_SIZE, 4, "wrong", clock=clock)
    _calibrate(model, inputs, drafter, max_new_tokens=16, **sampling)  # learns the drafts are worthless
    asked = []
    for name in ("init_drafting_state", "propose", "select_rows"):
        method = getattr(drafter, name)
        setattr(
            drafter,
            name,
            lambda *args, _name=name, _method=method, **kwargs: asked.append(_name) or _method(*args, **kwargs),
        )
    fed_rows = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: fed_rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        output = _generate_auto(model, inputs, drafter, max_new_tokens=16, **sampling)
    finally:
        hook.remove()
    assert asked == []  # a plain call: the drafter is neither set up nor called
    assert torch.equal(output.sequences, reference)
    assert fed_rows == [sum(length > step for length in generated) for step in range(max(generated))]
    stats = output.speculative_stats
    assert stats.num_draft_tokens == 0 and stats.drafter_calls == 0 and stats.verifier_calls == len(fed_rows)
    assert stats.generated_tokens == generated and stats.iterations == generated


def test_auto_draft_length_keeps_the_sampling_distribution_exact_in_its_support():
    """Sampling with a chosen k: every sampled token is one the processed verifier distribution allows (top_k=1
    makes sampling deterministic, so the output equals greedy's)."""
    model = build_verifier("bart")
    inputs = make_source_batch(2, seed=5, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=16)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 4, "half")
    output = _generate_auto(model, inputs, drafter, do_sample=True, top_k=1, max_new_tokens=16)
    assert torch.equal(output.sequences, reference)


def test_an_unknown_draft_length_word_is_refused():
    model = build_verifier("bart")
    inputs = make_source_batch(1, pad_token_id=model.config.pad_token_id)
    drafter = OracleDrafter(model.generate(**inputs, **GREEDY, max_new_tokens=4), VOCAB_SIZE, 4, "right")
    with pytest.raises(ValueError, match=r"`num_draft_tokens` must be .* or 'auto'.*got 'adaptive'"):
        generate_with_drafter(model, inputs, drafter, num_draft_tokens="adaptive", max_new_tokens=4)


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_every_k_in_turn_with_a_state_reading_drafter_and_finishing_rows_equals_greedy(family, monkeypatch):
    """k cycling over 0..max, whatever the costs say: a Spec-Drafter that reads the verifier's states and caches its
    prefix sees prefixes that grow by several tokens between calls, rows finish at different steps, and the output
    stays greedy's."""
    from specdec_hf import SpecDrafterModel

    model = build_verifier(family)
    inputs = make_source_batch(4, seed=11, pad_token_id=model.config.pad_token_id)
    reference = _with_rows_ending_apart(model, inputs, max_new_tokens=16)
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", verifier_state_layers=[1, -1]
    ).eval()
    cycle = iter(range(10**6))
    cycled = []

    def cycling(costs, *args, **kwargs):
        cycled.append(next(cycle) % len(costs))
        return cycled[-1]

    monkeypatch.setattr(draft_length, "choose_draft_length", cycling)
    monkeypatch.setattr(draft_length, "_neighbour_now_and_then", lambda k, width, iteration: k)
    monkeypatch.setattr(draft_length.DraftLengthSchedule, "drafts_this_call", lambda schedule, *args: True)
    # every batch width's table given: k is the patch's at every iteration, none calibrates
    tables = draft_length._COST_TABLES.setdefault(drafter, weakref.WeakKeyDictionary()).setdefault(model, {})
    for rows in (1, 2, 4):
        tables[(rows, "cpu", 4)] = IterationCostTable([1.0, 1.1, 1.2, 1.3, 1.4])
    chosen = []
    next_k = draft_length.DraftLengthSchedule.next_k

    def recording_next_k(schedule, rows, limit):
        k = next_k(schedule, rows, limit)
        chosen.append((rows, k))
        return k

    monkeypatch.setattr(draft_length.DraftLengthSchedule, "next_k", recording_next_k)
    output = _generate_auto(model, inputs, drafter, max_new_tokens=16)
    assert torch.equal(output.sequences, reference)  # whose rows finish at different steps
    assert cycled  # the patched choice ran
    assert len({rows for rows, _ in chosen}) > 1 and len({k for _, k in chosen}) >= 3, chosen
    stats = output.speculative_stats
    assert 0 < stats.drafter_calls < stats.verifier_calls  # some iterations drafted, others stepped alone


class _OneDraftPerRow(OracleDrafter):
    """The oracle's drafts, with `num_drafts` 1 for every row in `dtype` (a float dtype is malformed)."""

    def __init__(self, dtype: torch.dtype, *args):
        super().__init__(*args)
        self.dtype = dtype

    def propose(self, *args, **kwargs):
        proposal = super().propose(*args, **kwargs)
        proposal.num_drafts = torch.ones(proposal.draft_ids.shape[0], dtype=self.dtype)
        return proposal


def test_a_malformed_num_drafts_is_refused():
    model = build_verifier("bart")
    inputs = make_source_batch(2, pad_token_id=model.config.pad_token_id)

    drafter = _OneDraftPerRow(torch.float32, model.generate(**inputs, **GREEDY, max_new_tokens=4), VOCAB_SIZE, 2)
    with pytest.raises(ValueError, match=r"num_drafts of shape \(2,\) and dtype torch.float32: it must be an integer"):
        generate_with_drafter(model, inputs, drafter, max_new_tokens=4)


def test_proposed_tokens_count_what_num_drafts_says_was_proposed():
    model = build_verifier("bart")
    inputs = make_source_batch(2, pad_token_id=model.config.pad_token_id)

    drafter = _OneDraftPerRow(torch.long, model.generate(**inputs, **GREEDY, max_new_tokens=6), VOCAB_SIZE, 3)
    stats = generate_with_drafter(model, inputs, drafter, max_new_tokens=6, num_draft_tokens=3).speculative_stats
    assert stats.drafter_calls > 0
    assert stats.proposed_tokens == sum(stats.verified_tokens)  # one per row and call, not k=3


def test_plain_calls_are_compared_at_the_cost_they_were_measured_at():
    """Before any plain call, a plain step is taken to cost the verifier's forward alone; once plain calls were
    timed, their cost per step decides."""
    schedule = DraftLengthSchedule(object, None, 2, (1, 0.0, False), torch.device("cpu"))
    table = IterationCostTable([1.0, 1.5, 2.0])
    schedule._tables[(1, "cpu", 2)] = table
    table.drafting_recent.append((1, 2.0))  # with the forward's 0.5 per draft: k=1 2.0, k=2 2.5
    schedule.acceptance.update(2, [1] * 40)  # the first draft always accepted, the second never
    assert not schedule.drafts_this_call(1)  # 2 tokens / 2.0 s is no better than 1 / 1.0 (the forward alone)
    # plain calls measured slower than the forward alone (lower quartile 1.5)
    schedule._call_choices[(1, "cpu", 2)].plain_call_steps.extend([1.6, 1.5, 1.7])
    assert schedule.drafts_this_call(1)


@pytest.mark.parametrize("name", ["token_streamer", "streamer"])
def test_a_plain_call_streams_the_prompt_first_then_each_token(clock, name):
    """transformers gives a custom_generate callable's streamer nothing: the plain call puts the prompt itself
    (`token_streamer=`), or generate() has (`streamer=`), so that `skip_prompt` streamers drop the prompt, not the
    first generated token."""
    model = build_verifier("bart")
    inputs = make_source_batch(1, seed=4, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    drafter = SlowWrongDrafter(reference, VOCAB_SIZE, 4, "wrong", clock=clock)
    _generate_auto(model, inputs, drafter, max_new_tokens=20)

    class Recorder:
        def __init__(self):
            self.puts, self.ended = [], 0

        def put(self, value):
            self.puts.append(value.tolist())

        def end(self):
            self.ended += 1

    recorder = Recorder()
    output = _generate_auto(model, inputs, drafter, max_new_tokens=20, **{name: recorder})
    assert output.speculative_stats.drafter_calls == 0  # the plain path
    assert recorder.puts[0] == reference[:, :1].tolist() and recorder.ended == 1
    streamed = [token for put in recorder.puts[1:] for token in (put if isinstance(put, list) else [put])]
    assert streamed == reference[0, 1:].tolist()


def test_a_plain_call_failing_mid_decoding_ends_the_streamer_once(clock):
    """The loop ends its streamer only when it finishes: a plain call that fails midway ends it all the same."""
    model = build_verifier("bart")
    inputs = make_source_batch(1, seed=4, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    drafter = SlowWrongDrafter(reference, VOCAB_SIZE, 4, "wrong", clock=clock)
    _generate_auto(model, inputs, drafter, max_new_tokens=20)  # learns: drafts worthless

    class FailingOnThirdStep(LogitsProcessor):
        steps = 0

        def __call__(self, input_ids, scores):
            self.steps += 1
            if self.steps == 3:
                raise RuntimeError("processor broke")
            return scores

    class Recorder:
        puts, ended = 0, 0

        def put(self, value):
            self.puts += 1

        def end(self):
            self.ended += 1

    recorder = Recorder()
    with pytest.raises(RuntimeError, match="processor broke"):
        _generate_auto(
            model, inputs, drafter, max_new_tokens=20, streamer=recorder,
            logits_processor=LogitsProcessorList([FailingOnThirdStep()]),
        )  # fmt: skip
    assert recorder.puts >= 2 and recorder.ended == 1


class StopAtRowLimit(StoppingCriteria):
    """Stops row r once it holds `6 + 4 r` tokens."""

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids.shape[1] >= 6 + 4 * torch.arange(input_ids.shape[0], device=input_ids.device)


@pytest.mark.parametrize("eos", ["unwritten", "pad"])
def test_a_plain_call_counts_a_row_stopped_without_eos_up_to_its_stop(clock, eos):
    """A row a criterion stops before the longest gets pad after its stop, as greedy appends it: the statistics
    count the tokens it generated, not that padding, also where pad is the EOS token (the padding then reads as an
    EOS the row wrote)."""
    model = build_verifier("bart")
    inputs = make_source_batch(3, seed=4, pad_token_id=model.config.pad_token_id)
    criteria = StoppingCriteriaList([StopAtRowLimit()])
    # an EOS no row writes (greedy pads a finished row only when it has an EOS): rows end by the criterion alone
    model.generation_config.eos_token_id = None
    written = model.generate(**inputs, **GREEDY, max_new_tokens=30, stopping_criteria=criteria).flatten().tolist()
    if eos == "pad":
        assert model.config.pad_token_id not in written, "precondition (this seed): no row writes the pad token"
        model.generation_config.eos_token_id = model.config.pad_token_id
    else:
        model.generation_config.eos_token_id = next(t for t in range(3, VOCAB_SIZE) if t not in written)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=30, stopping_criteria=criteria)
    assert (reference[0, 6:] == model.config.pad_token_id).all()  # greedy padded the first row after its stop
    drafter = SlowWrongDrafter(reference, VOCAB_SIZE, 4, "wrong", clock=clock)
    _calibrate(model, inputs, drafter, max_new_tokens=30, stopping_criteria=criteria)  # learns: drafts worthless
    output = _generate_auto(model, inputs, drafter, max_new_tokens=30, stopping_criteria=criteria)
    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    assert stats.drafter_calls == 0  # decoded plainly
    assert stats.generated_tokens == [5, 9, 13]  # the limits, less the decoder start token
