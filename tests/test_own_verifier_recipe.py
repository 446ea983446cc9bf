"""The own-verifier recipe end to end on a verifier laid out like opus-mt-en-de: distil, train, save, load, generate.

Helsinki-NLP/opus-mt-en-de has 58,101 ids with `</s>` 0, `<unk>` 1 and `<pad>` last (58,100, a zero embedding row,
the decoder start token) and bans `<pad>` in its generation config (`bad_words_ids=[[58100]]`). A random verifier with
that vocabulary layout and generation config, its widths shrunk, goes through the README's recipe in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

import train_drafter
from specdec_hf import SpecDrafterModel, enable_speculative_decoding
from specdec_hf.distillation import load_distilled_dataset
from specdec_hf.distillation import main as distillation_main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mt_fixture.jsonl"
OPUS_VOCAB, OPUS_PAD, OPUS_EOS = 58101, 58100, 0


def opus_layout_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with OPUS-MT's layout: `</s>` 0, `<unk>` 1, words, fillers, `<pad>` 58,100."""
    vocab = {"</s>": 0, "<unk>": 1}
    for word in words:
        vocab.setdefault(word, len(vocab))
    for index in range(len(vocab), OPUS_PAD):
        vocab[f"<extra_{index}>"] = index
    vocab["<pad>"] = OPUS_PAD
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", OPUS_EOS)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def opus_layout_verifier() -> MarianMTModel:
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=OPUS_VOCAB,
        decoder_vocab_size=OPUS_VOCAB,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        init_std=0.3,  # no near-ties: β=1 must equal greedy token for token
        pad_token_id=OPUS_PAD,
        eos_token_id=OPUS_EOS,
        decoder_start_token_id=OPUS_PAD,
        forced_eos_token_id=None,
    )
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[OPUS_PAD].zero_()
    model.generation_config.bad_words_ids = [[OPUS_PAD]]
    model.generation_config.max_length = None
    return model


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_verifier")
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    words = " ".join(lines).replace('"', " ").split()
    tokenizer = opus_layout_tokenizer(words)
    verifier = opus_layout_verifier()
    verifier.save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    return root, verifier, tokenizer


def test_recipe_distil_train_save_load_generate(recipe):
    root, verifier, tokenizer = recipe
    # 1. the verifier's own outputs on the training sources
    distillation_main(
        ["--verifier", str(root / "verifier"), "--data_files", f"train={FIXTURE}", "--source_lang", "en",
         "--target_lang", "de", "--split", "train", "--max_samples", "48", "--max_new_tokens", "12",
         "--batch_size", "16", "--output_dir", str(root / "distilled")]
    )  # fmt: skip
    distilled = load_distilled_dataset(root / "distilled")
    assert distilled.num_rows == 48
    # every target starts from the decoder start token (<pad>, last id) and never generates <pad> again
    assert all(ids[0] == OPUS_PAD and OPUS_PAD not in ids[1:] for ids in distilled["target_ids"])
    # 2. train a drafter a few steps (the shipped design's options, a reduced head)
    config = {
        "verifier_name_or_path": str(root / "verifier"),
        "train_data": str(root / "distilled"),
        "output_dir": str(root / "drafter"),
        "max_draft_tokens": 4,
        "drafter_config": {"decoder_layers": 1, "prefix_attention": "causal", "use_verifier_encoder": True,
                           "verifier_state_layers": [1, 2]},
        "draft_vocab_size": 64,
        "per_device_train_batch_size": 16,
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "max_steps": 4,
        "checkpointing_steps": 4,
        "eval_steps": 100,
        "eval_samples": 8,
        "eval_max_new_tokens": 12,
        "num_threads": 1,
    }  # fmt: skip
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    train_drafter.main(["--config", str(root / "train.yaml")])
    # 3. load it as a user would, and 4. generate: β=1 equals greedy, <pad> is never generated
    drafter = SpecDrafterModel.from_pretrained(root / "drafter").eval()
    assert drafter.config.vocab_size == OPUS_VOCAB and drafter.config.pad_token_id == OPUS_PAD
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()[100:106]
    sources = [json.loads(line)["translation"]["en"] for line in lines]
    inputs = tokenizer(sources, return_tensors="pt", padding=True)
    greedy = verifier.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=16)
    enable_speculative_decoding(verifier)
    output = verifier.generate(**inputs, drafter=drafter, max_new_tokens=16, return_dict_in_generate=True)
    assert torch.equal(output.sequences, greedy)
    for row in output.sequences.tolist():  # <pad> only as the start token and as padding after EOS
        generated = row[1 : row.index(OPUS_EOS) if OPUS_EOS in row else len(row)]
        assert OPUS_PAD not in generated
    assert len({tuple(row) for row in greedy.tolist()}) > 1  # the outputs differ: the comparison means something
