"""`evaluate.py` end to end on tiny saved models and the MT fixture: files written, figures consistent.

No timed assertions: only the structure and the relations that hold whatever the machine's speed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from eval_fixtures import FIXTURE

REPO = Path(__file__).resolve().parents[2]

pytest_plugins = ["eval_fixtures"]  # the saved tiny models (`eval_models`, `base_argv`)


def load_script():
    """Import the top-level `evaluate.py` under another name (`evaluate` is also the name of an HF library)."""
    spec = importlib.util.spec_from_file_location("evaluate_script", REPO / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        "repeats": 1,
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
    assert (output_dir / "results.md").read_text().count("| spec_k4_b1_t0 |") == 2
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
    assert greedy["identical_to_greedy"] == 1.0
    assert greedy["tokens_per_iteration"] == 1.0
    for name, result in strategies.items():
        assert isinstance(result["quality"]["bleu"], float), name
        assert 0.0 <= result["quality"]["rougeL"] <= 1.0
        assert result["speed"]["time_s"] > 0
        assert result["speed"]["speedup"] > 0
        assert result["speed"]["generated_tokens"] > 0
        assert result["memory"]["peak_activation_bytes"] is not None
    lossless = strategies["spec_k4_b1_t0"]
    assert lossless["identical_to_greedy"] == 1.0
    assert lossless["quality"]["bleu"] == greedy["quality"]["bleu"]
    for name in ("spec_k4_b1_t0", "spec_k3_b3_t1.5"):
        result = strategies[name]
        assert result["tokens_per_iteration"] >= 1.0
        stats = result["speculative"]
        assert len(stats["acceptance_by_position"]) == result["settings"]["block_size"]
        assert stats["verifier_calls"] >= 1 and stats["drafter_calls"] >= 1
        share = result["time_share"]
        assert 0.0 < share["drafter"] < 1.0 and 0.0 < share["verifier"] < 1.0
        assert result["memory"]["extra_parameter_bytes"] > 0
    assert strategies["assisted"]["batch_size"] == 1
    assert strategies["assisted"]["speed"]["speedup_reference"] == "greedy_batch_size_1"
    assert strategies["assisted"]["tokens_per_iteration"] >= 1.0
    assert "greedy_batch_size_1" in data["reference_timings"]


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
        if point["strategy"] == "greedy":
            assert point["speedup"] == 1.0
