"""β = 1 speculative decoding equals greedy `generate()` token for token (the backbone test).

For every verifier family, batch 1 and a padded batch of 4, k in {1, 4, 10}, and drafters that are always right,
always wrong and right about half the time; each test on both ways an iteration settles (on the host, the CPU's
greedy path, and on tensors, an accelerator's: `generation.host_outcome`).
"""

from __future__ import annotations

import math
from copy import deepcopy

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import OracleDrafter, RandomDrafter
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from specdec_hf import enable_speculative_decoding, speculative_generate
from specdec_hf.generation.host_outcome import settling_on_tensors

GREEDY = dict(do_sample=False, num_beams=1)


# batches whose rows stay aligned (scores of a ragged batch) settle on tensors on every device
TENSORS_ONLY = {"test_scores_match_greedy_for_every_row_of_a_ragged_batch"}


@pytest.fixture(autouse=True, params=["host", "tensors"])
def settling(request, host_settlements):
    """Every test with iterations settled on the host (the CPU's default, checked to be taken) and on tensors (as an
    accelerator runs them)."""
    if request.param == "host" and request.node.originalname in TENSORS_ONLY:
        pytest.skip("aligned rows settle on tensors on every device")
    if request.param == "tensors":
        with settling_on_tensors():
            yield request.param
        assert not host_settlements
        return
    yield request.param
    assert host_settlements, "no iteration settled on the host"


def _eos_that_splits_rows(model, inputs, max_new_tokens):
    """A generated token that some rows emit early and others late or never: rows then stop at different lengths."""
    sequences = model.generate(**inputs, **GREEDY, max_new_tokens=max_new_tokens)
    generated = sequences[:, 2:]
    counts = torch.bincount(generated.flatten(), minlength=VOCAB_SIZE)
    counts[model.generation_config.decoder_start_token_id] = 0
    return int(counts.argmax())


def _greedy_and_speculative(model, inputs, drafter_accuracy, num_draft_tokens, **generate_kwargs):
    reference = model.generate(**inputs, **GREEDY, **generate_kwargs)
    drafter = OracleDrafter(reference, VOCAB_SIZE, num_draft_tokens, drafter_accuracy)
    output = model.generate(
        **inputs,
        **GREEDY,
        **generate_kwargs,
        custom_generate=speculative_generate,
        drafter=drafter,
        return_dict_in_generate=True,
    )
    return reference, output


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("num_draft_tokens", [1, 4, 10])
@pytest.mark.parametrize("accuracy", ["right", "wrong", "half"])
def test_beta_one_equals_greedy(family, batch_size, num_draft_tokens, accuracy):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, pad_token_id=model.config.pad_token_id)
    reference, output = _greedy_and_speculative(model, inputs, accuracy, num_draft_tokens, max_new_tokens=20)
    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    generated = (reference.shape[1] - 1) * batch_size
    assert sum(stats.generated_tokens) == generated
    if accuracy == "right":
        for row in range(batch_size):
            assert stats.iterations[row] <= math.ceil(stats.generated_tokens[row] / (num_draft_tokens + 1)) + 1
    if accuracy == "wrong":
        assert sum(stats.accepted_tokens) == 0
        assert stats.tokens_per_iteration == 1.0


@pytest.mark.parametrize("num_draft_tokens", [1, 4, 10])
def test_rows_stopping_at_different_lengths(family, num_draft_tokens):
    """EOS in the middle of drafts, rows finishing at different steps, pad after EOS like `_sample`."""
    model = build_verifier(family)
    inputs = make_source_batch(4, seed=1, pad_token_id=model.config.pad_token_id)
    model.generation_config.eos_token_id = _eos_that_splits_rows(model, inputs, max_new_tokens=24)
    for accuracy in ("right", "half"):
        reference, output = _greedy_and_speculative(model, inputs, accuracy, num_draft_tokens, max_new_tokens=24)
        assert torch.equal(output.sequences, reference)
    assert (reference == model.generation_config.pad_token_id).any(), "fixture should make some rows stop early"


GENERATE_OPTIONS = [
    dict(max_new_tokens=7),
    dict(max_new_tokens=16, min_new_tokens=12),
    dict(max_length=15, forced_eos_token_id=3),
    dict(max_new_tokens=16, repetition_penalty=1.5),
    dict(max_new_tokens=16, no_repeat_ngram_size=2),
]


@pytest.mark.parametrize("options", GENERATE_OPTIONS, ids=lambda o: "-".join(o))
@pytest.mark.parametrize("batch_size", [1, 4])
def test_logits_processors_and_lengths(family, options, batch_size):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=2, pad_token_id=model.config.pad_token_id)
    if "min_new_tokens" in options:
        # an EOS the model emits early, so that min_new_tokens has something to suppress
        model.generation_config.eos_token_id = _eos_that_splits_rows(model, inputs, max_new_tokens=16)
    for accuracy, num_draft_tokens in (("right", 10), ("half", 4), ("wrong", 1)):
        reference, output = _greedy_and_speculative(model, inputs, accuracy, num_draft_tokens, **options)
        assert torch.equal(output.sequences, reference), (accuracy, num_draft_tokens)


def test_scores_and_logits_match_greedy(family):
    model = build_verifier(family)
    inputs = make_source_batch(1, pad_token_id=model.config.pad_token_id)
    options = dict(max_new_tokens=12, repetition_penalty=1.3, output_scores=True, output_logits=True)
    reference = model.generate(**inputs, **GREEDY, **options, return_dict_in_generate=True)
    drafter = OracleDrafter(reference.sequences, VOCAB_SIZE, 4, "half")
    output = model.generate(
        **inputs,
        **GREEDY,
        **options,
        return_dict_in_generate=True,
        custom_generate=speculative_generate,
        drafter=drafter,
    )
    assert torch.equal(output.sequences, reference.sequences)
    assert len(output.scores) == len(reference.scores) and len(output.logits) == len(reference.logits)
    for ours, theirs in zip(output.scores, reference.scores, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    for ours, theirs in zip(output.logits, reference.logits, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_enable_speculative_decoding_route_matches_custom_generate():
    model = build_verifier("bart")
    other = build_verifier("bart")
    inputs = make_source_batch(4, pad_token_id=1)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=15)
    enable_speculative_decoding(model)
    enable_speculative_decoding(model)  # idempotent
    drafter = OracleDrafter(reference, VOCAB_SIZE, 4, "half")
    assert torch.equal(model.generate(**inputs, drafter=drafter, max_new_tokens=15), reference)
    assert drafter.calls > 0
    # without a drafter the instance behaves as before; other instances are untouched
    assert torch.equal(model.generate(**inputs, **GREEDY, max_new_tokens=15), reference)
    assert not getattr(other.generate, "speculative_decoding_enabled", False)
    with pytest.raises(ValueError, match="drafter"):
        other.generate(**inputs, drafter=drafter, max_new_tokens=15)


@pytest.mark.parametrize("tau", [0.0, 2.0, 100.0])
def test_beta_one_ignores_tau(tau):
    model = build_verifier("marian")
    inputs = make_source_batch(4, pad_token_id=1)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=15)
    output = model.generate(
        **inputs,
        **GREEDY,
        max_new_tokens=15,
        custom_generate=speculative_generate,
        drafter=RandomDrafter(VOCAB_SIZE, num_draft_tokens=4),
        beta=1,
        tau=tau,
    )
    assert torch.equal(output, reference)


def test_user_stopping_criteria_are_honoured():
    """A user's EosTokenCriteria / MaxLengthCriteria replace generate()'s defaults; the loop must follow them."""
    model = build_verifier("bart")
    inputs = make_source_batch(4, seed=1, pad_token_id=1)
    stop_token = _eos_that_splits_rows(model, inputs, max_new_tokens=20)
    criteria = StoppingCriteriaList([EosTokenCriteria(eos_token_id=[2, stop_token]), MaxLengthCriteria(12)])
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20, stopping_criteria=criteria)
    assert reference.shape[1] <= 12
    drafter = OracleDrafter(reference, VOCAB_SIZE, 4, "half")
    output = model.generate(
        **inputs,
        **GREEDY,
        max_new_tokens=20,
        stopping_criteria=criteria,
        custom_generate=speculative_generate,
        drafter=drafter,
    )
    assert torch.equal(output, reference)


def test_scores_match_greedy_for_every_row_of_a_ragged_batch():
    model = build_verifier("bart")
    inputs = make_source_batch(4, seed=1, pad_token_id=1)
    model.generation_config.eos_token_id = _eos_that_splits_rows(model, inputs, max_new_tokens=16)
    options = dict(max_new_tokens=16, output_scores=True, output_logits=True, return_dict_in_generate=True)
    reference = model.generate(**inputs, **GREEDY, **options)
    drafter = OracleDrafter(reference.sequences, VOCAB_SIZE, 4, "half")
    output = model.generate(**inputs, **GREEDY, **options, custom_generate=speculative_generate, drafter=drafter)
    assert torch.equal(output.sequences, reference.sequences)
    pad = model.generation_config.pad_token_id
    for step, (ours, theirs) in enumerate(zip(output.scores, reference.scores, strict=True)):
        # a row's scores are defined up to its EOS; after it, generate() scores the padding it appends
        emitted = output.sequences[:, step + 1] != pad
        torch.testing.assert_close(ours[emitted], theirs[emitted], rtol=1e-4, atol=1e-4)
    for step, (ours, theirs) in enumerate(zip(output.logits, reference.logits, strict=True)):
        emitted = output.sequences[:, step + 1] != pad
        torch.testing.assert_close(ours[emitted], theirs[emitted], rtol=1e-4, atol=1e-4)


def test_enabled_model_survives_deepcopy():
    model = enable_speculative_decoding(build_verifier("bart"))
    copy = deepcopy(model)
    inputs = make_source_batch(1, pad_token_id=1)
    reference = copy.generate(**inputs, **GREEDY, max_new_tokens=10)
    drafter = OracleDrafter(reference, VOCAB_SIZE, 4, "half")
    copy.generate(**inputs, drafter=drafter, max_new_tokens=10)
    assert drafter.calls > 0
    assert copy.generate.__self__ is copy
