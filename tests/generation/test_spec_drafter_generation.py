"""Speculative decoding with the real Spec-Drafter model: exact at β=1, and a briefly trained drafter pays off."""

from __future__ import annotations

import pytest
import torch
from conftest import build_verifier, make_source_batch

from specdec_hf import SpecDrafterModel, enable_speculative_decoding, speculative_generate
from specdec_hf.generation import SpecDrafterAdapter
from specdec_hf.generation.loop_state import ActiveBatch, SpeculativeLoopConfig
from specdec_hf.generation.speculative_loop import _iteration_k
from specdec_hf.training import distill_greedy_outputs, fit_drafter_in_memory

DRAFTER_VARIANTS = {
    "bidirectional": dict(prefix_attention="bidirectional"),
    "causal": dict(prefix_attention="causal"),
    "verifier-encoder": dict(prefix_attention="causal", use_verifier_encoder=True),
}


@pytest.mark.parametrize("variant", list(DRAFTER_VARIANTS))
def test_untrained_spec_drafter_keeps_greedy_output(family, variant):
    model = build_verifier(family)
    torch.manual_seed(1)
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=4, decoder_layers=1, **DRAFTER_VARIANTS[variant]
    ).eval()
    inputs = make_source_batch(4, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=20)
    output = model.generate(
        **inputs, do_sample=False, max_new_tokens=20, custom_generate=speculative_generate, drafter=drafter
    )
    assert torch.equal(output, reference)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_drafter_with_fewer_positions_than_the_output_drafts_within_them_and_stays_exact(batch_size):
    """A drafter whose learned positions end before `max_new_tokens` drafts fewer tokens near its limit and none past
    it (the verifier steps alone), instead of failing partway through the generation."""
    model = build_verifier("bart")
    torch.manual_seed(1)
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", max_position_embeddings=12
    ).eval()
    calls = []  # (longest prefix, k) of every drafter call

    class RecordingAdapter(SpecDrafterAdapter):
        def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
            calls.append((int(prefix_lengths.max()), num_draft_tokens))
            return super().propose(state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states)

    inputs = make_source_batch(batch_size, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    output = model.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=24,
        min_new_tokens=24,
        custom_generate=speculative_generate,
        drafter=RecordingAdapter(drafter),
        return_dict_in_generate=True,
    )
    assert torch.equal(output.sequences, reference) and reference.shape[1] == 25
    stats = output.speculative_stats
    # past position 12 the drafter is not called: fewer drafter calls than verifier iterations
    assert 0 < stats.drafter_calls == len(calls) < max(stats.iterations)
    # every call's mask slots fit in the 12 positions; k is 4 while they do and shrinks, not skips, near the end
    assert all(longest + k <= 12 for longest, k in calls)
    assert all(k == 4 for longest, k in calls if longest + 4 <= 12)
    assert any(0 < k < 4 for _, k in calls)


@pytest.mark.parametrize(
    ("longest", "limit", "max_length", "expected"),
    [(7, 12, 100, 4), (8, 12, 100, 4), (9, 12, 100, 3), (11, 12, 100, 1), (12, 12, 100, 0), (5, None, 8, 2)],
)
def test_iteration_k_shrinks_at_the_position_limit_and_the_length_budget(longest, limit, max_length, expected):
    """k = 4 while the mask slots fit; then what still fits in the positions (or the length budget), down to 0."""
    config = SpeculativeLoopConfig(
        num_draft_tokens=4, beta=1, tau=0.0, max_length=max_length, pad_token_id=0, vocab_size=10, eos_token_ids=None
    )
    lengths = torch.tensor([longest])
    batch = ActiveBatch(torch.zeros(1, longest, dtype=torch.long), lengths, [longest], longest, longest)
    assert _iteration_k(config, batch, limit, None, None) == expected


def test_config_num_draft_tokens_sets_the_k_drafted_without_num_draft_tokens(tmp_path):
    """`config.num_draft_tokens` is generate()'s k when none is given; an explicit `num_draft_tokens` still overrides it
    up to the drafter's slot count, and the setting survives save/load."""
    model = build_verifier("bart")
    torch.manual_seed(1)
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=6, num_draft_tokens=3, decoder_layers=1, prefix_attention="causal"
    ).eval()
    drafter.save_pretrained(tmp_path)
    drafter = SpecDrafterModel.from_pretrained(tmp_path).eval()
    assert (drafter.config.num_draft_tokens, drafter.config.max_draft_tokens) == (3, 6)
    inputs = make_source_batch(2, pad_token_id=model.config.pad_token_id)
    kwargs = dict(do_sample=False, max_new_tokens=12, custom_generate=speculative_generate, drafter=drafter)
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=12)
    for num_draft_tokens, expected_k in ((None, 3), (6, 6)):
        extra = {} if num_draft_tokens is None else {"num_draft_tokens": num_draft_tokens}
        output = model.generate(**inputs, **kwargs, **extra, return_dict_in_generate=True)
        assert torch.equal(output.sequences, reference)
        assert len(output.speculative_stats.verified_at_position) == expected_k


def test_briefly_trained_drafter_accepts_more_than_one_token_per_iteration():
    model = build_verifier("bart")
    generator = torch.Generator().manual_seed(0)
    sources = torch.randint(4, 99, (96, 10), generator=generator)
    mask = torch.ones_like(sources)
    targets, lengths = distill_greedy_outputs(model, sources, mask, max_new_tokens=16)
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(model, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal")
    losses = fit_drafter_in_memory(drafter, sources[:80], mask[:80], targets[:80], lengths[:80], steps=150)
    assert sum(losses[-10:]) < sum(losses[:10])

    enable_speculative_decoding(model)
    held_out = {"input_ids": sources[80:], "attention_mask": mask[80:]}
    trained = model.generate(**held_out, drafter=drafter, max_new_tokens=16, return_dict_in_generate=True)
    assert torch.equal(trained.sequences, targets[80:])
    untrained = SpecDrafterModel.from_verifier(model, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal")
    baseline = model.generate(**held_out, drafter=untrained.eval(), max_new_tokens=16, return_dict_in_generate=True)
    print(
        f"Tok. trained {trained.speculative_stats.tokens_per_iteration:.2f}, "
        f"untrained {baseline.speculative_stats.tokens_per_iteration:.2f}"
    )
    assert trained.speculative_stats.tokens_per_iteration > 1.5
    assert trained.speculative_stats.tokens_per_iteration > baseline.speculative_stats.tokens_per_iteration


def test_num_return_sequences_with_a_drafter_that_reads_the_source():
    model = build_verifier("marian")
    torch.manual_seed(1)
    drafter = SpecDrafterModel.from_verifier(model, max_draft_tokens=3, decoder_layers=1).eval()
    inputs = make_source_batch(2, pad_token_id=model.config.pad_token_id)
    torch.manual_seed(0)
    output = model.generate(
        **inputs,
        do_sample=True,
        num_return_sequences=3,
        max_new_tokens=8,
        custom_generate=speculative_generate,
        drafter=drafter,
        return_dict_in_generate=True,
    )
    assert output.sequences.shape[0] == 6
    assert sum(output.speculative_stats.iterations) > 0


def test_drafter_with_user_encoder_outputs():
    """generate(encoder_outputs=...) leaves no source ids; a drafter reading the verifier's encoder still works."""
    model = build_verifier("bart")
    torch.manual_seed(1)
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=3, decoder_layers=1, use_verifier_encoder=True
    ).eval()
    inputs = make_source_batch(2, pad_token_id=1)
    encoder_outputs = model.get_encoder()(**inputs)
    reference = model.generate(
        encoder_outputs=encoder_outputs, attention_mask=inputs["attention_mask"], do_sample=False, max_new_tokens=8
    )
    output = model.generate(
        encoder_outputs=encoder_outputs,
        attention_mask=inputs["attention_mask"],
        do_sample=False,
        max_new_tokens=8,
        custom_generate=speculative_generate,
        drafter=drafter,
    )
    assert torch.equal(output, reference)
