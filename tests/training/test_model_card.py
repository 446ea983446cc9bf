"""The drafter's model card: Hub metadata that `ModelCard.load` reads back, with the verifier as `base_model` only
when it is a Hub id."""

from __future__ import annotations

import pytest
from conftest import build_verifier
from huggingface_hub import ModelCard

from specdec_hf import SpecDrafterModel
from specdec_hf.training import write_model_card

METRICS = {"tokens_per_iteration": 2.345678, "accuracy_by_position": [0.9, 0.5, 0.25, 0.125]}


@pytest.fixture(scope="module")
def drafter() -> SpecDrafterModel:
    return SpecDrafterModel.from_verifier(build_verifier("bart"), max_draft_tokens=4, decoder_layers=1)


def test_card_round_trips_with_the_evaluation_as_metadata(tmp_path, drafter):
    write_model_card(
        tmp_path, drafter, "facebook/bart-base", "wmt14 en-de, distilled", 100, METRICS, model_name="me/d"
    )
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.base_model == "facebook/bart-base" and card.data.library_name == "specdec_hf"
    assert {"speculative-decoding", "spec-drafter"} <= set(card.data.tags)
    assert card.data.model_name == "me/d"
    results = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert results == {
        "tokens_per_iteration": 2.3457,
        **{f"draft_accuracy_position_{i}": value for i, value in enumerate(METRICS["accuracy_by_position"], 1)},
    }
    assert {result.dataset_name for result in card.data.eval_results} == {"wmt14 en-de, distilled"}
    assert "Spec-Drafter for `facebook/bart-base`" in card.text and "Tok.): 2.35" in card.text


@pytest.mark.parametrize("kind", ["existing directory", "path of three parts"])
def test_a_local_verifier_path_is_named_in_the_text_not_as_base_model(tmp_path, drafter, kind):
    """The Hub expects a repository id in `base_model`; the card used to carry `models/demo-en-de/verifier`."""
    verifier = tmp_path / "verifier" if kind == "existing directory" else "models/demo-en-de/verifier"
    if kind == "existing directory":
        verifier.mkdir()
    output_dir = tmp_path / "drafter"
    output_dir.mkdir()
    write_model_card(output_dir, drafter, str(verifier), "", 3, {})
    card = ModelCard.load(output_dir / "README.md")
    assert card.data.base_model is None and f"verifier: `{verifier}`" in card.text
    assert card.data.eval_results is None and "Tok.): not measured" in card.text  # nothing measured, nothing claimed
