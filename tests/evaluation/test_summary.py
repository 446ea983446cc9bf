"""The main job's summary table: rendered from `results.json` files, and the README shows exactly that table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_hf.drafters import NgramStore, NgramStoreDrafter
from specdec_hf.evaluation.summary import (
    README_END,
    README_START,
    main,
    render_summary,
    replace_readme_block,
    strategy_label,
)

REPO = Path(__file__).resolve().parents[2]


def _result(times, speedups, bleu=30.0, tok=None, identical=1.0):
    speedup = sorted(speedups)[len(speedups) // 2]
    return {
        "quality": {"bleu": bleu, "chrf": 55.0},
        "identical_to_greedy": identical,
        "tokens_per_iteration": tok,
        "speed": {
            "time_s": sorted(times)[len(times) // 2],
            "time_s_min": min(times),
            "time_s_max": max(times),
            "times_s": times,
            "speedup": speedup,
            "speedup_min": min(speedups),
            "speedup_max": max(speedups),
        },
    }


def _run(strategies, drafters=("models/demo-en-de/drafter",)):
    return {
        "environment": {
            "date": "2026-12-03T15:00:00+00:00",
            "device_name": "Test CPU",
            "cpu_count": 2,
            "num_threads": 2,
            "torch": "2.13.0",
            "transformers": "5.24.0",
        },
        "data": {"num_samples": 100, "description": "heldout_test.jsonl [test]"},
        "config": {"evaluation": {"batch_size": 1, "repeats": 3, "drafters": list(drafters), "num_beams": 5}},
        "strategies": strategies,
    }


def test_speed_up_against_beam_is_the_median_of_paired_ratios():
    run = _run(
        {
            "greedy": _result([6.0, 6.0, 6.0], [1.0, 1.0, 1.0]),
            "beam": _result([9.0, 12.0, 9.0], [0.67, 0.5, 0.67], bleu=31.0),
            "spec_k4_b5_t3": _result([3.0, 3.0, 4.5], [2.0, 2.0, 1.33], tok=3.6, identical=0.4),
        }
    )
    text = render_summary([("float32", run)], "make demo", started_at=0.0, finished_at=605.0)
    row = next(line for line in text.splitlines() if "k=4, β=5, τ=3" in line)
    # per repeat 9/3, 12/3, 9/4.5 → 3, 4, 2: median 3, range 2–4
    assert row.endswith("| 3.00× (2.00–4.00) |"), row
    beam_row = next(line for line in text.splitlines() if "| beam-5 |" in line)
    assert beam_row.endswith("| 1.00× (1.00–1.00) |")
    assert "10 min 05 s from the start" in text and "Test CPU" in text and "2026-12-03" in text


def test_a_pass_without_beam_shows_no_beam_figure():
    with_beam = _run({"greedy": _result([1.0], [1.0]), "beam": _result([2.0], [0.5])})
    without = _run({"greedy": _result([1.0], [1.0]), "ct2": _result([0.5], [2.0])})
    text = render_summary([("a", with_beam), ("b", without)], "make demo")
    ct2_row = next(line for line in text.splitlines() if "CTranslate2" in line)
    assert ct2_row.endswith("| – |")


def test_an_ngram_store_is_labelled_as_one(tmp_path):
    NgramStoreDrafter(NgramStore.from_sequences([[2, 5, 6, 2]] * 2, 10)).save_pretrained(
        tmp_path / "x" / "ngram_store"
    )
    store = str(tmp_path / "x" / "ngram_store")
    drafters = ["models/x/drafter", store, f"source_copy+{store}"]
    assert [strategy_label(f"spec_k3_b1_t0_d{index}", drafters) for index in range(3)] == [
        "speculative k=3, β=1 (x drafter)",
        "speculative k=3, β=1 (x n-gram store)",
        "speculative k=3, β=1 (source copy, else x n-gram store)",
    ]


def test_labels():
    assert strategy_label("spec_k2_b1_t0") == "speculative k=2, β=1"
    assert strategy_label("spec_k8_b5_t3") == "speculative k=8, β=5, τ=3"
    assert strategy_label("beam", num_beams=4) == "beam-4"
    drafters = ["models/x/drafter", "models/x/drafter_beam"]
    assert strategy_label("spec_k4_b5_t3_d1", drafters) == "speculative k=4, β=5, τ=3 (drafter_beam drafter)"
    drafters = ["models/x/drafter", "source_copy+models/x/drafter", "source_copy"]
    assert [strategy_label(f"spec_kauto_b1_t0_d{index}", drafters) for index in range(3)] == [
        "speculative k=auto, β=1 (x drafter)",
        "speculative k=auto, β=1 (source copy, else x drafter)",
        "speculative k=auto, β=1 (source copy)",
    ]


def test_readme_block_is_replaced_and_markers_are_required():
    readme = f"intro\n{README_START}\nold table\n{README_END}\noutro\n"
    assert replace_readme_block(readme, "new\n") == f"intro\n{README_START}\nnew\n{README_END}\noutro\n"
    with pytest.raises(ValueError, match="main-job:start"):
        replace_readme_block("no markers", "x")


def test_command_line_writes_both_files(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps(_run({"greedy": _result([1.0], [1.0])})))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{README_START}\n{README_END}\n")
    text = main(["--run", f"float32={run_dir}", "--output", str(tmp_path / "main_job.md"), "--readme", str(readme)])
    assert (tmp_path / "main_job.md").read_text() == text
    assert text in readme.read_text()
    with pytest.raises(FileNotFoundError, match="run `evaluate.py`"):
        main(["--run", f"x={tmp_path / 'missing'}", "--output", str(tmp_path / "y.md")])


def test_the_readme_shows_the_main_job_file_unchanged():
    # the README's table is docs/main_job.md as `make demo` wrote it, not a copy typed by hand
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index(README_START) + len(README_START) + 1 : readme.index(README_END)]
    assert block == (REPO / "docs" / "main_job.md").read_text()


def test_passes_on_other_rows_get_their_own_table_with_their_metrics():
    """A summarization pass after the translation passes: its own table, with ROUGE (scaled to 0-100) and no BLEU."""
    translation = _run({"greedy": _result([1.0], [1.0])})
    summary_result = _result([2.0], [1.0])
    summary_result["quality"] = {"rouge1": 0.3512, "rouge2": 0.1504, "rougeL": 0.3301}
    summarization = _run({"greedy": summary_result})
    summarization["data"] = {"num_samples": 50, "description": "heldout_sum.jsonl [test]"}
    text = render_summary([("float32", translation), ("summarization", summarization)], "make demo")
    tables = [line for line in text.splitlines() if line.startswith("| pass |")]
    assert tables == [
        "| pass | strategy | BLEU | chrF | = greedy | Tok. | time (s) | × greedy |",
        "| pass | strategy | R-1 | R-2 | R-L | = greedy | Tok. | time (s) | × greedy |",
    ]
    assert "| summarization | greedy | 35.12 | 15.04 | 33.01 |" in text
    assert "50 rows of heldout_sum.jsonl [test]" in text and "100 rows of heldout_test.jsonl [test]" in text
