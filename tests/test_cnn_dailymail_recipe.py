"""The CNN/DailyMail recipe of the README, end to end offline: its three shipped configs (distil, train, evaluate),
run on a local file in the Hub dataset's schema (`article`, `highlights`, `id`) with a tiny random BART verifier in
place of `facebook/bart-large-cnn`, so that the path summarization users take cannot break unseen.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import build_verifier, build_word_tokenizer, load_repository_script

import train_drafter
from specdec_hf import SpecDrafterModel
from specdec_hf.distillation import load_distilled_dataset
from specdec_hf.distillation import main as distillation_main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "sum_fixture.jsonl"


@pytest.fixture(scope="module")
def cnn_dm_files(tmp_path_factory):
    """A tiny verifier with its tokenizer, and the summarization fixture's rows in CNN/DailyMail's schema."""
    root = tmp_path_factory.mktemp("cnn_dm")
    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()][:40]
    articles = root / "cnn_dailymail.jsonl"
    with articles.open("w", encoding="utf-8") as handle:
        for index, row in enumerate(rows):
            record = {"article": row["document"], "highlights": row["summary"], "id": f"cnn-{index}"}
            handle.write(json.dumps(record) + "\n")
    texts = [row["document"] for row in rows] + [row["summary"] for row in rows]
    tokenizer = build_word_tokenizer(texts, vocab_size=512)
    verifier = build_verifier(
        "bart",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        max_position_embeddings=256,
        encoder_layers=6,  # the training config's drafter copies the verifier's first 6 encoder layers
    )
    verifier.save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    return root, articles


def test_cnn_dailymail_configs_distil_train_load_and_evaluate(cnn_dm_files):
    root, articles = cnn_dm_files
    verifier_dir = str(root / "verifier")
    # 1. distil with the data config (the Hub dataset's name and columns, the rows from the local file)
    distillation_main(
        ["--config", str(ROOT / "configs/data/cnn_dailymail.yaml"), "--data_files", f"train={articles}",
         "--verifier", verifier_dir, "--split", "train", "--max_new_tokens", "12", "--batch_size", "8",
         "--max_source_length", "128", "--output_dir", str(root / "distilled")]
    )  # fmt: skip
    assert load_distilled_dataset(root / "distilled").num_rows == 40
    # 2. train with the training config, a few steps
    train_drafter.main(
        ["--config", str(ROOT / "configs/train/cnn_dailymail.yaml"), "--verifier_name_or_path", verifier_dir,
         "--train_data", str(root / "distilled"), "--output_dir", str(root / "drafter"), "--max_steps", "2",
         "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--warmup_steps", "1",
         "--checkpointing_steps", "2", "--eval_steps", "100", "--eval_samples", "4", "--eval_max_new_tokens", "12",
         "--logging_steps", "1", "--num_threads", "1"]
    )  # fmt: skip
    drafter = SpecDrafterModel.from_pretrained(root / "drafter").eval()
    assert drafter.config.max_draft_tokens == 10  # the training config's
    # 3. evaluate with the evaluation config (no AR assistant: it would come from the Hub)
    evaluate = load_repository_script("evaluate.py", "evaluate_cnn_dm").main
    data = evaluate(
        ["--config", str(ROOT / "configs/eval/cnn_dailymail.yaml"), "--verifier_name_or_path", verifier_dir,
         "--drafters", str(root / "drafter"), "--data_files", f"test={articles}", "--strategies", "greedy", "beam",
         "spec_k8_b1_t0", "spec_k8_b5_t3", "prompt_lookup", "--limit", "4", "--batch_size", "1",
         "--max_new_tokens", "12", "--max_source_length", "128", "--repeats", "1", "--sweep", "false",
         "--output_dir", str(root / "eval"), "--disable_tqdm", "true", "--num_threads", "1"]
    )  # fmt: skip
    strategies = data["strategies"]
    assert set(strategies) == {"greedy", "beam", "spec_k8_b1_t0", "spec_k8_b5_t3", "prompt_lookup"}
    assert strategies["spec_k8_b1_t0"]["identical_to_greedy"] == 1.0
    assert {"rouge1", "rouge2", "rougeL"} <= set(strategies["greedy"]["quality"])
