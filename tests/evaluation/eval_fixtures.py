"""Tiny saved models for `evaluate.py` tests: a word-level tokenizer over the MT fixture, a random Marian verifier,
its Spec-Drafter, an AR assistant with the same vocabulary, and models of another vocabulary. Nothing downloads.

Test modules load these fixtures with `pytest_plugins = ["eval_fixtures"]`: a `conftest.py` here would
shadow `tests/conftest.py`, which other tests import as `conftest`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import build_verifier
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import MarianMTModel, PreTrainedTokenizerFast

from specdec_hf import SpecDrafterModel
from specdec_hf.drafters import NgramStore, NgramStoreDrafter

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mt_fixture.jsonl"
FIXTURE_ROWS = 40  # the tokenizer covers the words of these rows


def build_tokenizer(rows: int = FIXTURE_ROWS) -> PreTrainedTokenizerFast:
    """Word-level tokenizer (`<pad>` 0, `</s>` 1, `<unk>` 2) over the words of the fixture's first `rows` rows."""
    splitter = pre_tokenizers.Whitespace()
    words: set[str] = set()
    with FIXTURE.open() as handle:
        for _, line in zip(range(rows), handle, strict=False):
            pair = json.loads(line)["translation"]
            for text in pair.values():
                words.update(word for word, _ in splitter.pre_tokenize_str(text))
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for word in sorted(words):
        vocab[word] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = splitter
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build_marian(vocab_size: int, seed: int) -> MarianMTModel:
    """The shared tiny Marian verifier (tests/conftest.py) at this tokenizer's vocabulary and special ids."""
    return build_verifier(
        "marian", seed, vocab_size=vocab_size, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0
    )


@pytest.fixture(scope="session")
def eval_models(tmp_path_factory) -> dict[str, str]:
    """Paths of the saved verifier (with its tokenizer), its drafter, assistant and n-gram store, and models of
    another vocabulary."""
    root = tmp_path_factory.mktemp("eval_models")
    tokenizer = build_tokenizer()
    verifier = build_marian(len(tokenizer), seed=0)
    verifier.save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1).save_pretrained(root / "drafter")
    build_marian(len(tokenizer), seed=1).save_pretrained(root / "assistant")
    other = build_marian(len(tokenizer) + 7, seed=2)
    other.save_pretrained(root / "other_assistant")
    SpecDrafterModel.from_verifier(other, max_draft_tokens=4, decoder_layers=1).save_pretrained(root / "other_drafter")
    # an n-gram store of the verifier's own greedy outputs for the fixture's sources
    sources = tokenizer(
        [json.loads(line)["translation"]["en"] for line in FIXTURE.open()][:FIXTURE_ROWS], padding=True
    )
    outputs = verifier.generate(**sources.convert_to_tensors("pt"), do_sample=False, num_beams=1, max_new_tokens=10)
    sequences = [[token for token in row if token != tokenizer.pad_token_id] for row in outputs.tolist()]
    store = NgramStore.from_sequences(sequences, len(tokenizer), min_count=1)
    NgramStoreDrafter(store).save_pretrained(root / "ngram_store")
    names = ("verifier", "drafter", "assistant", "other_drafter", "other_assistant", "ngram_store")
    return {name: str(root / name) for name in names}


@pytest.fixture
def base_argv(eval_models, tmp_path) -> list[str]:
    """Command-line arguments of a quick run on the MT fixture (no sweep; tests add what they check)."""
    return [
        "--verifier_name_or_path", eval_models["verifier"],
        "--drafters", eval_models["drafter"],
        "--data_files", f"test={FIXTURE}",
        "--source_lang", "en",
        "--target_lang", "de",
        "--cache_dir", str(tmp_path / "datasets_cache"),
        "--output_dir", str(tmp_path / "out"),
        "--limit", "8",
        "--batch_size", "4",
        "--max_new_tokens", "10",
        "--repeats", "1",
        "--sweep", "false",
        "--disable_tqdm", "true",
    ]  # fmt: skip
