"""`evaluate.py` end to end on tiny saved models and the MT fixture: files written, figures consistent.

No timed assertions: only the structure and the relations that hold whatever the machine's speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import load_repository_script
from eval_fixtures import FIXTURE

REPO = Path(__file__).resolve().parents[2]

pytest_plugins = ["eval_fixtures"]  # the saved tiny models (`eval_models`, `base_argv`)


def load_script():
    """Import the top-level `evaluate.py` under another name (`evaluate` is also the name of an HF library)."""
    return load_repository_script("evaluate.py", "evaluate_script")


@pytest.fixture(scope="module")
def run_output(eval_models, tmp_path_factory):
    """One full run through `evaluate.py main()`: YAML config plus command-line overrides, every strategy, sweep."""
    tmp = tmp_path_factory.mktemp("e2e")
    config = {
        "verifier_name_or_path": eval_models["verifier"],
        "drafters": [eval_models["drafter"]],
        "assistant_model": eval_models["assistant"],
        "strategies": ["greedy", "beam", "spec_k4_b1_t0", "spec_k3_b3_t1.5", "assisted", "prompt_lookup"],
        "num_beams": 2,
        "prompt_lookup_num_tokens": 3,
        "drafter_dtype": "bfloat16",  # a cheaper drafter must leave the beta=1 output unchanged
        "data_files": [f"test={FIXTURE}"],
        "source_lang": "en",
        "target_lang": "de",
        "cache_dir": str(tmp / "datasets_cache"),
        "output_dir": str(tmp / "unused"),
        "batch_size": 4,
        "max_new_tokens": 10,
        "repeats": 2,
        "sweep_batch_sizes": [1, 4, 16],
        "disable_tqdm": True,
    }
    path = tmp / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    output_dir = tmp / "out"
    data = load_script().main(["--config", str(path), "--output_dir", str(output_dir), "--limit", "8"])
    return data, output_dir


def test_files_written(run_output):
    data, output_dir = run_output
    assert (output_dir / "results.json").is_file()
    table = (output_dir / "results.md").read_text()
    assert table.count("| spec_k4_b1_t0 |") == 2
    assert "timing: interleaved, rotating order, median of 2 repeats, range in brackets" in table.splitlines()[0]
    png = (output_dir / "latency_throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    on_disk = json.loads((output_dir / "results.json").read_text())
    assert set(on_disk["strategies"]) == set(data["strategies"])
    for name in data["strategies"]:
        rows = [json.loads(line) for line in (output_dir / "generations" / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == 8
        assert {"id", "source", "reference", "hypothesis"} <= set(rows[0])


def test_environment_and_config_recorded(run_output):
    data, _ = run_output
    environment = data["environment"]
    for key in ("torch", "transformers", "device", "num_threads", "date"):
        assert environment[key]
    assert "load_average_1min" in environment and "shared_machine_warning" in environment
    assert data["models"]["verifier"].endswith("verifier")
    assert data["config"]["evaluation"]["limit"] == 8
    assert data["data"]["num_samples"] == 8


def test_figures_consistent(run_output):
    data, _ = run_output
    strategies = data["strategies"]
    assert list(strategies)[0] == "greedy"
    assert set(strategies) == {"greedy", "beam", "spec_k4_b1_t0", "spec_k3_b3_t1.5", "assisted", "prompt_lookup"}
    greedy = strategies["greedy"]
    assert greedy["speed"]["speedup"] == 1.0
    assert greedy["speed"]["speedups"] == [1.0, 1.0]
    assert greedy["identical_to_greedy"] == 1.0
    assert greedy["tokens_per_iteration"] == 1.0
    for name, result in strategies.items():
        assert isinstance(result["quality"]["bleu"], float), name
        assert 0.0 <= result["quality"]["rougeL"] <= 1.0
        speed = result["speed"]
        assert len(speed["times_s"]) == len(speed["speedups"]) == 2
        assert 0 < speed["time_s_min"] <= speed["time_s"] <= speed["time_s_max"]
        assert 0 < speed["speedup_min"] <= speed["speedup"] <= speed["speedup_max"]
        assert result["speed"]["generated_tokens"] > 0
        assert result["memory"]["peak_activation_bytes"] is not None
    lossless = strategies["spec_k4_b1_t0"]
    assert lossless["identical_to_greedy"] == 1.0
    assert lossless["quality"]["bleu"] == greedy["quality"]["bleu"]
    for name in ("spec_k4_b1_t0", "spec_k3_b3_t1.5"):
        result = strategies[name]
        assert result["tokens_per_iteration"] >= 1.0
        stats = result["speculative"]
        assert len(stats["acceptance_by_position"]) == result["settings"]["num_draft_tokens"]
        assert stats["verifier_calls"] >= 1 and stats["drafter_calls"] >= 1
        share = result["time_share"]
        assert 0.0 < share["drafter"] < 1.0 and 0.0 < share["verifier"] < 1.0
        assert result["memory"]["extra_parameter_bytes"] > 0
    assert strategies["assisted"]["batch_size"] == 1
    assert strategies["assisted"]["speed"]["speedup_reference"] == "greedy_batch_size_1"
    assert strategies["assisted"]["tokens_per_iteration"] >= 1.0
    reference = data["reference_timings"]["greedy_batch_size_1"]
    assert reference["batch_size"] == 1 and len(reference["times_s"]) == 2
    assistant_ratios = [
        r / t for r, t in zip(reference["times_s"], strategies["assisted"]["speed"]["times_s"], strict=True)
    ]
    assert strategies["assisted"]["speed"]["speedups"] == assistant_ratios  # paired with greedy at batch size 1
    assert data["timing"]["repeats"] == 2 and data["timing"]["groups"] == 2  # 8 rows in batches of 4


def test_sweep(run_output):
    data, _ = run_output
    sweep = data["sweep"]
    assert sweep["strategies"] == ["greedy", "spec_k4_b1_t0", "spec_k3_b3_t1.5"]
    points = sweep["points"]
    assert {(p["strategy"], p["batch_size"]) for p in points} == {
        (name, size)
        for name in sweep["strategies"]
        for size in (1, 4)  # 16 > 8 rows: skipped
    }
    for point in points:
        assert point["latency_s"] > 0 and point["tokens_per_s"] > 0
        assert len(point["times_s"]) == len(point["speedups"]) == 2
        if point["strategy"] == "greedy":
            assert point["speedup"] == 1.0


def test_log_is_readable_when_redirected(base_argv, tmp_path):
    """`evaluate.py > log.txt 2>&1` with progress bars on: no carriage-return redraws in the log, the tables intact."""
    at = base_argv.index("--disable_tqdm")
    argv = base_argv[:at] + base_argv[at + 2 :] + ["--strategies", "greedy", "spec_k4_b1_t0"]
    log = tmp_path / "log.txt"
    with log.open("w") as handle:
        command = [sys.executable, str(REPO / "evaluate.py"), *argv]
        subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO, check=True, timeout=600)
    text = log.read_bytes()  # bytes: text mode would turn the carriage returns into newlines
    assert b"\r" not in text
    assert b"| spec_k4_b1_t0 | 4 |" in text


def _with_drafters(base_argv: list[str], *entries: str) -> list[str]:
    """`base_argv` with its one `--drafters` entry replaced by `entries`."""
    at = base_argv.index("--drafters")
    return [*base_argv[:at], *base_argv[at + 2 :], "--drafters", *entries]


def test_an_ngram_store_runs_alone_and_after_the_source_copy(base_argv, eval_models):
    """An n-gram store's directory as a `drafters` entry, alone and as the source copy's fallback: β=1 equal to
    greedy, drafts accepted, no weights counted."""
    argv = _with_drafters(base_argv, eval_models["ngram_store"], f"source_copy+{eval_models['ngram_store']}")
    argv += ["--strategies", "greedy", "spec_k3_b1_t0", "spec_kauto_b1_t0"]
    data = load_script().main(argv)
    strategies = data["strategies"]
    assert {f"spec_k{k}_b1_t0_d{index}" for k in ("3", "auto") for index in range(2)} <= set(strategies)
    for name, result in strategies.items():
        if name.startswith("spec_"):
            assert result["identical_to_greedy"] == 1.0, name
    assert strategies["spec_k3_b1_t0_d0"]["tokens_per_iteration"] > 1.0  # the store holds these very outputs
    assert [drafter["parameter_bytes"] for drafter in data["models"]["drafters"]] == [0, 0]


def test_source_copy_drafters_and_a_chosen_k_run_as_strategies(base_argv, eval_models, tmp_path):
    """`source_copy` alone and before the trained drafter, and k chosen as decoding runs: β=1 equal to greedy."""
    argv = _with_drafters(base_argv, eval_models["drafter"], "source_copy", f"source_copy+{eval_models['drafter']}")
    argv += ["--strategies", "greedy", "spec_k4_b1_t0", "spec_kauto_b1_t0"]
    data = load_script().main(argv)
    strategies = data["strategies"]
    assert {f"spec_k{k}_b1_t0_d{index}" for k in ("4", "auto") for index in range(3)} <= set(strategies)
    for name, result in strategies.items():
        if name.startswith("spec_"):
            assert result["identical_to_greedy"] == 1.0, name
    drafters = data["models"]["drafters"]
    assert drafters[1]["parameter_bytes"] == 0 and drafters[2]["parameter_bytes"] == drafters[0]["parameter_bytes"]
