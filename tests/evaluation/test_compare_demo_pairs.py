"""benchmarks/compare_demo_pairs.py on two tiny random pairs: every row in one table, exact rows equal to greedy.

The pairs mimic the demo's generations: "v1" with `<pad>` first, committed to a throwaway git repository and tagged
(so it is read through `git:TAG`), and "v2" with the re-laid vocabulary (`<pad>` last) in a plain directory. No timed
assertions: only structure and relations that hold whatever the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import build_verifier, build_word_tokenizer, load_repository_script

from specdec_hf import SpecDrafterModel
from specdec_hf.data.vocabulary_layout import pad_last_permutation, relayout_tokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "mt_fixture.jsonl"
SPECULATIVE = "spec k4 β1"


def load_script():
    return load_repository_script("benchmarks/compare_demo_pairs.py", "compare_demo_pairs")


def save_pair(directory: Path, pad_last: bool, seed: int) -> None:
    """A tiny random Marian verifier with its word tokenizer and a Spec-Drafter, saved as `verifier/` and `drafter/`."""
    texts = [
        text for line in FIXTURE.read_text().splitlines()[:40] for text in json.loads(line)["translation"].values()
    ]
    tokenizer = build_word_tokenizer(texts, vocab_size=400)
    if pad_last:  # v2's layout, which CTranslate2's Marian converter expects
        tokenizer = relayout_tokenizer(tokenizer, pad_last_permutation(len(tokenizer), tokenizer.pad_token_id))
    pad = tokenizer.pad_token_id
    verifier = build_verifier(
        "marian", seed, vocab_size=len(tokenizer), pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=pad, decoder_layers=3 if pad_last else 2,
    )  # fmt: skip
    if pad_last:
        with torch.no_grad():
            verifier.get_input_embeddings().weight[pad].zero_()
        verifier.generation_config.bad_words_ids = [[pad]]
    verifier.save_pretrained(directory / "verifier")
    tokenizer.save_pretrained(directory / "verifier")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1)
    drafter.save_pretrained(directory / "drafter")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args], cwd=repo, check=True)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, Path]:
    """`repo`: a git repository with v1 as `models/demo-en-de` at tag demo-v1; `v1`, `v2`: the pairs' directories."""
    root = tmp_path_factory.mktemp("pairs")
    repo = root / "repo"
    save_pair(repo / "models" / "demo-en-de", pad_last=False, seed=0)
    git(repo.parent, "init", "--quiet", str(repo))
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "v1")
    git(repo, "tag", "demo-v1")
    save_pair(root / "v2", pad_last=True, seed=1)
    return {"repo": repo, "v1": repo / "models" / "demo-en-de", "v2": root / "v2"}


def argv(output_dir: Path, *pair_args: str, limit: int = 4, repeats: int = 2) -> list[str]:
    return [
        *(item for pair in pair_args for item in ("--pair", pair)), "--data_files", str(FIXTURE),
        "--limit", str(limit), "--repeats", str(repeats), "--max_new_tokens", "8", "--num_threads", "1",
        "--output_dir", str(output_dir),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(pairs, tmp_path_factory):
    """One comparison of v1 (from its git tag) and v2, with the validation columns; what `interleave` was given."""
    script = load_script()
    output_dir = tmp_path_factory.mktemp("out")
    interleaved = []
    original = script.interleave

    def spy(measures, *args, **kwargs):
        interleaved.append(list(measures))
        return original(measures, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(script, "ROOT", pairs["repo"])
        patch.setattr(script, "interleave", spy)
        arguments = argv(output_dir, "v1=git:demo-v1", f"v2={pairs['v2']}") + ["--validation_files", str(FIXTURE)]
        record = script.main(arguments)
    return record, output_dir, interleaved


def test_every_row_in_one_table_timed_in_one_interleave_call(run):
    record, output_dir, interleaved = run
    labels = ["v1 greedy", f"v1 {SPECULATIVE}", "v2 greedy", f"v2 {SPECULATIVE}"]
    assert list(record["rows"]) == labels
    assert interleaved == [labels]  # all rows of both pairs in one call: the machine's drift hits them alike
    table = (output_dir / "pairs.md").read_text()
    for label in labels:
        assert f"| {label} |" in table
    assert "| row | BLEU | = own greedy | BLEU val | = own greedy val | Tok. | s / 100 sentences |" in table
    for start in (
        "- machine: ",
        "- torch ",
        "- rows: 4 first",
        f"; 4 drawn with seed 0 from {FIXTURE} [validation]",
        "- repeats: 2",
        "- pairs: v1 = git:demo-v1",
        "- command:",
    ):
        assert start in table, start
    assert json.loads((output_dir / "pairs.json").read_text())["rows"].keys() == record["rows"].keys()
    # the tag's models/demo-en-de, extracted with its path stripped
    assert (output_dir / "pairs" / "v1" / "verifier" / "config.json").is_file()
    v1 = record["pairs"]["v1"]
    assert (v1["given"], v1["directory"]) == ("git:demo-v1", str(output_dir / "pairs" / "v1"))
    # prepacked where measured faster (the default): each pair's kernel choices, per model, in pairs.json
    assert set(v1["linear_kernels"]) == {"verifier", "drafter 0"}
    assert all(choice["num_layers"] >= 1 for choice in v1["linear_kernels"]["verifier"])


def test_exact_speculative_rows_are_their_own_greedy(run):
    rows = run[0]["rows"]
    for pair in ("v1", "v2"):
        greedy, speculative = rows[f"{pair} greedy"], rows[f"{pair} {SPECULATIVE}"]
        for split in ("test", "validation"):
            assert speculative[split]["identical_to_own_greedy"] == 1.0
            assert speculative[split]["quality"]["bleu"] == greedy[split]["quality"]["bleu"]
            assert greedy[split]["tokens_per_iteration"] == 1.0
            assert speculative[split]["tokens_per_iteration"] >= 1.0


def test_times_and_speedups_are_paired_and_positive(run):
    rows = run[0]["rows"]
    for label, row in rows.items():
        seconds = row["seconds_per_100_sentences"]
        assert len(seconds["times_s"]) == 2 and 0 < seconds["time_s_min"] <= seconds["time_s"], label
        for key in ("speedup_over_own_greedy", "speedup_over_baseline_greedy"):
            speedups = row[key]["speedups"]
            assert len(speedups) == 2 and all(math.isfinite(s) and s > 0 for s in speedups), (label, key)
    # the baseline is the first pair: its greedy row is the reference of the last column
    assert rows["v1 greedy"]["speedup_over_baseline_greedy"]["speedups"] == [1.0, 1.0]
    assert rows["v2 greedy"]["speedup_over_own_greedy"]["speedups"] == [1.0, 1.0]


def test_a_validation_file_no_longer_than_the_limit_is_read_whole(tmp_path):
    """`make demo` passes the shipped 100-row validation slice: every row, in order, and said so."""
    script = load_script()
    rows_file = tmp_path / "slice.jsonl"
    rows_file.write_text("".join(FIXTURE.read_text(encoding="utf-8").splitlines(keepends=True)[:3]), encoding="utf-8")
    first_three = [json.loads(line)["translation"]["en"] for line in rows_file.read_text().splitlines()]
    for limit in (3, 5):  # make demo's case is the first: a 100-row file, --limit 100
        rows, _, description = script.load_rows(str(rows_file), "validation", _limit(limit), seed=0)
        assert rows.num_rows == 3 and rows["source"] == first_three
        assert description == f"all 3 of {rows_file} [validation]"
    rows, _, description = script.load_rows(str(rows_file), "validation", _limit(2), seed=0)
    assert rows.num_rows == 2 and description == f"2 drawn with seed 0 from {rows_file} [validation]"


def _limit(limit: int) -> argparse.Namespace:
    """The arguments `load_rows` reads."""
    return argparse.Namespace(limit=limit, source_lang="en", target_lang="de")


def test_a_missing_tag_names_the_tag_and_the_fetch_command(tmp_path, monkeypatch):
    script = load_script()
    repo = tmp_path / "repo"
    git(tmp_path, "init", "--quiet", str(repo))
    monkeypatch.setattr(script, "ROOT", repo)
    with pytest.raises(SystemExit, match=r"git tag 'demo-v1' is not in the repository.*git fetch origin tag demo-v1"):
        script.main(argv(tmp_path / "out", "v1=git:demo-v1"))
    assert not (tmp_path / "out" / "pairs.md").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("v1", "'v1' is not NAME=DIR or NAME=git:TAG"),
        ("=models", "is not NAME=DIR"),
        ("v1={missing}", "does not exist"),
        ("v1={empty}", "has no verifier/ or drafter/"),
        ("..=git:demo-v1", "NAME must be letters, digits"),
        ("a/b=git:demo-v1", "NAME must be letters, digits"),
    ],
)
def test_a_bad_pair_value_names_the_argument(tmp_path, capsys, value, message):
    (tmp_path / "empty").mkdir()
    value = value.format(missing=tmp_path / "missing", empty=tmp_path / "empty")
    with pytest.raises(SystemExit) as exit_info:
        load_script().parse_args(["--pair", value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "argument --pair" in error and message in error


def test_repeated_pair_names_are_refused(pairs, capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(["--pair", f"v2={pairs['v2']}", "--pair", f"v2={pairs['v1']}"])
    assert "argument --pair: the names must differ, got ['v2', 'v2']" in capsys.readouterr().err


def test_ct2_row_for_the_pad_last_pair_only(pairs, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    script = load_script()
    checked_threads = []
    check = script.check_machine_load
    monkeypatch.setattr(
        script, "check_machine_load", lambda threads: checked_threads.append(threads) or check(threads)
    )
    record = script.main(
        argv(tmp_path, f"v1={pairs['v1']}", f"v2={pairs['v2']}", limit=3, repeats=1) + ["--ct2", "--ct2_threads", "2"]
    )
    assert checked_threads == [2]  # the idle cores the timings need: CTranslate2's 2 threads, not torch's 1
    rows = record["rows"]
    assert list(rows) == ["v1 greedy", f"v1 {SPECULATIVE}", "v2 greedy", f"v2 {SPECULATIVE}", "v2 ct2 float32"]
    ct2 = rows["v2 ct2 float32"]
    assert ct2["test"]["identical_to_own_greedy"] == 1.0  # float32: greedy's outputs, through v2's own ids
    assert ct2["test"]["tokens_per_iteration"] is None and ct2["speedup_over_baseline_greedy"]["speedup"] > 0
    assert "<pad> is id 1" in record["skipped_rows"]["v1 ct2 float32"]  # v1's layout: left out, with the reason
    assert "v1 ct2 float32: not run: CTranslate2 cannot convert" in (tmp_path / "pairs.md").read_text()
