"""Tests of the Spec-Drafter model: config, training forward, save/load.

Tiny random models only (vocab 99, width 32, 1-2 layers; `tiny_drafters`); drafting with the model is tested in
`tests/generation/test_spec_drafter_adapter.py`, building it from a verifier in `test_verifier_conversion.py`.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import VOCAB_SIZE, make_source_batch
from tiny_drafters import NUM_DRAFT_TOKENS, propose_fresh, random_prefixes, tiny_config, tiny_drafter
from transformers import AutoConfig, AutoModel

from specdec_hf.models import SpecDrafterConfig, SpecDrafterModel

# ------------------------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------------------------


def test_config_defaults():
    config = SpecDrafterConfig()
    assert config.model_type == "spec_drafter"
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 2)
    assert config.max_draft_tokens == 10
    assert config.prefix_attention == "bidirectional"
    assert config.tie_word_embeddings and not config.use_verifier_encoder and config.encoder_config is None
    assert config.hidden_size == 512


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(max_draft_tokens=0), "max_draft_tokens"),
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
    labels = torch.randint(0, VOCAB_SIZE, (3, NUM_DRAFT_TOKENS))
    labels[1, 2:] = -100

    output = drafter(
        **source, decoder_input_ids=prefix_ids, decoder_attention_mask=decoder_attention_mask, labels=labels
    )
    assert output.logits.shape == (3, NUM_DRAFT_TOKENS, VOCAB_SIZE)
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

    assert drafter(**source, decoder_input_ids=prefix_ids, num_draft_tokens=2).logits.shape == (3, 2, VOCAB_SIZE)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        drafter(**source, decoder_input_ids=prefix_ids, num_draft_tokens=NUM_DRAFT_TOKENS + 1)


def test_forward_trains():
    drafter = tiny_drafter(dropout=0.1).train()
    source = make_source_batch(2)
    output = drafter(**source, decoder_input_ids=random_prefixes([3, 3]), labels=torch.randint(0, VOCAB_SIZE, (2, 4)))
    output.loss.backward()
    assert drafter.decoder.mask_embedding.grad is not None
    assert drafter.decoder.block_query_embeddings.weight.grad.abs().sum() > 0
    assert drafter.shared.weight.grad is not None


def test_dropout_runs_in_training_only():
    """The drafter's dropout changes its outputs in training and is not applied in eval mode (where it is skipped:
    the outputs equal those of the same weights with dropout set to 0)."""
    drafter = tiny_drafter(dropout=0.5)
    source = make_source_batch(2)
    inputs = dict(**source, decoder_input_ids=random_prefixes([3, 3]))
    without = tiny_drafter(dropout=0.0)
    without.load_state_dict(drafter.state_dict())
    torch.testing.assert_close(drafter(**inputs).logits, without(**inputs).logits, atol=0, rtol=0)
    drafter.train()
    torch.manual_seed(0)
    first = drafter(**inputs).logits
    assert not torch.allclose(first, drafter(**inputs).logits)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_positions_given_as_a_range_are_those_of_the_tensor(batch_size):
    """The decoder reads a `range` of positions (a drafting call's, shared by every row) as the tensor of them."""
    drafter = tiny_drafter(prefix_attention="causal")
    decoder = drafter.decoder
    source = make_source_batch(batch_size)
    memory = drafter.encoder_memory(drafter.encode(source["input_ids"], source["attention_mask"]))
    common = dict(
        inputs_embeds=drafter.embed_prefix(random_prefixes([5] * batch_size), None),
        prefix_mask=None,
        cross_key_values=decoder.project_encoder_states(memory),
        encoder_attention_mask=source["attention_mask"].bool()[:, None, None, :],
    )
    with torch.no_grad():
        by_tensors = decoder(
            **common,
            prefix_positions=torch.arange(5),
            mask_positions=torch.arange(5, 5 + NUM_DRAFT_TOKENS).expand(batch_size, -1),
        )
        by_ranges = decoder(**common, prefix_positions=range(5), mask_positions=range(5, 5 + NUM_DRAFT_TOKENS))
    assert by_ranges.shape == (batch_size, NUM_DRAFT_TOKENS, 32)
    torch.testing.assert_close(by_ranges, by_tensors, atol=0, rtol=0)


def test_positions_given_as_a_range_go_through_the_module_where_it_is_not_run_as_it_is():
    """A range past the position table fails as the tensor of its positions does (no silently shorter slice), and
    a hooked position embedding sees the positions of a range."""
    decoder = tiny_drafter(prefix_attention="causal").decoder
    table_size = decoder.embed_positions.num_embeddings
    with pytest.raises(IndexError):
        decoder._position_embeddings(range(table_size - 2, table_size + 2))
    seen = []
    decoder.embed_positions.register_forward_hook(lambda module, args, output: seen.append(args[0].tolist()))
    embeddings = decoder._position_embeddings(range(3, 6))
    assert seen == [[3, 4, 5]]
    torch.testing.assert_close(embeddings, decoder.embed_positions.weight[3:6], atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["subclass", "max_norm"])
def test_positions_given_as_a_range_go_through_an_embedding_not_run_as_a_plain_one(kind):
    """A subclass's forward, or `max_norm` (which renormalises the rows it looks up), is the module's to run."""
    decoder = tiny_drafter(prefix_attention="causal").decoder
    table = decoder.embed_positions
    if kind == "subclass":

        class Doubled(torch.nn.Embedding):
            def forward(self, input):
                return 2 * super().forward(input)

        table.__class__ = Doubled
        expected = 2 * table.weight[3:6]
    else:
        table.max_norm = 1e-3
        expected = None
    with torch.no_grad():
        embeddings = decoder._position_embeddings(range(3, 6))
    if expected is None:  # renormalised rows, not the table's
        assert embeddings.norm(dim=-1).max() <= 1e-3 + 1e-6
    else:
        torch.testing.assert_close(embeddings, expected, atol=0, rtol=0)


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


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("prefix_feature_layers", [-1], "`prefix_feature_layers` \\(now `verifier_state_layers`\\)"),
        ("block_size", 4, "`block_size` \\(now `max_draft_tokens`\\)"),
        ("default_block_size", 2, "`default_block_size` \\(now `num_draft_tokens`\\)"),
        ("draft_chain_dim", 16, "draft chain"),
    ],
)
def test_a_drafter_saved_with_removed_fields_is_refused_on_loading(tmp_path, field, value, message):
    # loading it quietly would drop the weights those fields describe (the feature projection, the chain)
    tiny_drafter().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError, match=message):
        SpecDrafterModel.from_pretrained(tmp_path)


def test_a_config_saved_without_a_chain_loads_and_forgets_the_field():
    config = SpecDrafterConfig(vocab_size=VOCAB_SIZE, draft_chain_dim=None)
    assert "draft_chain_dim" not in config.to_dict()
