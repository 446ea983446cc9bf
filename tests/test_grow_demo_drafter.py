"""scripts/grow_demo_drafter.py: a trained drafter re-laid and deepened for a grown verifier, its function kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import build_verifier, build_word_tokenizer, load_repository_script
from tiny_drafters import tiny_drafter

from specdec_hf import SpecDrafterModel
from specdec_hf.data.vocabulary_layout import pad_last_permutation, relayout_tokenizer

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mt_fixture.jsonl"


def load_script():
    return load_repository_script("scripts/grow_demo_drafter.py", "grow_demo_drafter")


def _state_drafter(vocab_size: int = 99, **overrides):
    return tiny_drafter(
        vocab_size=vocab_size,
        decoder_layers=1,
        verifier_state_layers=[1, 2],
        prefix_attention="causal",
        use_verifier_encoder=True,
        **overrides,
    )


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "encoder_hidden_states": torch.randn(2, 5, 32, generator=generator),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        "decoder_input_ids": torch.tensor([[2, 7, 9, 11], [2, 12, 1, 1]]),
        "decoder_attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
        "verifier_states": torch.randn(2, 4, 64, generator=generator),
    }


def test_a_deepened_drafter_drafts_exactly_as_before_and_its_new_layers_learn():
    script = load_script()
    drafter = _state_drafter()
    deeper = script.deepen_decoder(drafter, 3)
    assert deeper.config.decoder_layers == 3 and len(deeper.decoder.layers) == 3
    with torch.no_grad():
        torch.testing.assert_close(deeper(**_inputs()).logits, drafter(**_inputs()).logits)
    deeper.train()
    labels = torch.tensor([[5, 6, 7, 8], [9, 10, -100, -100]])
    deeper(**_inputs(), labels=labels).loss.backward()
    new_layer = deeper.decoder.layers[2]
    assert new_layer.mlp.fc2.weight.grad.abs().sum() > 0
    assert new_layer.self_attn.out_proj.weight.grad.abs().sum() > 0


def test_deepening_to_fewer_layers_is_refused():
    script = load_script()
    with pytest.raises(ValueError, match="--decoder_layers must be at least"):
        script.deepen_decoder(tiny_drafter(decoder_layers=2), 1)


def _verifier_dir(path: Path, tokenizer, decoder_layers: int) -> Path:
    verifier = build_verifier(
        "marian",
        vocab_size=len(tokenizer),
        decoder_layers=decoder_layers,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    verifier.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_script_relays_deepens_and_points_the_drafter_at_the_new_layers(tmp_path):
    texts = [text for line in FIXTURE.read_text().splitlines() for text in json.loads(line)["translation"].values()]
    tokenizer = build_word_tokenizer(texts[:200])
    old_verifier = _verifier_dir(tmp_path / "old", tokenizer, decoder_layers=2)
    relaid = relayout_tokenizer(tokenizer, pad_last_permutation(len(tokenizer), tokenizer.pad_token_id))
    new_verifier = _verifier_dir(tmp_path / "new", relaid, decoder_layers=4)
    _state_drafter(vocab_size=len(tokenizer)).save_pretrained(tmp_path / "drafter")
    args = ["--drafter", str(tmp_path / "drafter"), "--old_verifier", str(old_verifier)]
    args += ["--verifier", str(new_verifier), "--output_dir", str(tmp_path / "grown")]
    load_script().main([*args, "--verifier_state_layers", "2,4", "--decoder_layers", "2"])
    grown = SpecDrafterModel.from_pretrained(tmp_path / "grown")
    assert grown.config.verifier_state_layers == [2, 4] and grown.config.decoder_layers == 2
    assert grown.config.pad_token_id == relaid.pad_token_id == len(relaid) - 1
    assert grown.config.verifier_name_or_path == str(new_verifier)
    with pytest.raises(ValueError, match="must name 2 layers"):
        load_script().main([*args, "--verifier_state_layers", "4"])
    with pytest.raises(ValueError, match=r"must be in 1\.\.4"):
        load_script().main([*args, "--verifier_state_layers", "2,5"])
