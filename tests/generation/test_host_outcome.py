"""Greedy iterations settled on the host (`host_outcome`, the CPU's path) against the tensor path (an accelerator's):
the same sequences and statistics, β = 1 equal to greedy `generate()`, and `settle_on_host` on hand-made scores."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, VOCAB_SIZE, build_verifier, generate_with_drafter, make_source_batch
from oracle_drafters import ConfidentOracleDrafter, OracleDrafter
from transformers.generation.stopping_criteria import StoppingCriteriaList

import specdec_hf.generation.speculative_loop as speculative_loop
from specdec_hf import SourceCopyDrafter, SpecDrafterModel
from specdec_hf.generation.host_outcome import commit_on_host, settle_on_host, settles_on_host, settling_on_tensors
from specdec_hf.generation.loop_state import ActiveBatch, Rows, SpeculativeLoopConfig

EOS = 7  # an EOS id for the tiny verifiers (they rarely emit their real one)


def _on_both_paths(settled: list, run):
    """`run()` with iterations settled on the host, then on tensors, each checked to be taken (`settled`: the
    `host_settlements` fixture)."""
    host = run()
    assert settled, "the host path was not taken"
    settled.clear()
    with settling_on_tensors():
        tensor = run()
    assert not settled, "the tensor path was not taken"
    return host, tensor


def _assert_same(host, tensor):
    assert torch.equal(host.sequences, tensor.sequences)
    assert host.speculative_stats == tensor.speculative_stats


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("family", FAMILIES)
def test_beta_one_equals_greedy_on_both_paths(family, batch_size, host_settlements):
    """Sequences and statistics (rows finishing at EOS mid-draft on both paths: test_greedy_equivalence's
    `test_rows_stopping_at_different_lengths`, which runs on both)."""
    verifier = build_verifier(family, eos_token_id=EOS)
    source = make_source_batch(batch_size, seed=1)
    reference = verifier.generate(**source, do_sample=False, num_beams=1, max_new_tokens=40)
    drafter = OracleDrafter(reference, VOCAB_SIZE, accuracy="half")
    host, tensor = _on_both_paths(
        host_settlements,
        lambda: generate_with_drafter(verifier, source, drafter, max_new_tokens=40, num_draft_tokens=4),
    )
    assert torch.equal(host.sequences, reference)
    _assert_same(host, tensor)
    if batch_size > 1:  # rows advanced unevenly: the ragged layout was exercised
        assert len(set(host.speculative_stats.accepted_tokens)) > 1


@pytest.mark.parametrize("batch_size", [1, 4])
def test_relaxed_rule_is_the_tensor_paths(batch_size, host_settlements):
    verifier = build_verifier("bart", eos_token_id=EOS)
    source = make_source_batch(batch_size, seed=3)
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        verifier,
        max_draft_tokens=4,
        encoder_layers=1,
        decoder_layers=1,
        prefix_attention="causal",
        verifier_state_layers=[1],
    )
    host, tensor = _on_both_paths(
        host_settlements,
        lambda: generate_with_drafter(
            verifier, source, drafter, max_new_tokens=24, num_draft_tokens=4, beta=4, tau=3.0
        ),
    )
    _assert_same(host, tensor)
    # drafts were accepted where β = 1 rejects them: the relaxed rule was in play
    strict = generate_with_drafter(verifier, source, drafter, max_new_tokens=24, num_draft_tokens=4)
    assert sum(host.speculative_stats.accepted_tokens) > sum(strict.speculative_stats.accepted_tokens)


def test_per_row_draft_counts_and_the_length_limit(host_settlements):
    """A drafter that drafts per row (the source copy's `num_drafts`), a confidence cut, and budgets bound by
    `max_length` (k = 4 against 6 new tokens)."""
    verifier = build_verifier("bart", eos_token_id=EOS)
    source = make_source_batch(4, seed=1)
    output = verifier.generate(**source, do_sample=False, max_new_tokens=20)[:, 1:]
    copy_source = {"input_ids": torch.cat([output, output], dim=1)}  # continues many prefixes, not all
    reference = verifier.generate(**copy_source, do_sample=False, num_beams=1, max_new_tokens=6)
    copy = SourceCopyDrafter.from_verifier(verifier, num_draft_tokens=4)
    host, tensor = _on_both_paths(
        host_settlements,
        lambda: generate_with_drafter(verifier, copy_source, copy, max_new_tokens=6, num_draft_tokens=4),
    )
    assert torch.equal(host.sequences, reference)
    _assert_same(host, tensor)

    reference = verifier.generate(**source, do_sample=False, num_beams=1, max_new_tokens=20)
    confident = ConfidentOracleDrafter(reference, VOCAB_SIZE)
    host, tensor = _on_both_paths(
        host_settlements,
        lambda: generate_with_drafter(
            verifier, source, confident, max_new_tokens=20, num_draft_tokens=4, draft_confidence_threshold=0.4
        ),
    )
    assert torch.equal(host.sequences, reference)
    _assert_same(host, tensor)


def _config(**overrides) -> SpeculativeLoopConfig:
    settings = dict(
        num_draft_tokens=3, beta=1, tau=0.0, max_length=20, pad_token_id=0, vocab_size=10, eos_token_ids=None
    )
    return SpeculativeLoopConfig(**{**settings, **overrides})


def _scores_choosing(choices: list[list[int]], vocab_size: int = 10) -> torch.FloatTensor:
    """Scores `(rows, positions, vocab_size)` whose argmax at each position is `choices[row][position]`."""
    scores = torch.zeros(len(choices), len(choices[0]), vocab_size)
    for row, tokens in enumerate(choices):
        for position, token in enumerate(tokens):
            scores[row, position, token] = 1.0
    return scores


def test_settle_on_host_accepts_the_leading_matches_and_appends_the_verifiers_token():
    scores = _scores_choosing([[4, 5, 6, 8], [4, 5, 6, 8], [3, 3, 3, 3]])
    drafts = torch.tensor([[4, 5, 6], [4, 9, 6], [4, 5, 6]])
    outcome, new_tokens = settle_on_host(scores, drafts, [5, 5, 5], None, None, None, _config())
    assert new_tokens == [[4, 5, 6, 8], [4, 5], [3]]
    assert outcome.num_new == [4, 2, 1]
    assert outcome.accepted == [3, 1, 0]
    assert outcome.verified == [3, 3, 3]
    assert outcome.finished == [False, False, False]
    assert outcome.streamed is None and outcome.value_facts is None


def test_settle_on_host_cuts_after_eos_and_at_the_length_limit():
    scores = _scores_choosing([[4, 2, 6, 8], [4, 5, 6, 8]])
    drafts = torch.tensor([[4, 2, 6], [4, 5, 6]])
    # row 0: EOS (2) among its accepted drafts; row 1: 2 tokens left before max_length 20 (a budget of one draft)
    outcome, new_tokens = settle_on_host(scores, drafts, [5, 18], None, None, frozenset({2}), _config(), stream=True)
    assert new_tokens == [[4, 2], [4, 5]]
    assert outcome.finished == [True, True]
    assert outcome.accepted == [2, 1]
    assert outcome.verified == [3, 1]
    assert outcome.streamed == [4, 2]


def test_settle_on_host_reads_verify_counts_value_facts_and_the_relaxed_rule():
    scores = _scores_choosing([[4, 5, 6, 8], [4, 5, 6, 8]])
    drafts = torch.tensor([[4, 5, 6], [4, 5, 6]])
    outcome, new_tokens = settle_on_host(
        scores, drafts, [5, 5], torch.tensor([1, 3]), torch.tensor([4, 6]), None, _config()
    )
    assert new_tokens == [[4, 5], [4, 5, 6, 8]]
    assert outcome.verified == [1, 3]
    assert outcome.value_facts == [4, 6]
    # the relaxed rule: the second choice (score 0.5) passes top-2 with a wide tolerance, not top-1
    scores[0, 0, 9] = 0.5
    drafts = torch.tensor([[9, 5, 6], [4, 5, 6]])
    relaxed, _ = settle_on_host(scores, drafts, [5, 5], None, None, None, _config(beta=2, tau=10.0))
    strict, _ = settle_on_host(scores, drafts, [5, 5], None, None, None, _config())
    assert relaxed.accepted == [3, 3] and strict.accepted == [0, 3]


def test_settle_on_host_plain_step():
    outcome, new_tokens = settle_on_host(
        _scores_choosing([[6], [2]]), torch.empty(2, 0, dtype=torch.long), [3, 4], None, None, frozenset({2}),
        _config(),
    )  # fmt: skip
    assert new_tokens == [[6], [2]]
    assert outcome.finished == [False, True] and outcome.accepted == [0, 0] and outcome.verified == [0, 0]


def test_commit_on_host_writes_the_tokens_and_returns_the_rows_going_on():
    sequences = torch.zeros(3, 8, dtype=torch.long)
    rows = Rows(
        sequences=sequences,
        lengths=[2, 3, 2],
        active=[0, 2],
        active_index=torch.tensor([0, 2]),
        active_lengths=torch.tensor([2, 2]),
        recorded=None,
    )
    assert commit_on_host(rows, [2, 2], [[5, 6], [7]], [False, False]) is None
    assert sequences[0].tolist() == [0, 0, 5, 6, 0, 0, 0, 0]
    assert sequences[2].tolist() == [0, 0, 7, 0, 0, 0, 0, 0]
    assert sequences[1].tolist() == [0] * 8
    assert rows.active_lengths.tolist() == [4, 3]
    going_on = commit_on_host(rows, [4, 3], [[1], [2, 3]], [True, False])
    assert going_on.tolist() == [1]
    assert sequences[0, 4].item() == 1 and sequences[2, 3:5].tolist() == [2, 3]


def test_settles_on_host_only_where_it_was_measured():
    cpu = torch.device("cpu")
    assert settles_on_host(_config(), True, cpu)
    assert not settles_on_host(_config(), False, cpu)  # stopping criteria beyond EOS and length
    assert not settles_on_host(_config(do_sample=True), True, cpu)
    assert not settles_on_host(_config(aligned_rows=True), True, cpu)
    assert not settles_on_host(_config(), True, torch.device("meta"))
    with settling_on_tensors():  # the accelerator's path, on the CPU too
        assert not settles_on_host(_config(), True, cpu)
    assert settles_on_host(_config(), True, cpu)


def _random_iteration(generator: torch.Generator):
    """One iteration's inputs at random: few ids (ties in the scores, EOS often among the drafts and the verifier's
    choices), rows near the length limit, per-row draft counts of any integer dtype, value facts."""

    def randint(high, size=(), low=0):
        return torch.randint(low, high, size, generator=generator)

    rows, k, vocab, max_length = int(randint(5, low=1)), int(randint(5)), 6, 12
    scores = randint(3, (rows, k + 1, vocab)).float()  # small integers: ties everywhere
    drafts = randint(vocab, (rows, k))
    agree = randint(2, (rows, k)).bool()  # half the drafts are the verifier's choice: runs of accepted drafts
    drafts = torch.where(agree, scores[:, :k].argmax(-1), drafts)
    lengths = randint(max_length, (rows,), low=1)
    verify_counts = None
    if int(randint(2)):
        dtype = (torch.int32, torch.int64, torch.uint8)[int(randint(3))]
        verify_counts = randint(k + 1, (rows,)).to(dtype)
    value_facts = randint(100, (3,)) if int(randint(2)) else None
    eos = [None, [2], [2, 3]][int(randint(3))]
    beta, tau = (1, 2, 5)[int(randint(3))], (0.0, 0.5, 10.0)[int(randint(3))]
    config = _config(
        num_draft_tokens=k, beta=beta, tau=tau, max_length=max_length, pad_token_id=PAD, vocab_size=vocab,
        eos_token_ids=None if eos is None else torch.tensor(eos),
    )  # fmt: skip
    return scores, drafts, lengths, verify_counts, value_facts, eos, config


PAD = 1  # not 0: the buffers are filled with it, so that what a path writes past a row's tokens would show


def _rows(lengths: torch.LongTensor, width: int, seed: int) -> Rows:
    """A batch of `len(lengths)` active rows among finished ones (active rows' global indices differ from their
    local ones), committed tokens before each row's length, pad after."""
    generator = torch.Generator().manual_seed(seed)
    batch_size = len(lengths) + int(torch.randint(0, 3, (), generator=generator))
    active = sorted(torch.randperm(batch_size, generator=generator)[: len(lengths)].tolist())
    sequences = torch.full((batch_size, width), PAD, dtype=torch.long)
    all_lengths = [1] * batch_size
    for row, length in zip(active, lengths.tolist(), strict=True):
        sequences[row, :length] = torch.randint(2, 6, (length,), generator=generator)
        all_lengths[row] = length
    return Rows(
        sequences=sequences,
        lengths=all_lengths,
        active=active,
        active_index=torch.tensor(active),
        active_lengths=lengths.clone(),
        recorded=None,
    )


def test_settle_on_host_is_the_tensor_paths_rule_on_random_iterations():
    generator = torch.Generator().manual_seed(0)
    cases = dict(relaxed_differs=0, eos_cut=0, eos_rejected=0, length_cut=0, counts_cut=0, length_finish=0, going_on=0)
    for seed in range(400):
        scores, drafts, lengths, verify_counts, value_facts, eos, config = _random_iteration(generator)
        k, host_lengths, width = drafts.shape[1], lengths.tolist(), config.max_length + drafts.shape[1] + 1
        on_tensors, on_host = _rows(lengths, width, seed), _rows(lengths, width, seed)
        committed = on_tensors.sequences.index_select(0, on_tensors.active_index)
        batch = ActiveBatch(committed, lengths, host_lengths, min(host_lengths), max(host_lengths))
        stream = len(host_lengths) == 1
        expected, finished = speculative_loop._settle_on_device(
            on_tensors, batch, scores, drafts, verify_counts, value_facts, None, None, StoppingCriteriaList(), True,
            None, stream, config,
        )  # fmt: skip
        eos_ids = None if eos is None else frozenset(eos)
        outcome, new_tokens = settle_on_host(
            scores, drafts, host_lengths, verify_counts, value_facts, eos_ids, config, stream=stream
        )
        if stream:  # the tensor path reads all k + 1 of row 0's tokens; the loop streams its first num_new
            expected = expected._replace(streamed=expected.streamed[: expected.num_new[0]])
        assert outcome == expected, (scores, drafts, lengths, verify_counts, eos, config)
        going_on = commit_on_host(on_host, host_lengths, new_tokens, outcome.finished)
        assert torch.equal(on_host.sequences, on_tensors.sequences)
        assert torch.equal(on_host.active_lengths, on_tensors.active_lengths)
        if any(outcome.finished):  # the rows that go on, in order: the stable argsort the tensor path releases by
            kept = torch.argsort(finished.to(torch.uint8), stable=True)[: outcome.finished.count(False)]
            assert torch.equal(going_on, kept)
            cases["going_on"] += not all(outcome.finished)
        else:
            assert going_on is None

        strict, _ = settle_on_host(scores, drafts, host_lengths, verify_counts, None, eos_ids, _config(
            num_draft_tokens=k, max_length=config.max_length, pad_token_id=PAD, vocab_size=6
        ))  # fmt: skip
        cases["relaxed_differs"] += config.beta > 1 and strict.accepted != outcome.accepted
        for row, length in enumerate(host_lengths):
            accepted, appended = outcome.accepted[row], outcome.num_new[row]
            length_budget = min(k, config.max_length - 1 - length)
            stopped = eos_ids is not None and not eos_ids.isdisjoint(new_tokens[row])
            cases["eos_cut"] += appended < accepted + 1  # an EOS among the accepted drafts ended the row
            # an EOS among the drafts not appended: no cut
            cases["eos_rejected"] += (
                not stopped and eos_ids is not None and not eos_ids.isdisjoint(drafts[row, accepted:].tolist())
            )
            cases["length_cut"] += verify_counts is None and length_budget < k
            cases["counts_cut"] += verify_counts is not None and int(verify_counts[row]) < length_budget
            cases["length_finish"] += not stopped and length + appended >= config.max_length
    assert all(count >= 10 for count in cases.values()), cases  # every case met, many times
