"""Unsupported or malformed requests raise `ValueError` naming the argument and the fix; nothing falls back."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import RandomDrafter
from transformers import GPT2Config, GPT2LMHeadModel, SynthIDTextWatermarkingConfig
from transformers.generation.streamers import BaseStreamer

from specdec_hf import SpecDrafterModel, enable_speculative_decoding, speculative_generate
from specdec_hf.generation.api import _decoder_vocab_size


@pytest.fixture
def bart():
    return build_verifier("bart")


@pytest.fixture
def inputs():
    return make_source_batch(2, pad_token_id=1)


def _generate(model, inputs, **kwargs):
    kwargs.setdefault("drafter", RandomDrafter(VOCAB_SIZE))
    return model.generate(**inputs, max_new_tokens=5, custom_generate=speculative_generate, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beta=0), "`beta`"),
        (dict(beta=2.5), "`beta`"),
        (dict(tau=-1.0), "`tau`"),
        (dict(beta=2, tau="x"), "`tau` must be a finite number >= 0 .*got 'x'"),
        (dict(num_draft_tokens=0), "`num_draft_tokens`"),
        (dict(num_draft_tokens=2.5), "`num_draft_tokens` must be an integer >= 1 .*got 2.5"),
        (dict(block_size=4), "block_size"),  # the earlier name of num_draft_tokens is refused, not ignored
        (dict(num_beams=3), "num_beams"),
        (dict(do_sample=True, beta=2), "do_sample"),
        (dict(do_sample=True, tau=1.0), "do_sample"),
        (dict(cache_implementation="static"), "cache_implementation"),
        (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
        (dict(penalty_alpha=0.6, top_k=4), "contrastive_search"),
        (dict(prompt_lookup_num_tokens=3), "assisted_generation"),
        (dict(drafter=None), "`drafter` is required"),
        (dict(drafter=RandomDrafter(VOCAB_SIZE + 1)), "vocabulary size"),
        (dict(drafter=object()), "drafting interface"),
    ],
)
def test_bad_arguments(bart, inputs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _generate(bart, inputs, **kwargs)


@pytest.mark.parametrize("drafts", [True, False])
def test_synthid_watermarking_is_refused(bart, inputs, drafts, monkeypatch):
    """Its state takes every call for one step of the whole batch (a shape error deep in it before): refused, named,
    also in a call that `"auto"` decodes without drafting (before 8cd64d3 such calls ran transformers' loop)."""
    from specdec_hf.generation import draft_length

    monkeypatch.setattr(draft_length.DraftLengthSchedule, "drafts_this_call", lambda schedule, *args: drafts)
    drafter = RandomDrafter(VOCAB_SIZE)
    drafter.init_drafting_state = lambda *args, **kwargs: pytest.fail("refused before the drafter is set up")
    watermark = SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340], ngram_len=3)
    with pytest.raises(ValueError, match="SynthID watermarking .*`watermarking_config"):
        _generate(bart, inputs, drafter=drafter, watermarking_config=watermark, num_draft_tokens="auto")


def test_beam_search_refusal_names_both_settings(bart, inputs):
    with pytest.raises(ValueError, match="num_beams=3") as refused:
        _generate(bart, inputs, num_beams=3)
    message = str(refused.value)
    assert "`num_beams=1`" in message and "`beta=1`" in message and "beta=5, tau=3" in message
    assert "--num_beams 5" in message and "generation_config asks" not in message
    # the beam-quality setting comes with what it was measured to give, and plain beam search as today's answer
    assert "below greedy's" in message and "run plain beam search" in message
    # a checkpoint whose own config decodes with beam search (bart-large-cnn: 4 beams) is told so
    bart.generation_config.num_beams = 4
    with pytest.raises(ValueError, match="the verifier's own generation_config asks for it"):
        _generate(bart, inputs)


def test_decoder_only_verifier_is_rejected():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB_SIZE, n_embd=16, n_layer=1, n_head=2)).eval()
    ids = torch.randint(0, VOCAB_SIZE, (1, 5))
    with pytest.raises(ValueError, match="decoder-only"):
        model.generate(
            input_ids=ids, max_new_tokens=3, custom_generate=speculative_generate, drafter=RandomDrafter(VOCAB_SIZE)
        )
    with pytest.raises(ValueError, match="decoder-only"):
        enable_speculative_decoding(model)


def test_enabled_model_rejects_misplaced_arguments(bart, inputs):
    enable_speculative_decoding(bart)
    with pytest.raises(ValueError, match="only apply with a `drafter`"):
        bart.generate(**inputs, beta=3)
    with pytest.raises(ValueError, match="A streamer needs `put\\(\\)` and `end\\(\\)`"):
        bart.generate(**inputs, drafter=RandomDrafter(VOCAB_SIZE), streamer=object(), max_new_tokens=3)
    # BaseStreamer's end() raises NotImplementedError: the refusal is still the error raised
    with pytest.raises(ValueError, match="batch size 1"):
        bart.generate(**inputs, drafter=RandomDrafter(VOCAB_SIZE), streamer=BaseStreamer(), max_new_tokens=3)
    with pytest.raises(ValueError, match="custom_generate=speculative_generate"):
        bart.generate(**inputs, drafter=RandomDrafter(VOCAB_SIZE), custom_generate=lambda *a, **k: None)
    with pytest.raises(ValueError, match="`num_draft_tokens` must be at most the drafter's 4"):
        bart.generate(**inputs, drafter=SpecDrafterModel.from_verifier(bart, max_draft_tokens=4), num_draft_tokens=20)
    # a drafter's directory, not the drafter: refused, not taken for a model to load
    with pytest.raises(ValueError, match=r"`drafter` \(str\) does not implement the drafting interface"):
        bart.generate(**inputs, drafter="models/demo-en-de/drafter", max_new_tokens=3)


def test_enabled_model_accepts_the_transformers_route_too(bart, inputs):
    """A user (or a library) passing custom_generate=speculative_generate after the opt-in gets speculative decoding."""
    drafter = RandomDrafter(VOCAB_SIZE)
    expected = bart.generate(**inputs, custom_generate=speculative_generate, drafter=drafter, max_new_tokens=8)
    enable_speculative_decoding(bart)
    both = bart.generate(**inputs, custom_generate=speculative_generate, drafter=drafter, max_new_tokens=8)
    assert torch.equal(both, expected)


def test_a_verifier_encoder_reader_built_for_another_width_is_named(bart, inputs):
    """It failed inside its projection: "mat1 and mat2 shapes cannot be multiplied"."""
    wide = build_verifier("bart", d_model=64, encoder_attention_heads=4, decoder_attention_heads=4)
    drafter = SpecDrafterModel.from_verifier(wide, max_draft_tokens=4, decoder_layers=1, use_verifier_encoder=True)
    with pytest.raises(ValueError, match=r"built for a verifier of width 64 .*has width 32: use the drafter with"):
        _generate(bart, inputs, drafter=drafter)


def test_the_vocabulary_check_follows_a_resized_verifier(bart, inputs):
    """The verifier's vocabulary size is kept between calls (reading it deep-copies a flat config) but read again
    once the config's vocabulary changes: a drafter of the old size is then refused, one of the new size runs."""
    _generate(bart, inputs)
    bart.resize_token_embeddings(VOCAB_SIZE + 8)
    with pytest.raises(ValueError, match="vocabulary size"):
        _generate(bart, inputs)
    assert _generate(bart, inputs, drafter=RandomDrafter(VOCAB_SIZE + 8)).shape[0] == 2


def test_the_vocabulary_checked_is_the_decoders_own():
    """Marian's target vocabulary (`decoder_vocab_size`, with separate embeddings) is the one a drafter must match,
    as transformers reads it."""
    model = build_verifier("marian", decoder_vocab_size=VOCAB_SIZE - 4, share_encoder_decoder_embeddings=False)
    assert model.config.vocab_size == VOCAB_SIZE and model.get_output_embeddings().out_features == VOCAB_SIZE - 4
    source = make_source_batch(1, pad_token_id=model.config.pad_token_id)
    with pytest.raises(ValueError, match="vocabulary size"):
        _generate(model, source, drafter=RandomDrafter(VOCAB_SIZE))
    assert _generate(model, source, drafter=RandomDrafter(VOCAB_SIZE - 4)).shape[0] == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_the_kept_vocabulary_size_is_what_transformers_reads(family):
    model = build_verifier(family)
    assert _decoder_vocab_size(model) == model.config.get_text_config(decoder=True).vocab_size
    model.config.vocab_size += 3  # a field it comes from changed: read again
    if hasattr(model.config, "decoder_vocab_size"):  # Marian: the decoder's own vocabulary too
        model.config.decoder_vocab_size += 5
    assert _decoder_vocab_size(model) == model.config.get_text_config(decoder=True).vocab_size
