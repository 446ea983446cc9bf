"""benchmarks/drafter_call_splits.py: teacher-forced drafts at decoding's calls are decoding's drafts."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import build_verifier, load_repository_script

from specdec_hf import SpecDrafterModel, enable_speculative_decoding
from specdec_hf.training import distill_greedy_outputs, fit_drafter_in_memory

MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def script():
    return load_repository_script("benchmarks/drafter_call_splits.py", "drafter_call_splits")


@pytest.fixture(scope="module")
def verifier_and_data():
    """A tiny Marian whose EOS is the token it emits most, so that rows end at different lengths; its greedy
    outputs for 64 random sources."""
    model = build_verifier("marian")
    sources = torch.randint(4, 99, (64, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(sources)
    targets, _ = distill_greedy_outputs(model, sources, mask, max_new_tokens=MAX_NEW_TOKENS)
    eos = Counter(targets[:, 1:].flatten().tolist()).most_common(1)[0][0]
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    targets, lengths = distill_greedy_outputs(model, sources, mask, max_new_tokens=MAX_NEW_TOKENS)
    return model, sources, mask, targets, lengths


DRAFTERS = {
    # the shipped design: no encoder of its own, the verifier's decoder states, a reduced head
    "verifier-states-reduced-head": dict(use_verifier_encoder=True, verifier_state_layers=[1, 2]),
    # its own encoder, the full vocabulary
    "own-encoder": dict(encoder_layers=1),
}


@pytest.mark.parametrize("design", list(DRAFTERS))
def test_teacher_forced_drafts_at_the_calls_are_what_decoding_accepted(script, verifier_and_data, design):
    """At β=1 a call drafts from the same prefix and verifier states as the teacher-forced pass: the drafts decoding
    accepted are the leading right drafts at its calls (capped at the k it drafted; exact here, in float32)."""
    model, sources, mask, targets, lengths = verifier_and_data
    options = dict(DRAFTERS[design])
    if design.endswith("reduced-head"):
        options["draft_vocab_ids"] = sorted(set(targets.flatten().tolist()))
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", **options
    )
    fit_drafter_in_memory(drafter, sources[:56], mask[:56], targets[:56], lengths[:56], steps=100, verifier=model)
    drafter.eval()
    enable_speculative_decoding(model)

    accepted, output_lengths = 0, []
    for row in range(56, 64):
        inputs = {"input_ids": sources[row : row + 1], "attention_mask": mask[row : row + 1]}
        scores = script.score_splits(model, drafter, inputs, 4, MAX_NEW_TOKENS)
        output = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
        length = output.shape[1]
        output_lengths.append(length)
        assert scores.runs.shape == (length - 1,) and 0 <= int(scores.runs.min()) <= int(scores.runs.max()) <= 4
        assert scores.calls == sorted(set(scores.calls)) and all(0 <= call < length - 1 for call in scores.calls)
        assert bool((scores.runs_at_calls <= scores.runs[scores.calls]).all())
        assert scores.accepted == int(scores.runs_at_calls.sum())
        # every call drafts at least one token: its first draft is right exactly where it is the drafter's top choice
        assert torch.equal(scores.first_rank[scores.calls] == 0, scores.runs_at_calls >= 1)
        assert torch.equal(scores.first_rank == 0, scores.runs >= 1)
        assert scores.confidence.shape == scores.first_rank.shape == (length - 1,)
        # the verifier's probability of its own greedy token: its top probability wherever no processor chose it
        with torch.no_grad():
            teacher_forced = model(**inputs, decoder_input_ids=output).logits[0, :-1].softmax(dim=-1)
        assert torch.allclose(scores.confidence, teacher_forced.gather(1, output[0, 1:, None]).squeeze(1))
        is_top = torch.isclose(scores.confidence, teacher_forced.max(dim=-1).values)
        assert float(is_top.float().mean()) >= 0.9
        accepted += scores.accepted
    assert accepted > 0  # the trained drafter gets drafts accepted
    assert min(output_lengths) < 1 + MAX_NEW_TOKENS  # some rows end at EOS, before the length limit


def test_acceptance_profile_counts_leading_runs(script):
    assert script.acceptance_profile(torch.tensor([0, 1, 3, 4]), 4) == [0.75, 0.5, 0.5, 0.25]
    assert script.acceptance_profile(torch.tensor([], dtype=torch.long), 4) == []


def test_first_draft_rank_counts_higher_scores_and_marks_tokens_outside_the_head(script):
    class ReducedHead:
        def to_draft_vocab(self, token_ids):
            index = torch.tensor([-100, 0, 1, 2, -100])  # verifier ids 1, 2, 3 are head rows 0, 1, 2
            return index[token_ids]

    logits = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.2, 0.3], [0.3, 0.2, 0.1], [0.4, 0.4, 0.1], [0.4, 0.4, 0.1]])
    ranks = script.first_draft_rank(ReducedHead(), logits, torch.tensor([2, 3, 4, 1, 2]))
    # a tie ranks as the argmax breaks it: the first of the tied rows is the first choice
    assert ranks.tolist() == [0, 1, 3, 0, 1]


def test_by_verifier_confidence_buckets_the_split_points(script):
    confidence = torch.tensor([0.1, 0.3, 0.6, 0.9, 0.97, 1.0])
    first_rank = torch.tensor([0, 1, 2, 0, 0, 1])
    table = script.by_verifier_confidence(confidence, first_rank)
    assert [row["verifier_probability"] for row in table] == [[0.0, 0.5], [0.5, 0.8], [0.8, 0.95], [0.95, 1.0]]
    assert [row["share"] for row in table] == pytest.approx([2 / 6, 1 / 6, 1 / 6, 2 / 6])
    assert [row["first_choice"] for row in table] == [0.5, 0.0, 1.0, 0.5]
    assert [row["first_two"] for row in table] == [1.0, 0.0, 1.0, 1.0]
    empty = script.by_verifier_confidence(torch.tensor([0.99]), torch.tensor([0]))
    assert empty[0]["first_choice"] is None and empty[3]["first_choice"] == 1.0
