"""Batching, output trimming, strategy names, the sweep's bookkeeping and the report table."""

from __future__ import annotations

import pytest

from specdec_hf.evaluation import parse_strategy, resolve_strategies
from specdec_hf.evaluation.batching import make_batches, restore_order, single_row_groups
from specdec_hf.evaluation.report import markdown_tables
from specdec_hf.evaluation.strategies import Strategy, generation_kwargs
from specdec_hf.evaluation.sweep import plot_latency_throughput, run_sweep


def test_make_batches_sorts_pads_and_restores_order():
    encoded = [[5, 1], [5, 6, 7, 1], [5, 6, 1], [9, 1], [8, 8, 8, 8, 1]]
    batches = make_batches(encoded, batch_size=2, pad_token_id=0)
    assert [batch.rows for batch in batches] == [[4, 1], [2, 0], [3]]
    assert batches[0].input_ids.tolist() == [[8, 8, 8, 8, 1], [5, 6, 7, 1, 0]]
    assert batches[0].attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    per_batch = [[f"row{row}" for row in batch.rows] for batch in batches]
    assert restore_order(batches, per_batch) == [f"row{i}" for i in range(5)]
    unsorted = make_batches(encoded, batch_size=2, pad_token_id=0, sort_by_length=False)
    assert [batch.rows for batch in unsorted] == [[0, 1], [2, 3], [4]]


def test_single_row_groups_follow_the_rows_of_each_batch():
    encoded = [[5, 1], [5, 6, 7, 1], [5, 6, 1], [9, 1], [8, 8, 8, 8, 1]]
    groups = make_batches(encoded, batch_size=2, pad_token_id=0)  # rows [4, 1], [2, 0], [3]
    single = make_batches(encoded, batch_size=1, pad_token_id=0)
    by_group = single_row_groups(groups, single)
    assert [[batch.rows for batch in group] for group in by_group] == [[[4], [1]], [[2], [0]], [[3]]]
    assert by_group[0][1].input_ids.tolist() == [[5, 6, 7, 1]]  # unpadded: alone in its batch


def test_parse_strategy_names():
    assert parse_strategy("spec_k8_b1_t0") == Strategy("spec_k8_b1_t0", "speculative", 8, 1, 0.0, None)
    assert parse_strategy("spec_kauto_b1_t0").num_draft_tokens == "auto"
    assert generation_kwargs(parse_strategy("spec_kauto_b3_t1"), 10, drafter=object())["num_draft_tokens"] == "auto"
    assert parse_strategy("spec_k10_b5_t3.5_d1") == Strategy("spec_k10_b5_t3.5_d1", "speculative", 10, 5, 3.5, 1)
    truncated = parse_strategy("spec_k8_b1_t0_c0.25_d1")
    assert (truncated.num_draft_tokens, truncated.confidence_threshold, truncated.drafter_index) == (8, 0.25, 1)
    assert generation_kwargs(truncated, 10, drafter=object())["draft_confidence_threshold"] == 0.25
    assert "draft_confidence_threshold" not in generation_kwargs(parse_strategy("spec_k8_b1_t0"), 10, drafter=object())
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        parse_strategy("spec_k8_b1_t0_c1.5")
    assert parse_strategy("prompt_lookup").batch_one_only
    for bad in ("spec_k8", "spec_k8_b1_t0_x", "Greedy", "beam_5", "beams"):
        with pytest.raises(ValueError, match="valid names: greedy, beam, beam<n>, spec_k"):
            parse_strategy(bad)


def test_beam_widths_by_name():
    assert parse_strategy("beam3") == Strategy("beam3", "beam", num_beams=3)
    assert generation_kwargs(parse_strategy("beam3"), 7, num_beams=5)["num_beams"] == 3
    assert generation_kwargs(parse_strategy("beam"), 7, num_beams=5)["num_beams"] == 5
    with pytest.raises(ValueError, match="at least 2 beams"):
        parse_strategy("beam1")


def test_resolve_strategies_expands_per_drafter_and_puts_greedy_first():
    names = [s.name for s in resolve_strategies(["beam", "spec_k4_b1_t0"], num_drafters=2)]
    assert names == ["greedy", "beam", "spec_k4_b1_t0_d0", "spec_k4_b1_t0_d1"]
    one = resolve_strategies(["spec_k4_b1_t0", "greedy"], num_drafters=1)
    assert [(s.name, s.drafter_index) for s in one] == [("greedy", None), ("spec_k4_b1_t0", 0)]


def test_generation_kwargs_are_deterministic():
    kwargs = generation_kwargs(Strategy("beam", "beam"), max_new_tokens=7, num_beams=3)
    assert kwargs == {"max_new_tokens": 7, "do_sample": False, "num_beams": 3}
    spec = generation_kwargs(parse_strategy("spec_k4_b3_t1"), max_new_tokens=7, drafter=object())
    assert (spec["num_draft_tokens"], spec["beta"], spec["tau"], spec["num_beams"]) == (4, 3, 1.0, 1)
    assert spec["return_dict_in_generate"] is True
    lookup = generation_kwargs(Strategy("prompt_lookup", "prompt_lookup"), 7, prompt_lookup_num_tokens=4)
    assert lookup["prompt_lookup_num_tokens"] == 4


def test_run_sweep_bookkeeping_and_plot(tmp_path):
    strategies = resolve_strategies(["spec_k4_b1_t0"], num_drafters=1)

    def make(size):
        return make_batches([[5, 1]] * 6, size, pad_token_id=0)

    def measure(batches):  # a fake clock, drifting between repeats: speculative is 1, 3 and 2 times as fast
        return {"greedy": ([1.0, 3.0, 2.0], 60), "spec_k4_b1_t0": ([1.0, 1.0, 1.0], 60)}

    points = run_sweep(strategies, [1, 4, 8], 6, make, measure)
    assert [(p["strategy"], p["batch_size"]) for p in points] == [
        ("greedy", 1),
        ("spec_k4_b1_t0", 1),
        ("greedy", 4),
        ("spec_k4_b1_t0", 4),
    ]
    greedy_4 = points[2]
    assert greedy_4["time_s"] == 2.0 and greedy_4["num_batches"] == 2 and greedy_4["latency_s"] == 1.0
    assert (greedy_4["time_s_min"], greedy_4["time_s_max"]) == (1.0, 3.0)
    assert greedy_4["tokens_per_s"] == 30.0 and greedy_4["sentences_per_s"] == 3.0
    assert greedy_4["speedups"] == [1.0, 1.0, 1.0]
    spec_4 = points[3]
    assert spec_4["speedups"] == [1.0, 3.0, 2.0]  # paired per repeat
    assert (spec_4["speedup"], spec_4["speedup_min"], spec_4["speedup_max"]) == (2.0, 1.0, 3.0)
    path = plot_latency_throughput(points, tmp_path / "curve.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_markdown_table_shows_requested_metrics():
    result = {
        "batch_size": 4,
        "quality": {"bleu": 12.345, "chrf": 40.0, "rouge1": 0.5, "rouge2": 0.25, "rougeL": 0.4},
        "identical_to_greedy": 1.0,
        "tokens_per_iteration": 2.5,
        "speed": {
            "time_s": 1.0,
            "time_s_min": 0.9,
            "time_s_max": 1.25,
            "tokens_per_s": 100.0,
            "sentences_per_s": 8.0,
            "speedup": 1.5,
            "speedup_min": 1.234,
            "speedup_max": 1.6,
        },
        "time_share": {"verifier": 0.6, "drafter": 0.3},
        "speculative": {"acceptance_by_position": [0.9, 0.5, None]},
        "memory": {"peak_activation_bytes": 2 * 1024 * 1024, "extra_total_bytes": 1024 * 1024},
    }
    table = markdown_tables({"spec_k3_b1_t0": result}, ["bleu"])
    assert "| strategy | batch | BLEU | = greedy | Tok. |" in table
    assert (
        "| spec_k3_b1_t0 | 4 | 12.35 | 1.000 | 2.50 | 1.000 (0.900–1.250) | 100.0 | 8.00 | 1.50× (1.23–1.60) |"
        in table
    )
    assert "| spec_k3_b1_t0 | 0.60 | 0.30 | 0.90 0.50 – | 2.0 | 1.0 |" in table
    assert "R-1" not in table
    assert "| 50.00 | 25.00 | 40.00 |" in markdown_tables({"x": result}, ["rouge"])
