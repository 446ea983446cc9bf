"""Bad input to `evaluate.py` fails with a clear error before any generation starts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from eval_fixtures import FIXTURE

from specdec_hf.evaluation import parse_evaluation_arguments, run_evaluation
from specdec_hf.evaluation import runner as runner_module

pytest_plugins = ["eval_fixtures"]  # the saved tiny models (`eval_models`, `base_argv`)


@pytest.fixture(autouse=True)
def no_generation(monkeypatch):
    """Any error must come before the first strategy runs."""

    def fail(*args, **kwargs):
        raise AssertionError("generation started before the bad input was reported")

    monkeypatch.setattr(runner_module, "run_strategy", fail)


def evaluate(argv: list[str]) -> dict:
    return run_evaluation(*parse_evaluation_arguments(argv))


def replace_option(argv: list[str], name: str, value: str) -> list[str]:
    index = argv.index(name)
    return argv[: index + 1] + [value] + argv[index + 2 :]


def test_unknown_strategy_lists_valid_names(base_argv):
    with pytest.raises(ValueError, match=r"unknown strategy name\(s\) \['nucleus'\].*greedy, beam, beam<n>, spec_k"):
        evaluate(base_argv + ["--strategies", "greedy", "nucleus"])


@pytest.mark.parametrize(
    ("strategies", "extra", "message"),
    [
        (["spec_k4_b1_t0"], ["--drafters"], "need at least one drafter"),
        (["spec_k4_b1_t0_d3"], [], "names drafter 3, but only 1"),
        (["assisted"], [], "needs `assistant_model`"),
        (["greedy", "greedy"], [], "more than once"),
    ],
)
def test_strategy_configuration_errors(base_argv, strategies, extra, message):
    argv = base_argv
    if extra == ["--drafters"]:
        index = argv.index("--drafters")
        argv = argv[:index] + argv[index + 2 :]
    with pytest.raises(ValueError, match=message):
        evaluate(argv + ["--strategies", *strategies])


@pytest.mark.parametrize("name", ["num_threads", "ct2_threads", "limit"])
def test_counts_must_be_positive(base_argv, name):
    with pytest.raises(ValueError, match=f"`{name}` must be >= 1"):
        evaluate(base_argv + [f"--{name}", "0"])


def test_cuda_device_without_cuda_is_refused(base_argv, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a machine with a GPU
    with pytest.raises(ValueError, match=r"device 'cuda' requested but CUDA is not available: use `--device cpu`"):
        evaluate(base_argv + ["--device", "cuda"])


def test_prepack_linear_needs_the_cpu_device(base_argv):
    with pytest.raises(ValueError, match="set `device: cpu`"):
        evaluate(base_argv + ["--prepack_linear", "true", "--device", "auto"])


def test_batch_one_strategy_in_sweep_is_refused(base_argv, eval_models):
    argv = base_argv + ["--strategies", "greedy", "assisted", "--assistant_model", eval_models["assistant"]]
    with pytest.raises(ValueError, match="run only at batch size 1"):
        evaluate(argv + ["--sweep", "true", "--sweep_strategies", "greedy", "assisted"])


def test_drafter_with_another_vocabulary(base_argv, eval_models):
    argv = replace_option(base_argv, "--drafters", eval_models["other_drafter"])
    with pytest.raises(ValueError, match=r"other_drafter.*vocabulary size .* does not match the verifier"):
        evaluate(argv)


def test_num_draft_tokens_above_the_drafters(base_argv):
    with pytest.raises(ValueError, match="drafts k=9 tokens but drafter .* has 4 mask slots"):
        evaluate(base_argv + ["--strategies", "spec_k9_b1_t0"])


def test_assistant_with_another_vocabulary(base_argv, eval_models):
    argv = base_argv + ["--strategies", "assisted", "--assistant_model", eval_models["other_assistant"]]
    with pytest.raises(ValueError, match="assistant_model has vocabulary size"):
        evaluate(argv)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_empty_dataset(base_argv, tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"translation": {"en": "Hello .", "de": ""}}] * 3)
    with pytest.raises(ValueError, match="has no rows"):
        evaluate(replace_option(base_argv, "--data_files", f"test={empty}"))


def test_missing_reference_column(base_argv, tmp_path):
    no_reference = write_jsonl(tmp_path / "en_only.jsonl", [{"translation": {"en": "Hello ."}}] * 3)
    with pytest.raises(ValueError, match=r"target column 'translation.de' not found"):
        evaluate(replace_option(base_argv, "--data_files", f"test={no_reference}"))


def test_output_dir_is_a_file(base_argv, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="is a file"):
        evaluate(replace_option(base_argv, "--output_dir", str(blocker)))
    with pytest.raises(NotADirectoryError, match="a parent is a file"):
        evaluate(replace_option(base_argv, "--output_dir", str(blocker / "results")))


def test_unknown_yaml_key(base_argv, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("num_beam: 4\n")
    with pytest.raises(ValueError, match=r"unknown keys \['num_beam'\]"):
        evaluate(["--config", str(config)] + base_argv)


def test_limit_seed_needs_limit(base_argv):
    at = base_argv.index("--limit")
    without_limit = base_argv[:at] + base_argv[at + 2 :]  # the option and its value
    with pytest.raises(ValueError, match="limit_seed"):
        evaluate([*without_limit, "--limit_seed", "0"])


def test_limit_seed_draws_rows_at_random_in_data_order(base_argv, monkeypatch):
    drawn = {}

    def record(pairs, description):
        drawn["sources"], drawn["description"] = list(pairs["source"]), description
        raise RuntimeError("stop after loading the data")

    monkeypatch.setattr(runner_module, "check_pairs", record)
    with pytest.raises(RuntimeError, match="stop after"):
        evaluate([*base_argv, "--limit_seed", "3"])
    all_sources = [json.loads(line)["translation"]["en"] for line in FIXTURE.read_text().splitlines()]
    assert len(drawn["sources"]) == 8 and drawn["sources"] != all_sources[:8]
    positions = [all_sources.index(source) for source in drawn["sources"]]
    assert positions == sorted(positions)
    assert "8 rows drawn at random (seed 3)" in drawn["description"]


def test_missing_drafter_directory_is_not_a_hub_error(base_argv, tmp_path, monkeypatch):
    """It said "Repo id must be in the form 'repo_name' or 'namespace/repo_name'" (or, offline, that it could not
    connect to huggingface.co)."""
    missing = str(tmp_path / "runs" / "drafter")
    with pytest.raises(FileNotFoundError, match=rf"`drafters` '{missing}': no such directory, and not a Hub id"):
        evaluate(replace_option(base_argv, "--drafters", missing))


def test_truncated_drafter_weights_are_named(base_argv, eval_models, tmp_path):
    damaged = tmp_path / "drafter"
    shutil.copytree(eval_models["drafter"], damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(OSError, match=rf"{weights} cannot be read \(SafetensorError.*truncated"):
        evaluate(replace_option(base_argv, "--drafters", str(damaged)))


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--verifier_name_or_path", "runs/demo/no_verifier"),
        ("--tokenizer_name_or_path", "tok/en/de"),
        ("--assistant_model", "no/such/assistant"),
    ],
)
def test_a_missing_model_directory_is_named_by_its_argument(base_argv, tmp_path, monkeypatch, option, value):
    """Paths of three parts: no Hub id either, so the error comes at once, online or not."""
    monkeypatch.chdir(tmp_path)
    argv = replace_option(base_argv, option, value) if option in base_argv else [*base_argv, option, value]
    if option == "--assistant_model":
        argv += ["--strategies", "greedy", "assisted"]
    with pytest.raises(FileNotFoundError, match=rf"`{option[2:]}` '{value}': no such directory \(relative to"):
        evaluate(argv)


def test_an_ngram_store_preferring_the_source_of_a_verifier_with_two_vocabularies(base_argv, eval_models, tmp_path):
    """Source ids mean other tokens than target ids there: the store's source bias would be wrong, and says so."""
    verifier = tmp_path / "two_vocabularies"
    shutil.copytree(eval_models["verifier"], verifier)
    config = json.loads((verifier / "config.json").read_text())
    (verifier / "config.json").write_text(json.dumps({**config, "share_encoder_decoder_embeddings": False}))
    argv = replace_option(base_argv, "--verifier_name_or_path", str(verifier))
    argv = replace_option(argv, "--drafters", eval_models["ngram_store"])
    with pytest.raises(ValueError, match="source and target vocabularies differ: save the store with `source_bias=0`"):
        evaluate(argv + ["--strategies", "greedy", "spec_k3_b1_t0"])
