"""Every path a shipped config reads is one the project ships or one another shipped config writes.

A recipe is a chain of configs (train a drafter → evaluate it): when the evaluation reads a directory no training
config writes, the recipe breaks only at its last step, after hours. This reads every chain.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specdec_hf.evaluation.loading import SOURCE_COPY

REPO = Path(__file__).resolve().parents[1]


def _load(folder: str) -> dict[Path, dict]:
    return {path: yaml.safe_load(path.read_text()) for path in sorted((REPO / "configs" / folder).glob("*.yaml"))}


TRAIN = _load("train")
EVAL = _load("eval")
DEMO = _load("demo")
# directories a shipped config writes (a trained verifier also writes `best/` and `checkpoint-last/`)
WRITTEN = {config["output_dir"] for config in TRAIN.values()} | {
    f"{config['output_dir']}/{sub}" for config in DEMO.values() for sub in ("best", "checkpoint-last")
}


# paths a config reads before anything ships them (none today)
NOT_YET_BUILT: set[str] = set()


def _is_local(path: str) -> bool:
    return path.startswith(("runs/", "models/", "data/", "outputs/"))


def _produced(path: str) -> bool:
    """Shipped in the tree (models/), or written by a shipped config."""
    return (REPO / path).exists() if path.startswith("models/") else path in WRITTEN


@pytest.mark.parametrize("path", list(EVAL), ids=lambda path: path.stem)
def test_evaluation_reads_what_training_writes(path):
    config = EVAL[path]
    for entry in config.get("drafters") or []:
        # `source_copy` has no weights; `source_copy+<drafter>` reads that drafter
        drafter = entry.removeprefix(SOURCE_COPY).removeprefix("+")
        if not drafter:
            continue
        assert _produced(drafter), (
            f"{path.name}: drafter {drafter!r} is neither shipped nor any train config's output_dir"
        )
        trained_by = [c for c in TRAIN.values() if c["output_dir"] == drafter]
        for train_config in trained_by:  # the drafter was trained for the verifier it is evaluated with
            assert train_config["verifier_name_or_path"] == config["verifier_name_or_path"], (path.name, drafter)
    if _is_local(config["verifier_name_or_path"]):
        assert _produced(config["verifier_name_or_path"]), f"{path.name}: verifier {config['verifier_name_or_path']!r}"


@pytest.mark.parametrize("path", list(TRAIN), ids=lambda path: path.stem)
def test_training_reads_what_is_shipped_or_written(path):
    config = TRAIN[path]
    for key in ("verifier_name_or_path", "drafter_name_or_path"):
        value = config.get(key)
        if value is not None and _is_local(value) and not value.endswith("_init"):  # `_init`: a script's output
            assert _produced(value) or value in NOT_YET_BUILT, f"{path.name}: {key} {value!r}"


def test_not_yet_built_paths_are_still_missing():
    # once one is shipped, it leaves the list and is checked like every other path
    assert not any((REPO / path).exists() for path in NOT_YET_BUILT)


def test_a_mismatch_is_caught():
    # the check itself can fail: the CNN/DailyMail evaluation once read a directory its training never wrote
    assert not _produced("runs/drafter_bart_large_cnn")
    assert _produced("runs/drafter_cnn_dailymail")
