"""The shipped offline demo pair (models/demo-en-de) loads like Hub checkpoints and keeps greedy output at β=1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

from specdec_hf import SpecDrafterModel, enable_speculative_decoding
from specdec_hf.data.loading import DataArguments, load_text_pairs, sample_indices
from specdec_hf.evaluation import parse_evaluation_arguments, run_evaluation

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "models" / "demo-en-de"
CORPUS = REPO / "data" / "debian_en_de"  # python -m specdec_hf.data.debian_corpus --task translation (not in CI)


@pytest.fixture(scope="module")
def pair():
    verifier = AutoModelForSeq2SeqLM.from_pretrained(DEMO / "verifier", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "verifier")
    drafter = AutoModel.from_pretrained(DEMO / "drafter", dtype=torch.float32).eval()
    return verifier, tokenizer, drafter


def test_shipped_files_are_safetensors_with_model_cards():
    for name in ("verifier", "drafter"):
        assert (DEMO / name / "model.safetensors").is_file()
        assert (DEMO / name / "README.md").is_file()
        assert not list((DEMO / name).glob("*.bin"))
    assert (DEMO / "NOTICE.md").is_file()


def test_held_out_slices_are_distinct_translation_rows():
    """The main job's test slice and the validation rows `make demo` also scores share no source sentence."""
    sources = {}
    for split, size in (("test", 200), ("validation", 100)):
        lines = (DEMO / f"heldout_{split}.jsonl").read_text(encoding="utf-8").splitlines()
        pairs = [json.loads(line)["translation"] for line in lines]
        assert len(pairs) == size and all(pair["en"].strip() and pair["de"].strip() for pair in pairs)
        sources[split] = {pair["en"] for pair in pairs}
    assert not sources["test"] & sources["validation"]


@pytest.mark.skipif(not (CORPUS / "validation.jsonl").is_file(), reason="the Debian corpus is not built here")
def test_validation_slice_is_the_rows_the_tuning_config_draws():
    """configs/eval/demo_en_de_tuning.yaml evaluates `limit: 100`, `limit_seed: 0` of the corpus's validation split:
    the shipped slice must be those rows, so that `make demo`'s validation columns are the tuning's rows."""
    data_args = DataArguments(dataset_name="debian_en_de", data_dir=str(CORPUS), source_lang="en", target_lang="de")
    rows = load_text_pairs(data_args, "validation")
    drawn = rows.select(sample_indices(rows.num_rows, 100, 0))["source"]
    lines = (DEMO / "heldout_validation.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["translation"]["en"] for line in lines] == drawn


def test_beta_one_is_identical_to_greedy_on_held_out_sentences(pair):
    verifier, tokenizer, drafter = pair
    assert isinstance(drafter, SpecDrafterModel) and drafter.config.vocab_size == verifier.config.vocab_size
    # generate()'s default k is chosen as decoding runs (the main job's spec_kauto_b1_t0), up to the 8 slots trained
    assert (drafter.config.num_draft_tokens, drafter.config.max_draft_tokens) == ("auto", 8)
    lines = (DEMO / "heldout_test.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    sources = [json.loads(line)["translation"]["en"] for line in lines]
    inputs = tokenizer(sources, return_tensors="pt", padding=True)
    greedy = verifier.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=64)
    enable_speculative_decoding(verifier)
    output = verifier.generate(**inputs, drafter=drafter, max_new_tokens=64, return_dict_in_generate=True)
    assert torch.equal(output.sequences, greedy)  # the default, k chosen as decoding runs (it may draft little)
    fixed = verifier.generate(
        **inputs, drafter=drafter, num_draft_tokens=2, max_new_tokens=64, return_dict_in_generate=True
    )
    assert torch.equal(fixed.sequences, greedy) and fixed.speculative_stats.accepted_tokens[0] > 0
    assert all(text.strip() for text in tokenizer.batch_decode(greedy, skip_special_tokens=True))


def _run_shortened(config: str, output_dir: Path) -> dict:
    """A `make demo` config on 4 rows, without timing repeats, sweep or memory measurement."""
    argv = ["--config", config, "--output_dir", str(output_dir), "--limit", "4"]
    argv += ["--repeats", "1", "--sweep", "false", "--measure_memory", "false", "--disable_tqdm", "true"]
    return run_evaluation(*parse_evaluation_arguments(argv))


def test_main_job_peers_config_runs_every_peer_on_a_few_held_out_rows(tmp_path, monkeypatch):
    """`make demo`'s second config, shortened: beam search, HF assisted generation and CTranslate2 beside greedy."""
    monkeypatch.chdir(REPO)  # the config's paths are relative to the repository root
    strategies = _run_shortened("configs/eval/demo_en_de_peers.yaml", tmp_path)["strategies"]
    assert set(strategies) == {"greedy", "assisted", "ct2", "ct2_int8"}
    # CTranslate2's conversion of the shipped verifier decodes as HF greedy does (float32: up to rounding)
    assert strategies["ct2"]["identical_to_greedy"] >= 0.75
    # HF's assisted verification and greedy's steps may take different kernels (prepacked where faster): ties aside
    assert strategies["assisted"]["identical_to_greedy"] >= 0.75


def test_main_job_config_runs_every_strategy_on_a_few_held_out_rows(tmp_path, monkeypatch):
    """`make demo`'s first config, shortened: greedy and speculative decoding, β=1 equal to greedy."""
    monkeypatch.chdir(REPO)
    strategies = _run_shortened("configs/eval/demo_en_de.yaml", tmp_path)["strategies"]
    assert set(strategies) == {"greedy", "beam", "spec_k2_b1_t0", "spec_k3_b1_t0", "spec_k3_b3_t1", "spec_kauto_b1_t0"}
    speculative = [name for name in strategies if name.startswith("spec_")]
    assert any("_b1_" in name for name in speculative) and any("_b1_" not in name for name in speculative)
    for name in speculative:
        if "kauto" not in name:  # a chosen k may be 0 where drafting does not pay on the machine running the test
            assert strategies[name]["tokens_per_iteration"] > 1.0  # the trained drafter gets drafts accepted
        if "_b1_" in name:
            assert strategies[name]["identical_to_greedy"] == 1.0
    assert (tmp_path / "results.md").is_file()


def test_main_job_bfloat16_pass_runs_on_a_few_held_out_rows(tmp_path, monkeypatch):
    """`make demo`'s third config, shortened: the verifier in bfloat16, greedy and speculative on that model."""
    monkeypatch.chdir(REPO)
    argv = ["--config", "configs/eval/demo_en_de_bf16.yaml", "--output_dir", str(tmp_path), "--limit", "4"]
    argv += ["--repeats", "1", "--disable_tqdm", "true"]
    data = run_evaluation(*parse_evaluation_arguments(argv))
    assert data["config"]["evaluation"]["dtype"] == "bfloat16" and data["config"]["evaluation"]["prepack_linear"]
    assert "on the packed kernels measured faster" in (tmp_path / "results.md").read_text()
    kernels = data["models"]["linear_kernels"]  # the kernel chosen per layer signature, for every model of the run
    assert set(kernels) == {"verifier", "drafter 0"}
    for choice in kernels["verifier"]:
        assert choice["dtype"] == "bfloat16" and choice["num_layers"] >= 1
        assert choice["min_rows"] is None or choice["min_rows"] in choice["rows"]
    # every linear layer of the verifier is counted under exactly one signature
    verifier = AutoModelForSeq2SeqLM.from_pretrained(DEMO / "verifier")
    linears = sum(isinstance(module, torch.nn.Linear) for module in verifier.modules())
    assert sum(choice["num_layers"] for choice in kernels["verifier"]) == linears
    strategies = data["strategies"]
    assert "greedy" in strategies and any(name.startswith("spec_k2_b1") for name in strategies)
    for name in strategies:
        if name.startswith("spec_"):
            # bfloat16 may round a tie differently in a k-token verification than in a 1-token step: no equality here
            assert strategies[name]["tokens_per_iteration"] > 1.0
    assert (tmp_path / "results.md").is_file()
