"""A Spec-Drafter config field of the wrong type or an unknown value is refused on construction and on loading,
naming the field (a hand-edited config.json, a training YAML's `drafter_config`, `from_verifier` arguments)."""

from __future__ import annotations

import json

import pytest
from conftest import build_verifier

from specdec_hf import SpecDrafterConfig, SpecDrafterModel


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("max_draft_tokens", "4", r"`max_draft_tokens` must be of type int, got '4' \(str\)"),
        ("max_draft_tokens", 2.5, r"`max_draft_tokens` must be of type int, got 2.5 \(float\)"),
        ("decoder_layers", "x", r"`decoder_layers` must be of type int"),
        ("dropout", True, r"`dropout` must be of type float \| int, got True \(bool\)"),
        ("verifier_state_layers", ["top"], r"`verifier_state_layers` must be of type list\[int\] \| None"),
        ("use_verifier_encoder", "yes", r"`use_verifier_encoder` must be of type bool"),
        ("activation_function", "swishy", r"`activation_function` must be one of transformers' activations"),
        ("prefix_attention", "sideways", r"`prefix_attention` must be one of \('bidirectional', 'causal'\)"),
    ],
)
def test_a_field_of_the_wrong_type_or_value_is_named(field, value, match):
    with pytest.raises(ValueError, match=match):
        SpecDrafterConfig(vocab_size=99, d_model=16, **{field: value})


def test_sound_values_of_every_accepted_type_pass():
    config = SpecDrafterConfig(
        vocab_size=99, d_model=16, dropout=0, eos_token_id=[2, 3], verifier_state_layers=(-1,),
        prefix_attention="causal", num_draft_tokens=None, activation_function="relu",
    )  # fmt: skip
    assert config.dropout == 0 and config.verifier_state_layers == [-1]


def test_a_hand_edited_config_json_is_refused_naming_the_field(tmp_path):
    drafter = SpecDrafterModel.from_verifier(build_verifier("bart"), max_draft_tokens=4, decoder_layers=1)
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_draft_tokens"] = "4"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"`max_draft_tokens` must be of type int.*config.json"):
        SpecDrafterModel.from_pretrained(tmp_path)


def test_from_verifier_arguments_of_the_wrong_type_are_named():
    with pytest.raises(ValueError, match=r"`max_draft_tokens` must be of type int, got 2.5"):
        SpecDrafterModel.from_verifier(build_verifier("bart"), max_draft_tokens=2.5)


@pytest.mark.parametrize("field, value, match", [
    ("decoder_layers", 2, r"`decoder_layers` is 2 in config.json but the weights hold 1"),
    ("decoder_ffn_dim", 40, r"config.json disagrees with its weights, whose shapes differ"),
])  # fmt: skip
def test_config_fields_that_disagree_with_the_weights_are_named(tmp_path, field, value, match):
    """transformers initialised a second decoder layer at random with only a logged report, and named no field for a
    width that changed."""
    drafter = SpecDrafterModel.from_verifier(build_verifier("bart"), max_draft_tokens=4, decoder_layers=1)
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        SpecDrafterModel.from_pretrained(tmp_path)
