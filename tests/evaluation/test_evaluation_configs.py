"""The shipped evaluation configs parse, and nothing in the project imports the `evaluate` library."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from specdec_hf.evaluation import parse_evaluation_arguments

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "eval").glob("*.yaml"))


def test_every_task_has_a_config():
    assert {path.stem for path in CONFIGS} >= {"debian_en_de", "wmt14_en_de", "wmt16_en_ro", "cnn_dailymail"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.stem)
def test_config_parses(path):
    evaluation_args, data_args = parse_evaluation_arguments(["--config", str(path), "--limit", "5"])
    assert evaluation_args.resolved_strategies[0].name == "greedy"
    assert evaluation_args.limit == 5
    # the first 5 rows are loaded, unless `limit_seed` draws 5 from the whole split
    assert data_args.max_samples == (5 if evaluation_args.limit_seed is None else None)
    # a registered dataset or languages name the task; local files of plain columns (the summarization demo's
    # document/summary rows) cannot, so their config names the metrics
    assert data_args.task in ("translation", "summarization") or "metrics" in yaml.safe_load(path.read_text())


def test_no_import_of_the_evaluate_library():
    # `evaluate.py` at the repository root shadows the Hugging Face `evaluate` library when run from there
    pattern = re.compile(r"^\s*(import evaluate\b|from evaluate\b)", re.MULTILINE)
    sources = [REPO / "evaluate.py", *(REPO / "specdec_hf").rglob("*.py")]
    offenders = [str(path.relative_to(REPO)) for path in sources if pattern.search(path.read_text())]
    assert offenders == []
