"""CTranslate2 as a peer: conversion of a Marian verifier in Marian's layout, equal greedy output, clear refusals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import build_word_tokenizer
from transformers import MarianConfig, MarianMTModel

from specdec_hf.data.vocabulary_layout import pad_last_permutation, relayout_tokenizer
from specdec_hf.evaluation import ctranslate2_peer, parse_evaluation_arguments, run_evaluation, runner
from specdec_hf.evaluation.ctranslate2_peer import (
    CTranslate2Worker,
    check_marian_layout,
    convert_verifier,
    decoding_options,
    force_eos_at_limit,
    forced_eos_token,
)

STRATEGIES = ["ct2", "ct2_int8", "ct2_int8_float32"]
SENTENCES = [
    "Select the cells that you want to copy.",
    "The package contains the documentation.",
    "Click the button to open the dialog.",
    "This program shows the time of day.",
    "Choose a file and press OK.",
    "Insert a new sheet before the current one.",
]


def marian_pair(pad_last: bool = True):
    """A tiny random Marian model and its word tokenizer, in Marian's layout (pad last, zero pad row) or not."""
    tokenizer = build_word_tokenizer([word for sentence in SENTENCES for word in sentence.split()] * 2)
    if pad_last:
        tokenizer = relayout_tokenizer(tokenizer, pad_last_permutation(len(tokenizer), tokenizer.pad_token_id))
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=len(tokenizer),
        decoder_vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        init_std=0.6,  # varied outputs (a small init repeats one token) and no near-ties
        activation_function="gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=None,
    )
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[tokenizer.pad_token_id].zero_()
    model.generation_config.bad_words_ids = [[tokenizer.pad_token_id]]
    return model, tokenizer


def test_marian_layout_check_names_the_fix():
    model, _ = marian_pair(pad_last=False)
    with pytest.raises(ValueError, match=r"<pad> is id 1.*expects it last.*vocabulary_layout"):
        check_marian_layout(model)
    model, _ = marian_pair()
    check_marian_layout(model)
    with torch.no_grad():
        model.get_input_embeddings().weight[model.config.pad_token_id] += 1.0
    with torch.no_grad(), pytest.raises(ValueError, match="embedding row is not zero"):
        check_marian_layout(model)


def test_missing_ctranslate2_is_refused_with_the_install_command(monkeypatch, tmp_path):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install 'specdec_hf\[peers\]'"):
        convert_verifier(tmp_path, tmp_path / "ct2")
    with pytest.raises(ImportError, match="not installed"):
        ctranslate2_peer.check_ctranslate2_available()


def test_converted_verifier_decodes_like_hf_greedy(tmp_path):
    pytest.importorskip("ctranslate2")
    model, tokenizer = marian_pair()
    model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    converted = convert_verifier(tmp_path / "verifier", tmp_path / "ct2")
    assert convert_verifier(tmp_path / "verifier", tmp_path / "ct2") == converted  # converted once, then reused
    inputs = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    greedy = model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=12)
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(SENTENCES)["input_ids"]]
    with CTranslate2Worker(converted, "float32", threads=1) as worker:
        hypotheses, seconds = worker.translate(sources, max_decoding_length=12)
    assert seconds > 0
    expected = [
        [token for token in row[1:] if token not in (tokenizer.pad_token_id, tokenizer.eos_token_id)]
        for row in greedy.tolist()
    ]
    assert [tokenizer.convert_tokens_to_ids(tokens) for tokens in hypotheses] == expected
    assert len({tuple(row) for row in expected}) > 2  # the outputs differ: the comparison means something


def test_forced_eos_replaces_the_last_token_of_hypotheses_at_the_limit():
    hypotheses = [["a", "b", "c"], ["a", "</s>"], ["a", "b", "</s>"], ["a", "b", "c", "d"]]
    assert force_eos_at_limit(hypotheses, 3, "</s>") == [
        ["a", "b", "</s>"],
        ["a", "</s>"],
        ["a", "b", "</s>"],
        ["a", "b", "</s>"],
    ]
    assert force_eos_at_limit(hypotheses, 3, None) is hypotheses


def test_forced_eos_token_reads_the_generation_config():
    model, tokenizer = marian_pair()
    assert forced_eos_token(model, tokenizer) is None
    model.generation_config.forced_eos_token_id = tokenizer.eos_token_id
    assert forced_eos_token(model, tokenizer) == tokenizer.eos_token
    model.generation_config.forced_eos_token_id = [7, tokenizer.eos_token_id]  # tied forced scores: the lowest id
    assert forced_eos_token(model, tokenizer) == tokenizer.convert_ids_to_tokens(min(7, tokenizer.eos_token_id))


def test_rows_at_the_length_limit_end_like_generate_with_forced_eos(tmp_path):
    """Marian checkpoints set `forced_eos_token_id`: `generate()` then ends a row that reaches `max_new_tokens` with
    EOS, which CTranslate2 cannot do by itself; the worker applies it, so such rows stay equal."""
    pytest.importorskip("ctranslate2")
    model, tokenizer = marian_pair()
    model.config.forced_eos_token_id = model.generation_config.forced_eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    converted = convert_verifier(tmp_path / "verifier", tmp_path / "ct2")
    inputs = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    greedy = model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=4)
    expected = [[token for token in row[1:] if token != tokenizer.pad_token_id] for row in greedy.tolist()]
    assert sum(row[-1] == tokenizer.eos_token_id and len(row) == 4 for row in expected) >= 2  # rows at the limit
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(SENTENCES)["input_ids"]]
    with CTranslate2Worker(converted, "float32", threads=1, forced_eos=forced_eos_token(model, tokenizer)) as worker:
        hypotheses, _ = worker.translate(sources, max_decoding_length=4)
    assert [tokenizer.convert_tokens_to_ids(tokens) for tokens in hypotheses] == expected
    with CTranslate2Worker(converted, "float32", threads=1) as worker:
        unforced, _ = worker.translate(sources, max_decoding_length=4)
    assert [tokenizer.convert_tokens_to_ids(tokens) for tokens in unforced] != expected  # the case is exercised


def test_unsupported_compute_type_is_refused(tmp_path):
    pytest.importorskip("ctranslate2")
    with pytest.raises(ValueError, match="compute type 'float64' is not supported"):
        CTranslate2Worker(tmp_path, "float64", threads=1)


def _evaluate_argv(tmp_path, model_dir: Path, strategies: list[str]) -> list[str]:
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"translation": {"en": s, "de": s}}) + "\n" for s in SENTENCES))
    return [
        "--verifier_name_or_path", str(model_dir), "--data_files", f"test={data}", "--source_lang", "en",
        "--target_lang", "de", "--output_dir", str(tmp_path / "out"), "--batch_size", "2", "--max_new_tokens", "12",
        "--repeats", "1", "--sweep", "false", "--measure_memory", "false", "--device", "cpu", "--num_threads", "1",
        "--disable_tqdm", "true", "--strategies", *strategies,
    ]  # fmt: skip


@pytest.fixture
def checked_threads(monkeypatch) -> list[int]:
    """The thread counts the evaluation's machine-load check is called with, in order."""
    counts = []
    check = runner.check_machine_load
    monkeypatch.setattr(runner, "check_machine_load", lambda threads: counts.append(threads) or check(threads))
    return counts


def test_evaluate_runs_ct2_strategies_next_to_greedy(tmp_path, checked_threads):
    pytest.importorskip("ctranslate2")
    model, tokenizer = marian_pair()
    model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    argv = _evaluate_argv(tmp_path, tmp_path / "verifier", STRATEGIES) + ["--ct2_threads", "2"]
    data = run_evaluation(*parse_evaluation_arguments(argv))
    assert checked_threads == [2]  # the idle cores the timings need: CTranslate2's 2 threads, not torch's 1
    strategies = data["strategies"]
    assert set(strategies) == {"greedy", *STRATEGIES}
    assert strategies["ct2"]["identical_to_greedy"] == 1.0  # float32: the same greedy outputs
    for name in STRATEGIES:
        assert strategies[name]["kind"] == "ctranslate2" and strategies[name]["speed"]["speedup"] > 0
        assert strategies[name]["tokens_per_iteration"] is None
        assert strategies[name]["generation_kwargs"]["intra_threads"] == 2  # its own threads, not torch's one
    assert (tmp_path / "out" / "ctranslate2" / "model.bin").is_file()  # converted into the run's directory
    assert "| ct2 |" in (tmp_path / "out" / "results.md").read_text()


def test_evaluate_without_ct2_rows_checks_the_load_for_torch_threads_alone(tmp_path, checked_threads):
    model, tokenizer = marian_pair()
    model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    argv = _evaluate_argv(tmp_path, tmp_path / "verifier", ["greedy"]) + ["--ct2_threads", "2"]
    run_evaluation(*parse_evaluation_arguments(argv))
    assert checked_threads == [1]  # no CTranslate2 row: its threads never run


def test_evaluate_refuses_ct2_for_a_pad_first_verifier_before_decoding(tmp_path):
    pytest.importorskip("ctranslate2")
    model, tokenizer = marian_pair(pad_last=False)
    model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    with pytest.raises(ValueError, match="<pad> is id 1.*expects it last"):
        run_evaluation(*parse_evaluation_arguments(_evaluate_argv(tmp_path, tmp_path / "verifier", ["ct2"])))
    # nothing was decoded
    assert not list((tmp_path / "out").rglob("*.jsonl")) and not (tmp_path / "out" / "results.json").exists()


def test_evaluate_refuses_ct2_without_the_package_or_off_the_cpu(tmp_path, monkeypatch):
    argv = _evaluate_argv(tmp_path, tmp_path, ["ct2"])
    with pytest.raises(ValueError, match="run on the CPU"):
        parse_evaluation_arguments([*argv, "--device", "cuda"])
    with pytest.raises(ValueError, match="sweep times transformers"):
        parse_evaluation_arguments([*argv, "--sweep", "true", "--sweep_strategies", "ct2"])
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else find_spec(name, *a)
    )
    with pytest.raises(ValueError, match=r"strategies \['ct2'\].*pip install 'specdec_hf\[peers\]'"):
        parse_evaluation_arguments(argv)


def test_a_worker_that_cannot_start_fails_at_once(tmp_path):
    pytest.importorskip("ctranslate2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="did not start"), CTranslate2Worker(tmp_path / "empty", "float32", 1):
        pass


def test_a_conversion_of_other_weights_is_not_reused(tmp_path):
    pytest.importorskip("ctranslate2")
    model, tokenizer = marian_pair()
    model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    converted = convert_verifier(tmp_path / "verifier", tmp_path / "ct2")
    first = (converted / "model.bin").stat().st_mtime_ns
    assert (convert_verifier(tmp_path / "verifier", tmp_path / "ct2") / "model.bin").stat().st_mtime_ns == first
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    model.save_pretrained(tmp_path / "verifier")  # new weights in the same directory: converted again
    assert (convert_verifier(tmp_path / "verifier", tmp_path / "ct2") / "model.bin").stat().st_mtime_ns != first


def test_decoding_options_ban_like_the_verifier_and_refuse_what_ct2_would_not_apply():
    model, tokenizer = marian_pair()
    # <pad> is not in CTranslate2's Marian vocabulary (it cannot be emitted); other single-token bans carry over
    model.generation_config.bad_words_ids = [[model.config.pad_token_id], [5]]
    options = decoding_options(model, tokenizer)
    assert options["suppress_sequences"] == [tokenizer.convert_ids_to_tokens([5])] and options["beam_size"] == 1
    model.generation_config.repetition_penalty = 1.3
    with pytest.raises(ValueError, match="repetition_penalty"):
        decoding_options(model, tokenizer)
