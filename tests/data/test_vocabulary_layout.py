"""Re-laying a Marian model's vocabulary with <pad> last: the same strings, the same logits up to the permutation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import build_verifier, build_word_tokenizer
from tiny_drafters import tiny_drafter
from transformers import AutoTokenizer, MarianMTModel

from specdec_hf import SpecDrafterModel
from specdec_hf.data.vocabulary_layout import (
    pad_last_permutation,
    relayout_marian_model,
    relayout_spec_drafter,
    relayout_tokenizer,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mt_fixture.jsonl"


def _texts() -> list[str]:
    rows = [json.loads(line)["translation"] for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    return [text for row in rows for text in (row["en"], row["de"])]


def test_relaid_tokenizer_encodes_and_decodes_every_text_alike():
    tokenizer = build_word_tokenizer(_texts()[:200])
    old_ids = pad_last_permutation(len(tokenizer), tokenizer.pad_token_id)
    relaid = relayout_tokenizer(tokenizer, old_ids)
    assert relaid.pad_token_id == len(tokenizer) - 1 and relaid.eos_token_id == tokenizer.eos_token_id - 1
    for text in _texts():
        before, after = tokenizer(text)["input_ids"], relaid(text)["input_ids"]
        assert [old_ids[i] for i in after] == before
        assert relaid.decode(after, skip_special_tokens=True) == tokenizer.decode(before, skip_special_tokens=True)


@pytest.mark.parametrize("tied", [True, False])
def test_relaid_model_scores_every_token_as_before_up_to_the_permutation(tied):
    tokenizer = build_word_tokenizer(_texts()[:200])
    model = build_verifier("marian", vocab_size=len(tokenizer), pad_token_id=1, eos_token_id=2,
                           decoder_start_token_id=1, tie_word_embeddings=tied)  # fmt: skip
    old_ids = pad_last_permutation(len(tokenizer), tokenizer.pad_token_id)
    relaid_tokenizer = relayout_tokenizer(tokenizer, old_ids)
    decoder_input = torch.tensor([[1, 7, 9, 11]])  # starts from <pad>, whose row re-laying zeroes: compare after it
    inputs = {"input_ids": torch.tensor([[5, 8, 13, 2]]), "decoder_input_ids": decoder_input}
    with torch.no_grad():
        for embedding in (model.model.shared, model.model.encoder.embed_tokens, model.model.decoder.embed_tokens):
            embedding.weight[1].zero_()  # so that zeroing the pad row changes nothing
        before = model(**inputs).logits
        new_id = {old: new for new, old in enumerate(old_ids)}
        relayout_marian_model(model, old_ids, relaid_tokenizer)
        after = model(**{name: value.apply_(new_id.get) for name, value in inputs.items()}).logits
    torch.testing.assert_close(after, before[..., old_ids])
    assert model.model.decoder.embed_tokens.weight[relaid_tokenizer.pad_token_id].abs().max() == 0
    assert model.generation_config.bad_words_ids == [[relaid_tokenizer.pad_token_id]]


def test_the_shipped_verifier_has_marians_layout():
    """The demo verifier v2 as OPUS-MT checkpoints are laid out: <pad> last with a zero embedding row, the decoder
    starting from it, and generation banning it."""
    demo = Path(__file__).resolve().parents[2] / "models" / "demo-en-de"
    tokenizer = AutoTokenizer.from_pretrained(demo / "verifier")
    model = MarianMTModel.from_pretrained(demo / "verifier", dtype=torch.float32)
    pad = len(tokenizer) - 1
    assert tokenizer.pad_token_id == model.config.pad_token_id == model.generation_config.decoder_start_token_id == pad
    assert model.get_input_embeddings().weight[pad].abs().max() == 0
    assert model.generation_config.bad_words_ids == [[pad]]
    rows = [json.loads(line)["translation"] for line in (demo / "heldout_test.jsonl").read_text().splitlines()]
    for text in (text for row in rows for text in (row["en"], row["de"])):
        assert pad not in tokenizer(text)["input_ids"]


@pytest.mark.parametrize("draft_vocab_size", [None, 24])
def test_relaid_drafter_drafts_as_before_up_to_the_permutation(draft_vocab_size):
    """A drafter re-laid with its verifier: permuted inputs give its old scores, over the permuted vocabulary."""
    tokenizer = build_word_tokenizer(_texts()[:200])
    vocab_size = len(tokenizer)
    drafter = tiny_drafter(
        vocab_size=vocab_size,
        draft_vocab_size=draft_vocab_size,
        tie_word_embeddings=draft_vocab_size is None,
        verifier_state_layers=[-1],
        prefix_attention="causal",
    )
    if draft_vocab_size is not None:
        drafter.draft_vocab_ids.copy_(torch.randperm(vocab_size, generator=torch.Generator().manual_seed(0))[:24])
    old_ids = pad_last_permutation(vocab_size, tokenizer.pad_token_id)
    relaid_tokenizer = relayout_tokenizer(tokenizer, old_ids)
    new_id = {old: new for new, old in enumerate(old_ids)}
    inputs = {
        "input_ids": torch.tensor([[5, 8, 13, 2], [6, 9, 2, 1]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        "decoder_input_ids": torch.tensor([[2, 7, 9, 11], [2, 12, 1, 1]]),
        "decoder_attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
        "verifier_states": torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(1)),
    }
    ids_before = drafter.from_draft_vocab(torch.arange(draft_vocab_size)) if draft_vocab_size else None
    with torch.no_grad():
        before = drafter(**inputs).logits
        relayout_spec_drafter(drafter, old_ids, relaid_tokenizer)
        relaid_inputs = {name: value.clone() for name, value in inputs.items()}
        for name in ("input_ids", "decoder_input_ids"):
            relaid_inputs[name].apply_(new_id.get)
        after = drafter(**relaid_inputs).logits
    if draft_vocab_size is None:
        torch.testing.assert_close(after, before[..., old_ids])
    else:  # the head's rows stay, each now naming its token's new id
        torch.testing.assert_close(after, before)
        assert drafter.from_draft_vocab(torch.arange(draft_vocab_size)).tolist() == [
            new_id[i] for i in ids_before.tolist()
        ]
    # every special id follows the permutation (the tiny drafter: <s> 0, <pad> 1, </s> 2, starting from </s>)
    assert drafter.config.pad_token_id == relaid_tokenizer.pad_token_id
    assert drafter.config.eos_token_id == drafter.config.decoder_start_token_id == relaid_tokenizer.eos_token_id
    assert drafter.config.bos_token_id == new_id[0]


def test_relaying_a_drafter_with_another_vocabulary_or_the_old_tokenizer_is_refused():
    tokenizer = build_word_tokenizer(_texts()[:200])
    drafter = tiny_drafter(vocab_size=len(tokenizer))
    with pytest.raises(ValueError, match="permutation of range"):
        relayout_spec_drafter(drafter, list(range(len(tokenizer) + 1)), tokenizer)
    old_ids = pad_last_permutation(len(tokenizer), tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="tokenizer has pad_token_id 1, but the permutation moves"):
        relayout_spec_drafter(drafter, old_ids, tokenizer)  # the old tokenizer, not the re-laid one


def test_a_drafter_with_its_own_transformers_encoder_is_relaid_whole():
    """The nested encoder config's special ids and its embedding's `padding_idx` follow the permutation too."""
    tokenizer = build_word_tokenizer(_texts()[:200])
    verifier = build_verifier("marian", vocab_size=len(tokenizer), pad_token_id=1, eos_token_id=2,
                              decoder_start_token_id=1)  # fmt: skip
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1).eval()
    old_ids = pad_last_permutation(len(tokenizer), tokenizer.pad_token_id)
    relaid = relayout_tokenizer(tokenizer, old_ids)
    inputs = {"input_ids": torch.tensor([[5, 8, 13, 2]]), "decoder_input_ids": torch.tensor([[1, 7, 9, 11]])}
    with torch.no_grad():
        before = drafter(**inputs).logits
        relayout_spec_drafter(drafter, old_ids, relaid)
        new_id = {old: new for new, old in enumerate(old_ids)}
        after = drafter(**{name: value.clone().apply_(new_id.get) for name, value in inputs.items()}).logits
    torch.testing.assert_close(after, before[..., old_ids])
    assert drafter.config.encoder_config["pad_token_id"] == relaid.pad_token_id
    assert drafter.config.encoder_config["eos_token_id"] == relaid.eos_token_id
    assert drafter.encoder.embed_tokens.padding_idx == relaid.pad_token_id
