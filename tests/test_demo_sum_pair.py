"""The shipped summarization pair (models/demo-sum) loads like Hub checkpoints, and its drafter, alone and after the
source copy, and its n-gram store keep greedy output at β=1 under the checkpoint's own processors (trigram blocking,
minimum length)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

from specdec_hf import NgramStoreDrafter, SourceCopyDrafter, enable_speculative_decoding

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo-sum"
GREEDY = dict(num_beams=1, do_sample=False, max_new_tokens=40)


@pytest.fixture(scope="module")
def pair():
    verifier = AutoModelForSeq2SeqLM.from_pretrained(DEMO / "verifier", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "verifier")
    drafter = AutoModel.from_pretrained(DEMO / "drafter", dtype=torch.float32).eval()
    return enable_speculative_decoding(verifier), tokenizer, drafter


def test_shipped_files_and_the_drafters_default_k():
    for name in ("verifier", "drafter"):
        assert (DEMO / name / "model.safetensors").is_file() and (DEMO / name / "README.md").is_file()
    config = json.loads((DEMO / "drafter" / "config.json").read_text())
    assert (config["num_draft_tokens"], config["max_draft_tokens"]) == ("auto", 8)
    assert config["verifier_name_or_path"] == "models/demo-sum/verifier"


@pytest.mark.parametrize("drafting", ["drafter", "source_copy_then_drafter", "ngram_store"])
def test_beta_one_equals_greedy_on_held_out_rows(pair, drafting):
    verifier, tokenizer, drafter = pair
    assert verifier.generation_config.no_repeat_ngram_size == 3  # the processors that read the prefix are on
    if drafting == "source_copy_then_drafter":
        drafter = SourceCopyDrafter.from_verifier(verifier, fallback=drafter)
    elif drafting == "ngram_store":
        drafter = NgramStoreDrafter.from_pretrained(DEMO / "ngram_store")
    lines = (DEMO / "heldout_test.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    for line in lines:
        inputs = tokenizer(json.loads(line)["document"], return_tensors="pt", truncation=True, max_length=320)
        reference = verifier.generate(**inputs, **GREEDY)
        # a fixed k, so that every call drafts (the default, "auto", may decode a call plainly)
        output = verifier.generate(
            **inputs, **GREEDY, drafter=drafter, num_draft_tokens=2, return_dict_in_generate=True
        )
        assert torch.equal(output.sequences, reference)
        assert output.speculative_stats.drafter_calls > 0


def test_the_shipped_ngram_store_is_the_verifiers():
    drafter = NgramStoreDrafter.from_pretrained(DEMO / "ngram_store")
    verifier_config = json.loads((DEMO / "verifier" / "config.json").read_text())
    assert drafter.vocab_size == verifier_config["vocab_size"] and drafter.num_draft_tokens == "auto"
    # the tokenizer's special ids are never preferred from the source (every source ends with EOS)
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "verifier")
    assert drafter.ignored_source_ids == frozenset(tokenizer.all_special_ids) and drafter.source_bias > 0
    # a context every output starts with: the decoder start token
    assert drafter.store.lookup([verifier_config["decoder_start_token_id"]]) is not None
