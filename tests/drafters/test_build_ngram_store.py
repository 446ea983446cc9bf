"""`python -m specdec_hf.drafters.build_ngram_store`: a distilled run counted into a saved drafter for its verifier."""

from __future__ import annotations

import json

import datasets
import pytest
from conftest import build_verifier, build_word_tokenizer

from specdec_hf.distillation import CONFIG_NAME
from specdec_hf.drafters import NgramStoreDrafter
from specdec_hf.drafters.build_ngram_store import main

TARGETS = [[2, 5, 6, 7, 2], [2, 5, 6, 8, 2], [2, 9, 5, 6, 7, 2]]


@pytest.fixture
def distilled(tmp_path):
    """A finished distillation run's directory, as `specdec_hf.distillation` writes it."""
    path = tmp_path / "distilled"
    datasets.Dataset.from_dict({"input_ids": [[5, 6, 2]] * 3, "target_ids": TARGETS}).save_to_disk(str(path))
    (path / CONFIG_NAME).write_text("{}")
    return path


def _saved_verifier(tmp_path, family="bart", **config_overrides):
    path = tmp_path / "verifier"
    build_verifier(family, **config_overrides).save_pretrained(path)
    build_word_tokenizer(["a b c"]).save_pretrained(path)
    return path


def test_a_distilled_run_becomes_a_saved_drafter(tmp_path, distilled):
    verifier = _saved_verifier(tmp_path)
    output_dir = tmp_path / "store"
    main(["--verifier", str(verifier), "--distilled_data", str(distilled), "--output_dir", str(output_dir)]
         + ["--min_count", "1", "--num_draft_tokens", "3"])  # fmt: skip
    drafter = NgramStoreDrafter.from_pretrained(output_dir)
    assert drafter.store.continuations[(5, 6)][0] == (7, 8) and drafter.num_draft_tokens == 3
    assert drafter.source_bias == 0.3  # BART's source and target share one vocabulary
    # the tokenizer's special ids are never preferred from the source
    assert json.loads((output_dir / "config.json").read_text())["ignored_source_ids"] == sorted(
        drafter.ignored_source_ids
    )
    assert drafter.ignored_source_ids
    store_config = json.loads((output_dir / "ngram_store.json").read_text())
    assert store_config["num_sequences"] == 3 and store_config["vocab_size"] == 99


def test_two_vocabularies_turn_the_source_preference_off_or_refuse_it(tmp_path, distilled):
    verifier = _saved_verifier(tmp_path, "marian", share_encoder_decoder_embeddings=False)
    argv = ["--verifier", str(verifier), "--distilled_data", str(distilled), "--min_count", "1"]
    main(argv + ["--output_dir", str(tmp_path / "store")])
    assert NgramStoreDrafter.from_pretrained(tmp_path / "store").source_bias == 0.0
    with pytest.raises(ValueError, match="`source_bias` 0.5: .* vocabularies differ"):
        main(argv + ["--output_dir", str(tmp_path / "other"), "--source_bias", "0.5"])


def test_a_bad_k_is_refused(tmp_path, distilled):
    verifier = _saved_verifier(tmp_path)
    argv = ["--verifier", str(verifier), "--distilled_data", str(distilled), "--output_dir", str(tmp_path / "s")]
    with pytest.raises(ValueError, match="`num_draft_tokens` must be an integer >= 1 or 'auto', got 'four'"):
        main(argv + ["--num_draft_tokens", "four"])
