"""scripts/train_demo_verifier.py: Marian's layout kept through training (the <pad> row stays zero), growth by stacking."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from conftest import build_word_tokenizer, load_repository_script
from transformers import BartForConditionalGeneration, MarianMTModel, PreTrainedTokenizerFast

from specdec_hf.data.vocabulary_layout import pad_last_permutation, relayout_tokenizer

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mt_fixture.jsonl"


def load_script():
    return load_repository_script("scripts/train_demo_verifier.py", "train_demo_verifier")


def _workspace(tmp_path: Path) -> Path:
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(lines[:64]) + "\n", encoding="utf-8")
    (data / "validation.jsonl").write_text("\n".join(lines[64:72]) + "\n", encoding="utf-8")
    texts = [text for line in lines[:72] for text in json.loads(line)["translation"].values()]
    tokenizer = build_word_tokenizer(texts, vocab_size=400)
    tokenizer = relayout_tokenizer(tokenizer, pad_last_permutation(len(tokenizer), tokenizer.pad_token_id))
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    return data


TINY = ["--d_model", "32", "--attention_heads", "2", "--ffn_dim", "64", "--max_position_embeddings", "64", "--generation_max_length", "16",
        "--batch_target_tokens", "400", "--eval_samples", "4", "--eval_every_minutes", "1000",
        "--save_every_minutes", "1000", "--num_threads", "1", "--log_every_steps", "1"]  # fmt: skip


def test_pad_row_stays_zero_through_training_and_pad_is_banned(tmp_path):
    script = load_script()
    data = _workspace(tmp_path)
    argv = ["--data_dir", str(data), "--output_dir", str(tmp_path / "run"), "--tokenizer_name_or_path",
            str(tmp_path / "tokenizer"), "--encoder_layers", "1", "--decoder_layers", "2", "--max_steps", "4",
            "--learning_rate", "0.01", "--warmup_steps", "1", *TINY]  # fmt: skip
    script.training_function(script.parse_args(argv))
    model = MarianMTModel.from_pretrained(tmp_path / "run" / "checkpoint-last")
    pad = model.config.pad_token_id
    assert pad == model.config.vocab_size - 1 and model.config.decoder_start_token_id == pad
    assert model.get_input_embeddings().weight[pad].abs().max() == 0  # trained 4 steps at a high rate, still zero
    assert model.get_input_embeddings().weight.abs().sum() > 0
    assert model.generation_config.bad_words_ids == [[pad]]
    # a run ending at max_steps evaluates its last step (the periodic evaluation never came), so best/ holds a model
    assert json.loads((tmp_path / "run" / "best" / "eval_results.json").read_text())["step"] == 4


def test_evaluation_by_steps_lands_on_the_same_steps(tmp_path):
    script = load_script()
    data = _workspace(tmp_path)
    argv = ["--data_dir", str(data), "--output_dir", str(tmp_path / "run"), "--tokenizer_name_or_path",
            str(tmp_path / "tokenizer"), "--encoder_layers", "1", "--decoder_layers", "1", "--max_steps", "5",
            "--eval_every_steps", "2", *TINY]  # fmt: skip
    script.training_function(script.parse_args(argv))
    log = (tmp_path / "run" / "train.log").read_text()
    # every second step, whatever the wall clock (TINY's eval_every_minutes would never come), then the last step
    assert re.findall(r"eval step (\d+):", log) == ["2", "4", "5"]


def test_a_step_due_for_evaluation_when_stopped_is_evaluated_on_resuming(tmp_path):
    script = load_script()
    data = _workspace(tmp_path)
    argv = ["--data_dir", str(data), "--output_dir", str(tmp_path / "run"), "--tokenizer_name_or_path",
            str(tmp_path / "tokenizer"), "--encoder_layers", "1", "--decoder_layers", "1", "--eval_every_steps", "1",
            *TINY]  # fmt: skip
    # max_hours 0 stops the run after its first step, before that step's evaluation
    script.training_function(script.parse_args([*argv, "--max_steps", "5", "--max_hours", "0"]))
    log = tmp_path / "run" / "train.log"
    assert "stopped (max_hours) at step 1" in log.read_text() and "eval step" not in log.read_text()
    script.training_function(script.parse_args([*argv, "--max_steps", "2", "--resume"]))
    assert re.findall(r"eval step (\d+):", log.read_text()) == ["1", "2"]


def test_evaluation_every_zero_steps_is_refused():
    script = load_script()
    with pytest.raises(ValueError, match="eval_every_steps must be at least 1"):
        script.parse_args(["--data_dir", "d", "--output_dir", "o", "--eval_every_steps", "0"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"encoder_layer_map": 0}, r"`encoder_layer_map` must be a string, got 0 \(int\): quote it in YAML"),
        ({"dropout": "high"}, r"`dropout` must be a number, got 'high' \(str\)"),
    ],
)
def test_config_values_of_the_wrong_type_are_named(tmp_path, values, message):
    script = load_script()
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump({"data_dir": "d", "output_dir": "o", **values}))
    with pytest.raises(ValueError, match=message):
        script.parse_args(["--config", str(config)])


def test_a_malformed_data_line_is_named_with_its_file_and_line(tmp_path):
    script = load_script()
    path = tmp_path / "demo_bad.jsonl"
    path.write_text('{"translation": {"en": "a", "de": "b"}}\n{"translation"\n')
    with pytest.raises(ValueError, match=r"demo_bad\.jsonl', line 2: not valid JSON"):
        script.read_pairs(path)


def test_label_smoothing_leaves_pad_out():
    script = load_script()
    logits = torch.randn(2, 3, 6)
    labels = torch.tensor([[0, 1, -100], [2, 3, 4]])
    loss = script.label_smoothed_loss(logits, labels, epsilon=0.1, pad_id=5)
    log_probs = torch.log_softmax(logits[labels != -100], dim=-1)
    nll = -log_probs.gather(-1, labels[labels != -100].unsqueeze(-1)).squeeze(-1)
    smooth = -log_probs[:, :5].mean(-1)  # every class but pad (5)
    torch.testing.assert_close(loss, (0.9 * nll + 0.1 * smooth).sum())


def test_growing_copies_the_mapped_layers(tmp_path):
    script = load_script()
    data = _workspace(tmp_path)
    base = ["--data_dir", str(data), "--tokenizer_name_or_path", str(tmp_path / "tokenizer"), *TINY]
    script.training_function(
        script.parse_args(
            [
                *base,
                "--output_dir",
                str(tmp_path / "small"),
                "--encoder_layers",
                "1",
                "--decoder_layers",
                "2",
                "--max_steps",
                "1",
            ]
        )  # fmt: skip
    )
    args = script.parse_args(
        [
            "--data_dir",
            str(data),
            "--output_dir",
            str(tmp_path / "grown"),
            "--init_from",
            str(tmp_path / "small" / "checkpoint-last"),
            "--encoder_layers",
            "1",
            "--decoder_layers",
            "4",
            "--encoder_layer_map",
            "0",
            "--decoder_layer_map",
            "0,1,0,1",
            *TINY,
        ]  # fmt: skip
    )
    source, tokenizer = script.load_growth_source(args.init_from)
    grown = script.build_model(args, tokenizer)
    script.grow_from(grown, source, args)
    for target, index in zip(grown.model.decoder.layers, (0, 1, 0, 1), strict=True):
        for name, value in target.state_dict().items():
            torch.testing.assert_close(value, source.model.decoder.layers[index].state_dict()[name], msg=name)
    torch.testing.assert_close(grown.get_input_embeddings().weight, source.get_input_embeddings().weight)


def _summarization_workspace(tmp_path: Path) -> Path:
    """Rows in the Debian summarization layout: the English sentence as the document, its first words as summary."""
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()[:72]
    rows = []
    for line in lines:
        english = json.loads(line)["translation"]["en"]
        rows.append(json.dumps({"document": english + " " + english, "summary": " ".join(english.split()[:4])}))
    data = tmp_path / "sum"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(rows[:64]) + "\n", encoding="utf-8")
    (data / "validation.jsonl").write_text("\n".join(rows[64:]) + "\n", encoding="utf-8")
    return data


def test_bart_summarization_verifier_is_laid_out_as_bart_large_cnn_and_resumes(tmp_path):
    script = load_script()
    data = _summarization_workspace(tmp_path)
    argv = ["--task", "summarization", "--model_type", "bart", "--data_dir", str(data), "--output_dir",
            str(tmp_path / "run"), "--vocab_size", "300", "--encoder_layers", "1", "--decoder_layers", "2",
            "--max_source_tokens", "24", "--batch_source_tokens", "200", "--generation_num_beams", "4",
            "--generation_min_length", "3", "--generation_no_repeat_ngram_size", "3",
            "--generation_length_penalty", "2.0", "--learning_rate", "0.01", "--warmup_steps", "1", *TINY]  # fmt: skip
    script.training_function(script.parse_args([*argv, "--max_steps", "2"]))
    run = tmp_path / "run"
    model = BartForConditionalGeneration.from_pretrained(run / "checkpoint-last")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(run / "checkpoint-last")
    bos, pad, eos = tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id
    assert (bos, pad, eos) == (0, 1, 2)  # BART's layout
    encoded = tokenizer("a b")["input_ids"]
    assert encoded[0] == bos and encoded[-1] == eos
    assert model.config.decoder_start_token_id == eos
    assert model.get_input_embeddings().weight[pad].abs().max() == 0
    generation = model.generation_config
    assert (generation.num_beams, generation.min_length, generation.no_repeat_ngram_size) == (4, 3, 3)
    assert generation.length_penalty == 2.0 and generation.forced_eos_token_id == eos
    assert generation.forced_bos_token_id == bos and generation.decoder_start_token_id == eos
    results = json.loads((run / "best" / "eval_results.json").read_text())
    assert results["step"] == 2 and 0 <= results["rougeL"] <= 100
    script.training_function(script.parse_args([*argv, "--max_steps", "3", "--resume"]))
    assert "resumed from" in (run / "train.log").read_text()
    assert json.loads((run / "best" / "eval_results.json").read_text())["step"] in (2, 3)


def test_a_bart_continued_whole_starts_from_every_weight_of_its_source(tmp_path):
    """`init_from` with model_type 'bart': the model it starts (self-distillation's first step) is the source itself,
    positions and the embeddings' layer norm included; another shape is refused, as are layer maps."""
    script = load_script()
    data = _summarization_workspace(tmp_path)
    argv = ["--task", "summarization", "--model_type", "bart", "--data_dir", str(data), "--vocab_size", "300",
            "--encoder_layers", "1", "--decoder_layers", "2", "--max_source_tokens", "24", "--batch_source_tokens",
            "200", *TINY]  # fmt: skip
    script.training_function(script.parse_args([*argv, "--output_dir", str(tmp_path / "run"), "--max_steps", "1"]))
    source_path = str(tmp_path / "run" / "checkpoint-last")
    args = script.parse_args([*argv, "--output_dir", str(tmp_path / "continued"), "--init_from", source_path])
    source, tokenizer = script.load_growth_source(args.init_from, args.model_type)
    model = script.build_model(args, tokenizer)
    script.continue_from(model, source, args)
    for name, value in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, msg=name)
    deeper = script.parse_args([*argv, "--output_dir", str(tmp_path / "x"), "--init_from", source_path])
    deeper.decoder_layers = 3
    with pytest.raises(ValueError, match=r"its \{'decoder_layers': \(2, 3\)\} \(theirs, this config's\) differ"):
        script.continue_from(script.build_model(deeper, tokenizer), source, deeper)
    rescaled = script.build_model(args, tokenizer)
    rescaled.config.scale_embedding = not source.config.scale_embedding  # same shape, other meaning
    with pytest.raises(ValueError, match=r"its \{'scale_embedding': \((False, True|True, False)\)\}"):
        script.continue_from(rescaled, source, args)
    with pytest.raises(ValueError, match="continues that model whole: leave encoder_layer_map"):
        script.parse_args(["--model_type", "bart", "--init_from", "x", "--decoder_layer_map", "0,1,2,3,4,5"])


def test_long_sources_are_cut_keeping_their_last_token_and_batches_cap_source_tokens(tmp_path):
    script = load_script()
    texts = [f"w{i}" for i in range(40)]
    tokenizer = build_word_tokenizer(texts, vocab_size=100)
    pairs = [(" ".join(texts[:30]), "w1 w2"), (" ".join(texts[:5]), " ".join(texts[:20]))]
    cut = script.encode_pairs(tokenizer, pairs, max_tokens=8, max_source_tokens=10)
    # the first source is cut to 10 tokens ending with its own last token; the second pair's target is too long
    assert len(cut) == 1 and len(cut[0][0]) == 10
    assert cut[0][0][-1] == tokenizer(pairs[0][0])["input_ids"][-1]
    examples = [([1] * length, [1, 1]) for length in (10, 10, 30, 30, 30)]
    batches = script.make_batches(examples, max_target_tokens=1000, seed=0, max_source_tokens=60)
    for batch in batches:
        assert max(len(examples[i][0]) for i in batch) * len(batch) <= 60
    assert sorted(i for batch in batches for i in batch) == list(range(5))


def test_unknown_task_or_model_type_is_refused():
    script = load_script()
    with pytest.raises(ValueError, match="task must be one of"):
        script.parse_args(["--task", "translate"])
    with pytest.raises(ValueError, match="model_type must be one of"):
        script.parse_args(["--model_type", "t5"])
    with pytest.raises(ValueError, match="decoder_layer_map needs init_from"):
        script.parse_args(["--model_type", "bart", "--decoder_layer_map", "0,1,2,3,4,5"])
