"""Processors and criteria that read a row's index, and scores after EOS, at batch > 1: exactly as greedy shows them.

A user's processor that acts per batch row, a criterion with a limit per row, `prefix_allowed_tokens_fn(batch_id,
...)` and the encoder n-gram processors see each row under its own index, and `output_scores` returns the scores of
the padding after a row's EOS, as greedy `generate()` does (`specdec_hf.generation.aligned_rows`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, generate_with_drafter, make_source_batch
from oracle_drafters import OracleDrafter, RandomDrafter
from transformers import AutoTokenizer, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor
from transformers.generation.stopping_criteria import (
    ConfidenceCriteria,
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StopStringCriteria,
)

from specdec_hf.generation.aligned_rows import criteria_read_scores, needs_aligned_rows, reads_row_index

GREEDY = dict(do_sample=False, num_beams=1)


class BanPerRow(LogitsProcessor):
    """Bans a different token in each row: row r may never emit token `3 + 5 r` (a row index read as such)."""

    def __call__(self, input_ids, scores):
        banned = 3 + 5 * torch.arange(scores.shape[0], device=scores.device)
        return scores.scatter(1, banned.unsqueeze(1), float("-inf"))


class FavourPerRow(LogitsProcessor):
    """Raises a different token in each row, by more than a random model's logits differ: rows follow it often."""

    def __call__(self, input_ids, scores):
        favoured = (7 + 3 * torch.arange(scores.shape[0], device=scores.device) + input_ids.shape[1]) % VOCAB_SIZE
        return scores.scatter_add(1, favoured.unsqueeze(1), torch.full_like(scores[:, :1], 2.0))


class StopPerRow(StoppingCriteria):
    """Stops row r once it holds `6 + 4 r` tokens."""

    def __call__(self, input_ids, scores, **kwargs):
        limits = 6 + 4 * torch.arange(input_ids.shape[0], device=input_ids.device)
        return input_ids.shape[1] >= limits


def _both(model, inputs, accuracy="half", num_draft_tokens=4, **options):
    reference = model.generate(**inputs, **GREEDY, return_dict_in_generate=True, **options)
    drafter = OracleDrafter(reference.sequences, VOCAB_SIZE, num_draft_tokens, accuracy)
    output = generate_with_drafter(model, inputs, drafter, num_draft_tokens=num_draft_tokens, **options)
    return reference, output


@pytest.mark.parametrize("accuracy", ["right", "half", "wrong"])
def test_a_processor_acting_per_row_gives_greedy_output(family, accuracy):
    model = build_verifier(family)
    inputs = make_source_batch(4, seed=2, pad_token_id=model.config.pad_token_id)
    processors = LogitsProcessorList([FavourPerRow(), BanPerRow()])
    reference, output = _both(model, inputs, accuracy, logits_processor=processors, max_new_tokens=16)
    assert torch.equal(output.sequences, reference.sequences)
    # the processor did act per row: greedy's rows differ from what the same processor gives row 0's index
    assert not torch.equal(reference.sequences[1:], reference.sequences[:1].expand(3, -1))


def test_a_stopping_criterion_per_row_gives_greedy_output(family):
    model = build_verifier(family)
    inputs = make_source_batch(4, seed=3, pad_token_id=model.config.pad_token_id)
    criteria = StoppingCriteriaList([StopPerRow()])
    reference, output = _both(model, inputs, stopping_criteria=criteria, max_new_tokens=30)
    assert torch.equal(output.sequences, reference.sequences)
    pad = model.generation_config.pad_token_id
    # rows stop at their own limits (6, 10, 14, 18 tokens), as greedy stops them
    lengths = (reference.sequences != pad).sum(dim=1) + (reference.sequences[:, 0] == pad).long()
    assert lengths.tolist()[:3] == [6, 10, 14]


@pytest.mark.parametrize("accuracy", ["half", "wrong"])
def test_without_eos_a_stopped_row_goes_on_as_greedys_does(family, accuracy):
    """Without an EOS criterion greedy appends no pad after a criterion stops a row: it goes on decoding it until
    the last row stops. The loop keeps those rows decoding too."""
    model = build_verifier(family)
    model.generation_config.eos_token_id = None
    inputs = make_source_batch(4, seed=3, pad_token_id=model.config.pad_token_id)
    criteria = StoppingCriteriaList([StopPerRow()])
    reference, output = _both(model, inputs, accuracy, stopping_criteria=criteria, max_new_tokens=30)
    assert torch.equal(output.sequences, reference.sequences)
    assert (reference.sequences[0, 6:] != model.config.pad_token_id).any(), "greedy decoded past row 0's stop"


def test_prefix_allowed_tokens_fn_reads_the_batch_row(family):
    model = build_verifier(family)
    inputs = make_source_batch(3, seed=4, pad_token_id=model.config.pad_token_id)
    eos = model.generation_config.eos_token_id

    def allowed(batch_id, ids):  # each row writes from its own third of the vocabulary (and may end)
        third = VOCAB_SIZE // 3
        return [*range(batch_id * third, (batch_id + 1) * third), eos]

    reference, output = _both(model, inputs, prefix_allowed_tokens_fn=allowed, max_new_tokens=12)
    assert torch.equal(output.sequences, reference.sequences)


@pytest.mark.parametrize("options", [dict(encoder_repetition_penalty=1.5), dict(encoder_no_repeat_ngram_size=2)])
def test_encoder_processors_read_their_own_row(options):
    model = build_verifier("bart")
    inputs = make_source_batch(4, seed=5, pad_token_id=1)
    reference, output = _both(model, inputs, max_new_tokens=14, **options)
    assert torch.equal(output.sequences, reference.sequences)


def test_scores_after_eos_are_greedy_scores_of_the_padding():
    model = build_verifier("bart")
    inputs = make_source_batch(4, seed=1, pad_token_id=1)
    first = model.generate(**inputs, **GREEDY, max_new_tokens=16)
    counts = torch.bincount(first[:, 2:].flatten(), minlength=VOCAB_SIZE)
    model.generation_config.eos_token_id = int(counts.argmax())  # some rows end early, others late
    options = dict(max_new_tokens=16, output_scores=True, output_logits=True, repetition_penalty=1.3)
    reference, output = _both(model, inputs, **options)
    assert torch.equal(output.sequences, reference.sequences)
    assert (output.sequences == model.generation_config.pad_token_id).any()  # some row did end early
    assert len(output.scores) == len(reference.scores)
    for ours, theirs in zip(output.scores, reference.scores, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)  # every row, after its EOS too
    for ours, theirs in zip(output.logits, reference.logits, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    # the padding after EOS is not counted as generated
    pad = model.generation_config.pad_token_id
    generated = int((reference.sequences[:, 1:] != pad).sum())
    assert sum(output.speculative_stats.generated_tokens) == generated


def test_processors_see_the_whole_batch_in_order_at_every_call():
    model = build_verifier("bart")
    inputs = make_source_batch(4, seed=6, pad_token_id=1)
    seen = []

    class Watch(LogitsProcessor):
        def __call__(self, input_ids, scores):
            seen.append(input_ids.clone())
            return scores

    generate_with_drafter(
        model, inputs, RandomDrafter(VOCAB_SIZE), logits_processor=LogitsProcessorList([Watch()]), max_new_tokens=10
    )
    # every call holds the 4 rows, at one length (rows are never dropped or grouped)
    assert seen and all(ids.shape[0] == 4 for ids in seen)


def test_which_runs_keep_rows_aligned():
    eos_and_length = StoppingCriteriaList([EosTokenCriteria(2), MaxLengthCriteria(20)])
    transformers_own = LogitsProcessorList([NoRepeatNGramLogitsProcessor(3)])
    assert not needs_aligned_rows(transformers_own, eos_and_length, batch_size=4, output_scores=False)
    assert needs_aligned_rows(transformers_own, eos_and_length, batch_size=4, output_scores=True)
    assert needs_aligned_rows(LogitsProcessorList([BanPerRow()]), eos_and_length, 4, output_scores=False)
    assert needs_aligned_rows(transformers_own, StoppingCriteriaList([StopPerRow()]), 4, output_scores=False)
    # one row has no index to misread
    assert not needs_aligned_rows(LogitsProcessorList([BanPerRow()]), eos_and_length, 1, output_scores=True)
    assert reads_row_index(BanPerRow()) and not reads_row_index(NoRepeatNGramLogitsProcessor(2))


class StopAfterStepsRecordingScores(StoppingCriteria):
    """Reads `scores` as transformers documents it (a tuple of one `(batch, vocab)` tensor per step, or None),
    stops row r after `3 + 2 r` generated steps, and keeps a copy of every `scores` it was handed."""

    def __init__(self):
        self.handed = []

    def __call__(self, input_ids, scores, **kwargs):
        self.handed.append(None if scores is None else torch.stack(scores, dim=1).clone())
        steps = input_ids.shape[1] - 1
        return steps >= 3 + 2 * torch.arange(input_ids.shape[0], device=input_ids.device)


def _with_criteria(model, inputs, greedy_criterion, speculative_criterion, **options):
    """Greedy with one criterion, then k=4 speculative decoding (an oracle half right) with its twin."""
    reference = model.generate(
        **inputs, **GREEDY, return_dict_in_generate=True, stopping_criteria=StoppingCriteriaList([greedy_criterion]),
        **options,
    )  # fmt: skip
    drafter = OracleDrafter(reference.sequences, VOCAB_SIZE, 4, "half")
    output = generate_with_drafter(
        model, inputs, drafter, num_draft_tokens=4, stopping_criteria=StoppingCriteriaList([speculative_criterion]),
        **options,
    )  # fmt: skip
    return reference, output


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("output_scores", [False, True])
def test_a_criterion_reads_scores_as_greedy_hands_them(batch_size, output_scores):
    """`scores` reaches a criterion as greedy hands it at every call: None without `output_scores`, else every
    step so far, with rows finishing at different iterations."""
    model = build_verifier("bart")
    inputs = make_source_batch(batch_size, seed=5, pad_token_id=model.config.pad_token_id)
    options = dict(max_new_tokens=20, output_scores=output_scores)
    greedy_criterion, speculative_criterion = StopAfterStepsRecordingScores(), StopAfterStepsRecordingScores()
    reference, output = _with_criteria(model, inputs, greedy_criterion, speculative_criterion, **options)
    assert torch.equal(output.sequences, reference.sequences)
    assert len(speculative_criterion.handed) == len(greedy_criterion.handed) == 3 + 2 * (batch_size - 1)
    for ours, theirs in zip(speculative_criterion.handed, greedy_criterion.handed, strict=True):
        if output_scores:
            torch.testing.assert_close(ours, theirs)
        else:
            assert ours is None and theirs is None


class EosWithScores(EosTokenCriteria):
    """transformers' EOS criterion with a call of its own, which may read `scores`."""

    def __call__(self, input_ids, scores, **kwargs):
        return super().__call__(input_ids, scores, **kwargs)


def test_which_criteria_are_handed_the_score_history():
    """The loop keeps the scores of every step only for criteria that may read them: not for transformers' length,
    EOS, time and stop-string criteria, but for its confidence criterion, a user's and a subclass with its own
    call."""
    tokenizer = AutoTokenizer.from_pretrained(
        Path(__file__).resolve().parents[2] / "models" / "demo-en-de" / "verifier"
    )
    stop_strings = StopStringCriteria(tokenizer, ["file"])
    own = [EosTokenCriteria(2), MaxLengthCriteria(20), MaxTimeCriteria(60.0), stop_strings]
    assert not criteria_read_scores(StoppingCriteriaList(own))
    assert criteria_read_scores(StoppingCriteriaList([*own, ConfidenceCriteria(0.5)]))
    assert criteria_read_scores(StoppingCriteriaList([*own, StopAfterStepsRecordingScores()]))
    assert criteria_read_scores(StoppingCriteriaList([EosWithScores(2), MaxLengthCriteria(20)]))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_an_eos_subclass_with_its_own_call_gets_the_scores_greedy_hands_it(batch_size):
    """A subclass of transformers' EOS criterion is called (not replaced by the vectorised EOS stop) and reads the
    scores as greedy hands them."""

    class RecordingEos(EosWithScores):
        def __init__(self, eos_token_id):
            super().__init__(eos_token_id)
            self.lengths = []

        def __call__(self, input_ids, scores, **kwargs):
            self.lengths.append(None if scores is None else len(scores))
            return super().__call__(input_ids, scores, **kwargs)

    model = build_verifier("bart")
    inputs = make_source_batch(batch_size, seed=5, pad_token_id=model.config.pad_token_id)
    eos = model.generation_config.eos_token_id
    greedy_criterion, speculative_criterion = RecordingEos(eos), RecordingEos(eos)
    options = dict(max_new_tokens=12, output_scores=True)
    reference, output = _with_criteria(model, inputs, greedy_criterion, speculative_criterion, **options)
    assert torch.equal(output.sequences, reference.sequences)
    assert speculative_criterion.lengths == greedy_criterion.lengths and greedy_criterion.lengths[-1] > 1
