"""scripts/export_demo_pair.py: a trained drafter exported as the repository ships it (half precision, its card
pointing at the shipped verifier and naming its recipe)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPOSITORY, build_verifier, load_repository_script
from huggingface_hub import ModelCard
from safetensors import safe_open

from specdec_hf import SpecDrafterModel
from specdec_hf.data.loading import sample_indices
from specdec_hf.training import write_model_card

TRAINED_WITH = "runs/demo_verifier_v9/best"
SHIPPED = "models/demo-en-de/verifier"


@pytest.fixture(scope="module")
def export_script():
    return load_repository_script("scripts/export_demo_pair.py", "export_demo_pair")


@pytest.fixture
def trained_drafter(tmp_path):
    """A drafter directory as `train_drafter.py` leaves it: weights, config, card and last evaluation."""
    verifier = build_verifier("marian")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1, use_verifier_encoder=True)
    drafter.config.verifier_name_or_path = TRAINED_WITH
    source = tmp_path / "run"
    drafter.save_pretrained(source, safe_serialization=True)
    metrics = {"tokens_per_iteration": 1.5, "accuracy_by_position": [0.5, 0.25, 0.1, 0.0]}
    (source / "eval_results.json").write_text(json.dumps({"step": 7, **metrics}))
    write_model_card(source, drafter, TRAINED_WITH, "tiny distilled data", 7, metrics)
    return source


def test_exported_drafter_card_names_the_shipped_verifier_and_its_recipe(tmp_path, trained_drafter, export_script):
    config = tmp_path / "continued.yaml"
    config.write_text("drafter_name_or_path: runs/drafter_v9_init\n")
    target = tmp_path / "shipped"
    export_script.export_drafter(trained_drafter, target, torch.float16, SHIPPED, 2, config)

    card = (target / "README.md").read_text(encoding="utf-8")
    assert TRAINED_WITH not in card  # a path of the training machine means nothing in the repository
    assert f"# Spec-Drafter for `{SHIPPED}`" in card and f'from_pretrained("{SHIPPED}")' in card
    assert f"- verifier: `{SHIPPED}`" in card and "(2 unless `generate()` gets another" in card
    recipe = f"- recipe: `python train_drafter.py --config {config.as_posix()}`, continuing the drafter it names "
    assert recipe + "(`drafter_name_or_path: runs/drafter_v9_init`;" in card and "- optimizer steps: 7" in card
    assert "`scripts/build_demo_pair.sh` shows how that drafter was made" in card
    # the metadata's data set is the one the card's text names (each task's drafter its own corpus)
    assert (
        ModelCard.load(target / "README.md").data.to_dict()["model-index"][0]["results"][0]["dataset"]["name"]
        == "tiny distilled data"
    )
    exported = SpecDrafterModel.from_pretrained(target)
    assert exported.config.verifier_name_or_path == SHIPPED and exported.config.num_draft_tokens == 2
    with safe_open(target / "model.safetensors", "pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.float16}


def test_a_continued_drafter_card_names_its_pairs_recipe(tmp_path, trained_drafter, export_script):
    """The summarization pair's continued drafter points at that pair's build script, not the translation pair's."""
    config = tmp_path / "continued.yaml"
    config.write_text("drafter_name_or_path: runs/drafter_debian_sum_init\n")
    target = tmp_path / "shipped"
    build_script = export_script.BUILD_SCRIPTS["summarization"]  # what main() passes for --task summarization
    assert (REPOSITORY / build_script).is_file()
    export_script.export_drafter(trained_drafter, target, torch.float16, SHIPPED, None, config, build_script)
    card = (target / "README.md").read_text(encoding="utf-8")
    assert "`scripts/build_demo_sum.sh` shows how that drafter was made" in card and "build_demo_pair" not in card


def test_exported_drafter_from_scratch_says_so_and_rejects_a_bad_k(tmp_path, trained_drafter, export_script):
    config = tmp_path / "scratch.yaml"
    config.write_text("learning_rate: 0.001\n")
    export_script.export_drafter(trained_drafter, tmp_path / "a", torch.float16, SHIPPED, None, config)
    assert ", from the verifier's weights\n" in (tmp_path / "a" / "README.md").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match=r"--num_draft_tokens must be between 1 and the drafter's max_draft_tokens"):
        export_script.export_drafter(trained_drafter, tmp_path / "b", torch.float16, SHIPPED, 5)


def test_exporting_an_exported_drafter_keeps_one_recipe_line(tmp_path, trained_drafter, export_script):
    config = tmp_path / "scratch.yaml"
    config.write_text("learning_rate: 0.001\n")
    export_script.export_drafter(trained_drafter, tmp_path / "once", torch.float16, SHIPPED, None, config)
    export_script.export_drafter(tmp_path / "once", tmp_path / "twice", torch.float16, "elsewhere", None, config)
    card = (tmp_path / "twice" / "README.md").read_text(encoding="utf-8")
    assert card.count("- recipe: ") == 1 and "- verifier: `elsewhere`" in card and SHIPPED not in card


def test_a_card_not_written_by_train_drafter_is_refused(tmp_path, trained_drafter, export_script):
    (trained_drafter / "README.md").write_text("# My drafter\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"not the card train_drafter.py writes"):
        export_script.export_drafter(trained_drafter, tmp_path / "out", torch.float16, SHIPPED)


def test_held_out_slice_is_evaluates_draw_and_refuses_an_incomplete_row(tmp_path, export_script):
    """The slice is the rows `evaluate.py --limit 3 --limit_seed 0` draws; a row it would skip is refused."""
    lines = [json.dumps({"translation": {"en": f"source {i}", "de": f"Ziel {i}"}, "source": "ding"}) for i in range(9)]
    split = tmp_path / "validation.jsonl"
    split.write_text("\n".join(lines) + "\n", encoding="utf-8")
    export_script.export_heldout(split, tmp_path / "slice.jsonl", 3, 0)
    chosen = sample_indices(9, 3, 0)
    assert (tmp_path / "slice.jsonl").read_text(encoding="utf-8").splitlines() == [lines[i] for i in chosen]
    split.write_text("\n".join([*lines, json.dumps({"translation": {"en": "x", "de": " "}})]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"validation.jsonl, line 10: an empty or missing translation.en or"):
        export_script.export_heldout(split, tmp_path / "slice.jsonl", 3, 0)


def test_held_out_summarization_slice_refuses_a_row_without_a_summary(tmp_path, export_script):
    lines = [json.dumps({"document": f"a long description {i}", "summary": f"synopsis {i}"}) for i in range(6)]
    split = tmp_path / "test.jsonl"
    split.write_text("\n".join([*lines, json.dumps({"document": "text", "summary": ""})]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"test.jsonl, line 7: an empty or missing document or summary"):
        export_script.export_heldout(split, tmp_path / "slice.jsonl", 3, 0)
    split.write_text("\n".join(lines) + "\n", encoding="utf-8")
    export_script.export_heldout(split, tmp_path / "slice.jsonl", 3, 0)
    assert len((tmp_path / "slice.jsonl").read_text(encoding="utf-8").splitlines()) == 3


@pytest.mark.parametrize(
    ("init_from", "origin"),
    [
        (None, ", from scratch"),
        (
            "runs/demo_pair_v1/verifier",
            ", starting from copies of the layers of `runs/demo_pair_v1/verifier` (the previous demo pair, git tag "
            "demo-v1)",
        ),
        ("runs/demo_verifier_v2/best", ", starting from copies of the layers of `runs/demo_verifier_v2/best`"),
    ],
)
def test_card_names_the_previous_pair_only_for_a_model_grown_from_it(tmp_path, export_script, init_from, origin):
    config = tmp_path / "config.yaml"
    config.write_text("d_model: 16\n" + (f"init_from: {init_from}\n" if init_from else ""))
    assert export_script.training_origin(config) == origin
