"""Building a drafter from a verifier of each supported family (`SpecDrafterModel.from_verifier`)."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from tiny_drafters import ATOL, NUM_DRAFT_TOKENS, propose_fresh, random_prefixes
from transformers import (
    AutoModel,
    BlenderbotSmallConfig,
    BlenderbotSmallForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    MT5Config,
    MT5ForConditionalGeneration,
)

from specdec_hf.models import SpecDrafterModel


def _encoder_layers(encoder):
    return encoder.block if hasattr(encoder, "block") else encoder.layers


def _check_drafter_matches_verifier(drafter, verifier, source):
    config, verifier_config = drafter.config, verifier.config
    assert config.vocab_size == config.verifier_vocab_size == verifier_config.vocab_size
    assert config.pad_token_id == verifier_config.pad_token_id
    assert config.eos_token_id == verifier_config.eos_token_id
    assert config.decoder_start_token_id == verifier.generation_config.decoder_start_token_id
    assert config.d_model == verifier_config.d_model
    assert config.verifier_name_or_path == (verifier.name_or_path or None)
    assert torch.equal(drafter.shared.weight, verifier.get_input_embeddings().weight)
    assert drafter.encoder.embed_tokens.weight is drafter.shared.weight
    verifier_encoder = verifier.get_encoder()
    verifier_state = verifier_encoder.state_dict()
    for name, tensor in drafter.encoder.state_dict().items():
        assert torch.equal(tensor, verifier_state[name]), name
    with torch.no_grad():
        expected = verifier_encoder(**source).last_hidden_state
        encoded = drafter.encode(source["input_ids"], source["attention_mask"])
    torch.testing.assert_close(encoded, expected)


def test_from_verifier(family, tmp_path):
    verifier = build_verifier(family)
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=NUM_DRAFT_TOKENS, decoder_layers=1)
    assert (
        type(drafter.encoder).__name__
        == {
            "bart": "BartEncoder",
            "mbart": "MBartEncoder",
            "marian": "MarianEncoder",
            "pegasus": "PegasusEncoder",
            "t5": "T5Stack",
        }[family]
    )
    assert drafter.config.max_draft_tokens == NUM_DRAFT_TOKENS and len(drafter.decoder.layers) == 1
    source = make_source_batch(2, pad_token_id=verifier.config.pad_token_id)
    _check_drafter_matches_verifier(drafter, verifier, source)

    start = drafter.config.decoder_start_token_id
    prefix_ids = torch.tensor([[start, 5, 6], [start, 7, verifier.config.pad_token_id]])
    proposal = propose_fresh(drafter, source, prefix_ids, [3, 2])
    assert proposal.draft_ids.shape == (2, NUM_DRAFT_TOKENS)

    drafter.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(loaded.encoder) is type(drafter.encoder)
    assert loaded.encoder.embed_tokens.weight is loaded.shared.weight
    torch.testing.assert_close(propose_fresh(loaded, source, prefix_ids, [3, 2]).draft_logits, proposal.draft_logits)


def test_from_verifier_mt5():
    torch.manual_seed(0)
    verifier = MT5ForConditionalGeneration(
        MT5Config(
            vocab_size=VOCAB_SIZE, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, decoder_start_token_id=0
        )
    ).eval()
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=NUM_DRAFT_TOKENS)
    _check_drafter_matches_verifier(drafter, verifier, make_source_batch(2, pad_token_id=0))


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_from_verifier_copies_first_encoder_layers(family):
    verifier = build_verifier(family)
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=NUM_DRAFT_TOKENS, encoder_layers=1)
    assert drafter.config.encoder_layers == 1
    assert len(_encoder_layers(drafter.encoder)) == 1
    first_layer = _encoder_layers(verifier.get_encoder())[0].state_dict()
    for name, tensor in _encoder_layers(drafter.encoder)[0].state_dict().items():
        assert torch.equal(tensor, first_layer[name])
    with pytest.raises(ValueError, match="encoder_layers"):
        SpecDrafterModel.from_verifier(verifier, encoder_layers=3)


@pytest.mark.parametrize("d_model", [None, 16])
def test_from_verifier_use_verifier_encoder(d_model):
    verifier = build_verifier("bart")
    overrides = dict(use_verifier_encoder=True, prefix_attention="causal")
    if d_model is not None:
        overrides.update(d_model=d_model, decoder_attention_heads=2, decoder_ffn_dim=32)
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=NUM_DRAFT_TOKENS, **overrides)
    assert drafter.encoder is None and drafter.config.encoder_config is None
    assert (drafter.encoder_proj is None) == (d_model is None)
    if d_model is None:
        assert torch.equal(drafter.shared.weight, verifier.get_input_embeddings().weight)

    source = make_source_batch(2)
    with torch.no_grad():
        encoder_hidden_states = verifier.get_encoder()(**source).last_hidden_state
    prefix_ids = random_prefixes([3, 5])
    no_source_ids = {**source, "input_ids": None}  # a drafter without encoder reads the verifier's encoder output
    proposal = propose_fresh(drafter, no_source_ids, prefix_ids, [3, 5], NUM_DRAFT_TOKENS, encoder_hidden_states)
    assert proposal.draft_logits.shape == (2, NUM_DRAFT_TOKENS, VOCAB_SIZE)
    output = drafter(
        attention_mask=source["attention_mask"],
        encoder_hidden_states=encoder_hidden_states,
        decoder_input_ids=prefix_ids,
        decoder_attention_mask=(prefix_ids != 1).long(),
    )
    torch.testing.assert_close(output.logits, proposal.draft_logits, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        drafter(**source, decoder_input_ids=prefix_ids)


def test_from_verifier_rejects_unsupported_models():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB_SIZE, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    with pytest.raises(ValueError, match="not an encoder-decoder"):
        SpecDrafterModel.from_verifier(gpt2)
    blenderbot = BlenderbotSmallForConditionalGeneration(
        BlenderbotSmallConfig(
            vocab_size=VOCAB_SIZE,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
        )
    )
    with pytest.raises(ValueError, match="Unsupported verifier family"):
        SpecDrafterModel.from_verifier(blenderbot)
    with pytest.raises(ValueError, match="decoder_layerz"):
        SpecDrafterModel.from_verifier(build_verifier("bart"), decoder_layerz=1)


@pytest.mark.parametrize(
    ("draft_vocab_ids", "match"),
    [
        ([1, 2, 500], r"`draft_vocab_ids` must lie in \[0, 99\) \(the vocabulary\)"),
        ([-1, 2], r"`draft_vocab_ids` must lie in \[0, 99\)"),
        ([1, 1, 2], "`draft_vocab_ids` must be distinct verifier ids"),
    ],
)
def test_a_head_over_ids_outside_the_vocabulary_or_repeated_is_refused(draft_vocab_ids, match):
    with pytest.raises(ValueError, match=match):
        SpecDrafterModel.from_verifier(build_verifier("bart"), max_draft_tokens=4, draft_vocab_ids=draft_vocab_ids)
