"""Tests of the Spec-Drafter model: config, training forward, drafting interface, prefix cache, save/load, from_verifier.

Tiny random models only (vocab 99, width 32, 1-2 layers); verifiers come from the shared `conftest.build_verifier`.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from transformers import (
    AutoConfig,
    AutoModel,
    BlenderbotSmallConfig,
    BlenderbotSmallForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    MT5Config,
    MT5ForConditionalGeneration,
)

from specdec_hf.drafting import Drafter, validate_drafter
from specdec_hf.models import SpecDrafterConfig, SpecDrafterModel

BLOCK_SIZE = 4
ATOL = 1e-5


def tiny_config(**overrides) -> SpecDrafterConfig:
    kwargs = dict(
        vocab_size=VOCAB_SIZE,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=256,
        block_size=BLOCK_SIZE,
        init_std=0.2,
        dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    kwargs.update(overrides)
    return SpecDrafterConfig(**kwargs)


def tiny_drafter(seed: int = 0, **overrides) -> SpecDrafterModel:
    torch.manual_seed(seed)
    return SpecDrafterModel(tiny_config(**overrides)).eval()


def random_prefixes(lengths: list[int], seed: int = 0, width: int | None = None) -> torch.LongTensor:
    """Right-padded random prefixes starting with the decoder start token (2), padded with 1."""
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    prefix_ids = torch.randint(4, VOCAB_SIZE, (len(lengths), width), generator=generator)
    prefix_ids[:, 0] = 2
    for row, length in enumerate(lengths):
        prefix_ids[row, length:] = 1
    return prefix_ids


def propose_fresh(drafter, source, prefix_ids, lengths, block_size=BLOCK_SIZE, encoder_hidden_states=None):
    state = drafter.init_drafting_state(source["input_ids"], source["attention_mask"], encoder_hidden_states)
    return drafter.propose(state, prefix_ids, torch.as_tensor(lengths), block_size)


# ------------------------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------------------------


def test_config_defaults():
    config = SpecDrafterConfig()
    assert config.model_type == "spec_drafter"
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 2)
    assert config.block_size == 10
    assert config.prefix_attention == "bidirectional"
    assert config.tie_word_embeddings and not config.use_verifier_encoder and config.encoder_config is None
    assert config.hidden_size == 512


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(block_size=0), "block_size"),
        (dict(prefix_attention="left"), "prefix_attention"),
        (dict(encoder_position_embedding_type="rotary"), "encoder_position_embedding_type"),
        (dict(d_model=30, decoder_attention_heads=4), "decoder_attention_heads"),
        (dict(encoder_config={"model_type": "bart", "d_model": 64}), "d_model"),
        (dict(encoder_config={"d_model": 32}), "model_type"),
        (
            dict(encoder_config={"model_type": "bart", "d_model": 32}, use_verifier_encoder=True),
            "use_verifier_encoder",
        ),
    ],
)
def test_config_validation(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        tiny_config(**kwargs)


# ------------------------------------------------------------------------------------------------------------------
# Training forward
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix_attention", ["bidirectional", "causal"])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_forward_shapes_and_loss(prefix_attention, positions):
    drafter = tiny_drafter(prefix_attention=prefix_attention, encoder_position_embedding_type=positions)
    source = make_source_batch(3)
    prefix_ids = random_prefixes([5, 2, 3])
    decoder_attention_mask = (prefix_ids != 1).long()
    labels = torch.randint(0, VOCAB_SIZE, (3, BLOCK_SIZE))
    labels[1, 2:] = -100

    output = drafter(
        **source, decoder_input_ids=prefix_ids, decoder_attention_mask=decoder_attention_mask, labels=labels
    )
    assert output.logits.shape == (3, BLOCK_SIZE, VOCAB_SIZE)
    assert output.encoder_last_hidden_state.shape == (3, source["input_ids"].shape[1], 32)
    kept = labels != -100
    expected = F.cross_entropy(output.logits[kept], labels[kept])
    torch.testing.assert_close(output.loss, expected)

    smoothed = drafter(
        **source,
        decoder_input_ids=prefix_ids,
        decoder_attention_mask=decoder_attention_mask,
        labels=labels,
        label_smoothing=0.1,
    )
    torch.testing.assert_close(smoothed.loss, F.cross_entropy(output.logits[kept], labels[kept], label_smoothing=0.1))

    # reusing the encoder output skips the encoder and gives the same logits
    reused = drafter(
        encoder_hidden_states=output.encoder_last_hidden_state,
        attention_mask=source["attention_mask"],
        decoder_input_ids=prefix_ids,
        decoder_attention_mask=decoder_attention_mask,
    )
    torch.testing.assert_close(reused.logits, output.logits)

    assert drafter(**source, decoder_input_ids=prefix_ids, block_size=2).logits.shape == (3, 2, VOCAB_SIZE)
    with pytest.raises(ValueError, match="block_size"):
        drafter(**source, decoder_input_ids=prefix_ids, block_size=BLOCK_SIZE + 1)


def test_forward_trains():
    drafter = tiny_drafter(dropout=0.1).train()
    source = make_source_batch(2)
    output = drafter(**source, decoder_input_ids=random_prefixes([3, 3]), labels=torch.randint(0, VOCAB_SIZE, (2, 4)))
    output.loss.backward()
    assert drafter.decoder.mask_embedding.grad is not None
    assert drafter.decoder.block_query_embeddings.weight.grad.abs().sum() > 0
    assert drafter.shared.weight.grad is not None


# ------------------------------------------------------------------------------------------------------------------
# Drafting interface
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix_attention", ["bidirectional", "causal"])
def test_propose_shapes_and_argmax(prefix_attention):
    drafter = tiny_drafter(prefix_attention=prefix_attention)
    assert isinstance(drafter, Drafter)
    assert (drafter.vocab_size, drafter.block_size) == (VOCAB_SIZE, BLOCK_SIZE)
    validate_drafter(drafter, VOCAB_SIZE)

    source = make_source_batch(3)
    for block_size in (1, BLOCK_SIZE):
        proposal = propose_fresh(drafter, source, random_prefixes([4, 1, 6], width=9), [4, 1, 6], block_size)
        assert proposal.draft_ids.shape == (3, block_size)
        assert proposal.draft_logits.shape == (3, block_size, VOCAB_SIZE)
        assert torch.equal(proposal.draft_ids, proposal.draft_logits.argmax(dim=-1))


@pytest.mark.parametrize("prefix_attention", ["bidirectional", "causal"])
def test_propose_matches_forward(prefix_attention):
    drafter = tiny_drafter(prefix_attention=prefix_attention)
    source = make_source_batch(3)
    lengths = [5, 2, 3]
    prefix_ids = random_prefixes(lengths)
    proposal = propose_fresh(drafter, source, prefix_ids, lengths)
    output = drafter(**source, decoder_input_ids=prefix_ids, decoder_attention_mask=(prefix_ids != 1).long())
    torch.testing.assert_close(proposal.draft_logits, output.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("prefix_attention", ["bidirectional", "causal"])
@pytest.mark.parametrize("encoder", ["own", "bart"])
@pytest.mark.parametrize("decoder_layers", [1, 2])
def test_ragged_rows_match_single_rows(prefix_attention, encoder, decoder_layers):
    """Each row's proposal in a padded, ragged batch equals its proposal alone: padding does not leak (one layer:
    the last layer's padding-only mask; two: the causal prefix mask of the first layer too)."""
    if encoder == "own":
        drafter = tiny_drafter(prefix_attention=prefix_attention, decoder_layers=decoder_layers)
    else:
        drafter = SpecDrafterModel.from_verifier(
            build_verifier("bart"),
            block_size=BLOCK_SIZE,
            decoder_layers=decoder_layers,
            prefix_attention=prefix_attention,
        )
    source = make_source_batch(3)
    lengths = [2, 7, 4]
    prefix_ids = random_prefixes(lengths, width=10)  # wider than the longest row
    batched = propose_fresh(drafter, source, prefix_ids, lengths)
    for row, length in enumerate(lengths):
        source_length = int(source["attention_mask"][row].sum())
        single_source = {name: value[row : row + 1, :source_length] for name, value in source.items()}
        single = propose_fresh(drafter, single_source, prefix_ids[row : row + 1, :length], [length])
        torch.testing.assert_close(batched.draft_logits[row : row + 1], single.draft_logits, atol=ATOL, rtol=0)


def test_bidirectional_and_causal_prefix_attention_differ():
    bidirectional = tiny_drafter(prefix_attention="bidirectional")
    causal = tiny_drafter(prefix_attention="causal")
    causal.load_state_dict(bidirectional.state_dict())
    source = make_source_batch(1)
    prefix_ids = random_prefixes([6])
    first = propose_fresh(bidirectional, source, prefix_ids, [6])
    second = propose_fresh(causal, source, prefix_ids, [6])
    assert first.state.prefix_key_values is None and second.state.prefix_key_values is not None
    assert not torch.allclose(first.draft_logits, second.draft_logits)


@pytest.mark.parametrize("decoder_layers", [1, 2])
def test_causal_prefix_cache_matches_recompute_with_select_rows(decoder_layers):
    """Over many calls with growing ragged prefixes (past the cache's first capacity), the cached logits equal a
    fresh recomputation; dropping and reordering rows with `select_rows` keeps that true."""
    drafter = tiny_drafter(prefix_attention="causal", decoder_layers=decoder_layers)
    source = make_source_batch(4)
    generator = torch.Generator().manual_seed(1)
    full = random_prefixes([200] * 4, seed=3)
    lengths = torch.tensor([1, 3, 2, 1])
    state = drafter.init_drafting_state(source["input_ids"], source["attention_mask"], None)
    rows = torch.arange(4)
    for step in range(30):
        if step == 12:  # rows 1 and 3 finish; keep the others in a new order
            keep = torch.tensor([2, 0])
            state = drafter.select_rows(state, keep)
            rows, lengths = rows[keep], lengths[keep]
        prefix_ids = full[rows, : int(lengths.max()) + 2]
        block_size = 1 + step % BLOCK_SIZE
        proposal = drafter.propose(state, prefix_ids, lengths, block_size)
        current_source = {name: value[rows] for name, value in source.items()}
        reference = propose_fresh(drafter, current_source, prefix_ids, lengths, block_size)
        torch.testing.assert_close(proposal.draft_logits, reference.draft_logits, atol=ATOL, rtol=0)
        state = proposal.state
        assert state.cache_length == int(lengths.min())
        lengths = lengths + torch.randint(0, BLOCK_SIZE + 2, lengths.shape, generator=generator)
    assert state.cache_length > 64  # the buffers grew beyond their first capacity


def test_causal_propose_feeds_only_uncached_tokens():
    drafter = tiny_drafter(prefix_attention="causal")
    source = make_source_batch(2)
    seen = []
    hook = drafter.decoder.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["inputs_embeds"].shape[1]), with_kwargs=True
    )
    state = drafter.init_drafting_state(source["input_ids"], source["attention_mask"], None)
    full = random_prefixes([120, 120])
    for length in range(20, 120, 20):
        state = drafter.propose(state, full[:, :length], torch.tensor([length, length - 1]), BLOCK_SIZE).state
    hook.remove()
    assert seen[0] == 20 and all(count <= 21 for count in seen[1:])


def test_drafting_errors():
    drafter = tiny_drafter(max_position_embeddings=16)
    source = make_source_batch(1)
    with pytest.raises(ValueError, match="block_size"):
        propose_fresh(drafter, source, random_prefixes([3]), [3], block_size=BLOCK_SIZE + 1)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        propose_fresh(drafter, source, random_prefixes([14]), [14])
    with pytest.raises(ValueError, match="input_ids"):
        drafter.init_drafting_state(None, None, torch.zeros(1, 3, 32))


# ------------------------------------------------------------------------------------------------------------------
# Saving and loading
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides", [dict(encoder_position_embedding_type="sinusoidal", prefix_attention="causal"), {}]
)
def test_save_and_load_round_trip(tmp_path, overrides):
    drafter = tiny_drafter(**overrides)
    drafter.final_logits_bias.normal_()
    drafter.save_pretrained(tmp_path)
    assert os.path.isfile(tmp_path / "model.safetensors")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "spec_drafter"
    assert isinstance(AutoConfig.from_pretrained(tmp_path), SpecDrafterConfig)

    source = make_source_batch(2)
    prefix_ids = random_prefixes([3, 5])
    expected = propose_fresh(drafter, source, prefix_ids, [3, 5]).draft_logits
    loaded, info = SpecDrafterModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    auto_loaded = AutoModel.from_pretrained(tmp_path)
    assert type(auto_loaded) is SpecDrafterModel
    for model in (loaded, auto_loaded):
        assert model.lm_head.weight is model.shared.weight
        torch.testing.assert_close(propose_fresh(model.eval(), source, prefix_ids, [3, 5]).draft_logits, expected)


# ------------------------------------------------------------------------------------------------------------------
# from_verifier
# ------------------------------------------------------------------------------------------------------------------


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
    drafter = SpecDrafterModel.from_verifier(verifier, block_size=BLOCK_SIZE, decoder_layers=1)
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
    assert drafter.config.block_size == BLOCK_SIZE and len(drafter.decoder.layers) == 1
    source = make_source_batch(2, pad_token_id=verifier.config.pad_token_id)
    _check_drafter_matches_verifier(drafter, verifier, source)

    start = drafter.config.decoder_start_token_id
    prefix_ids = torch.tensor([[start, 5, 6], [start, 7, verifier.config.pad_token_id]])
    proposal = propose_fresh(drafter, source, prefix_ids, [3, 2])
    assert proposal.draft_ids.shape == (2, BLOCK_SIZE)

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
    drafter = SpecDrafterModel.from_verifier(verifier, block_size=BLOCK_SIZE)
    _check_drafter_matches_verifier(drafter, verifier, make_source_batch(2, pad_token_id=0))


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_from_verifier_copies_first_encoder_layers(family):
    verifier = build_verifier(family)
    drafter = SpecDrafterModel.from_verifier(verifier, block_size=BLOCK_SIZE, encoder_layers=1)
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
    drafter = SpecDrafterModel.from_verifier(verifier, block_size=BLOCK_SIZE, **overrides)
    assert drafter.encoder is None and drafter.config.encoder_config is None
    assert (drafter.encoder_proj is None) == (d_model is None)
    if d_model is None:
        assert torch.equal(drafter.shared.weight, verifier.get_input_embeddings().weight)

    source = make_source_batch(2)
    with torch.no_grad():
        encoder_hidden_states = verifier.get_encoder()(**source).last_hidden_state
    prefix_ids = random_prefixes([3, 5])
    state = drafter.init_drafting_state(None, source["attention_mask"], encoder_hidden_states)
    proposal = drafter.propose(state, prefix_ids, torch.tensor([3, 5]), BLOCK_SIZE)
    assert proposal.draft_logits.shape == (2, BLOCK_SIZE, VOCAB_SIZE)
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
