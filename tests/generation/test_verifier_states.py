"""EAGLE-style drafting: the loop hands a drafter the verifier's exact states of committed tokens, from the
verification forward it already runs; feature-reading drafters keep β = 1 identical to greedy."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import StateRecordingDrafter

from specdec_hf import SpecDrafterModel, speculative_generate

GREEDY = dict(do_sample=False, num_beams=1)


def _teacher_forced_states(model, inputs, row, tokens, layers):
    encoder = model.get_encoder()(
        input_ids=inputs["input_ids"][row : row + 1], attention_mask=inputs["attention_mask"][row : row + 1]
    )
    outputs = model(
        encoder_outputs=encoder,
        attention_mask=inputs["attention_mask"][row : row + 1],
        decoder_input_ids=tokens[None],
        output_hidden_states=True,
        use_cache=False,
    )
    return torch.cat([outputs.decoder_hidden_states[index] for index in layers], dim=-1)[0]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_states_handed_to_the_drafter_equal_a_teacher_forced_pass(family, batch_size):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=1, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=16)
    drafter = StateRecordingDrafter(reference, VOCAB_SIZE, 4, "half", layers=(0, -1))
    output = model.generate(
        **inputs,
        **GREEDY,
        max_new_tokens=16,
        custom_generate=speculative_generate,
        drafter=drafter,
        return_dict_in_generate=True,
    )
    assert torch.equal(output.sequences, reference)
    if batch_size > 1:  # the rows accepted different numbers of drafts, so the verifier input was ragged
        assert len(set(output.speculative_stats.accepted_tokens)) > 1
    checked = 0
    for rows, prefix_ids, lengths, states in drafter.recorded:
        if states is None:  # the first call: only the start token, which has no state yet
            assert int(lengths.max()) == 1
            continue
        for local, row in enumerate(rows.tolist()):
            length = int(lengths[local])
            expected = _teacher_forced_states(
                model, inputs, row, prefix_ids[local, :length], drafter.verifier_state_layers
            )
            torch.testing.assert_close(states[local, : length - 1], expected[: length - 1], atol=1e-3, rtol=1e-3)
            checked += length - 1
    assert checked > 0


def _feature_drafter(model, num_draft_tokens, **overrides):
    torch.manual_seed(0)
    return SpecDrafterModel.from_verifier(
        model,
        max_draft_tokens=num_draft_tokens,
        decoder_layers=1,
        prefix_attention="causal",
        verifier_state_layers=[1, -1],
        **overrides,
    ).eval()


GENERATE_OPTIONS = [
    dict(max_new_tokens=12),
    dict(max_new_tokens=14, min_new_tokens=10),
    dict(max_length=13, forced_eos_token_id=3),
    dict(max_new_tokens=12, repetition_penalty=1.5, no_repeat_ngram_size=2),
]


@pytest.mark.parametrize("options", GENERATE_OPTIONS, ids=lambda o: "-".join(o))
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("num_draft_tokens", [1, 4, 10])
def test_feature_drafter_beta_one_equals_greedy(family, options, batch_size, num_draft_tokens):
    """A feature-reading Spec-Drafter with random weights: exactness does not depend on draft quality."""
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=2, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, **options)
    for overrides in (dict(use_verifier_encoder=True), dict(encoder_layers=1, draft_vocab_ids=list(range(0, 99, 2)))):
        drafter = _feature_drafter(model, num_draft_tokens, **overrides)
        output = model.generate(**inputs, **GREEDY, **options, custom_generate=speculative_generate, drafter=drafter)
        assert torch.equal(output, reference), overrides


def test_feature_drafter_samples_and_streams():
    """Sampling and a streamer keep working with a drafter that reads verifier states."""
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens.extend(value.flatten().tolist())

        def end(self):
            pass

    model = build_verifier("bart")
    inputs = make_source_batch(1, pad_token_id=1)
    drafter = _feature_drafter(model, 4, use_verifier_encoder=True)
    streamer = Collect()
    torch.manual_seed(0)
    output = model.generate(
        **inputs,
        do_sample=True,
        max_new_tokens=12,
        custom_generate=speculative_generate,
        drafter=drafter,
        token_streamer=streamer,
    )
    assert streamer.tokens == output[0].tolist()
    sampled = model.generate(
        **make_source_batch(3, pad_token_id=1),
        do_sample=True,
        num_return_sequences=2,
        max_new_tokens=8,
        custom_generate=speculative_generate,
        drafter=drafter,
    )
    assert sampled.shape[0] == 6


def test_feature_drafter_with_a_decoder_prompt_of_several_tokens():
    """A forced prefix (e.g. a language token) has no verifier states yet: the loop verifies it first, then drafts."""
    model = build_verifier("mbart")
    inputs = make_source_batch(2, pad_token_id=1)
    prompt = torch.tensor([[2, 7, 9], [2, 7, 9]])
    reference = model.generate(**inputs, decoder_input_ids=prompt, **GREEDY, max_new_tokens=10)
    drafter = _feature_drafter(model, 4, use_verifier_encoder=True)
    output = model.generate(
        **inputs,
        decoder_input_ids=prompt,
        **GREEDY,
        max_new_tokens=10,
        custom_generate=speculative_generate,
        drafter=drafter,
        return_dict_in_generate=True,
    )
    assert torch.equal(output.sequences, reference)
    recording = StateRecordingDrafter(reference, VOCAB_SIZE, 4, "half", layers=(-1,))
    model.generate(
        **inputs,
        decoder_input_ids=prompt,
        **GREEDY,
        max_new_tokens=10,
        custom_generate=speculative_generate,
        drafter=recording,
    )
    _, _, lengths, states = recording.recorded[0]
    assert int(lengths.min()) == 4 and states is not None  # the prompt was verified first, its states recorded


def test_state_layers_the_verifier_lacks_are_named():
    model = build_verifier("bart")  # 2 decoder layers: hidden states 0, 1, 2
    with pytest.raises(ValueError, match="indices -3 to 2"):
        SpecDrafterModel.from_verifier(model, prefix_attention="causal", verifier_state_layers=[3])
    recording = StateRecordingDrafter(torch.zeros(1, 4, dtype=torch.long), VOCAB_SIZE, 4, layers=(5,))
    with pytest.raises(ValueError, match="verifier_state_layers"):
        model.generate(
            **make_source_batch(1), max_new_tokens=4, custom_generate=speculative_generate, drafter=recording
        )
