"""Generations of the demo pair side by side: greedy and exact Speculative Decoding of each, in one table.

Speculative Decoding (Xia et al., 2023, arXiv 2203.16487) at β=1, τ=0 gives greedy's outputs, so each pair's
speculative row differs from its greedy row in speed only. Every pair decodes the same source texts, each encoded by
its own tokenizer (the generations share the pieces, not the ids). Each row runs once instrumented (its warm-up,
outputs, BLEU, Tok.), then all rows of all pairs are timed in one `interleave` call, one sentence at a time in a
rotating order, so that the machine's drift hits them alike; a speed-up is the median of the paired per-repeat ratios.

    python benchmarks/compare_demo_pairs.py --pair v1=git:demo-v1 --pair v2=models/demo-en-de --ct2 --ct2_threads 1 \
        --validation_files models/demo-en-de/heldout_validation.jsonl

A pair is a directory holding `verifier/` and `drafter/`, or `git:TAG`: `models/demo-en-de` as committed at TAG,
extracted into `<output_dir>/pairs/NAME/`. The first pair is the baseline of the last column.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from _common import positive_int

from specdec_hf.data.loading import DataArguments, load_text_pairs, sample_indices
from specdec_hf.data.tokenization import default_source_prefix, source_length_limit
from specdec_hf.dtypes import TORCH_DTYPES
from specdec_hf.evaluation import ctranslate2_peer
from specdec_hf.evaluation.arguments import EvaluationArguments
from specdec_hf.evaluation.batching import Batch, encode_sources, eos_token_ids, make_batches
from specdec_hf.evaluation.execution import StrategyRun, group_runner, run_strategy
from specdec_hf.evaluation.interleaved import format_spread, interleave, timing_summary
from specdec_hf.evaluation.loading import EvaluationModels, load_models
from specdec_hf.evaluation.machine import check_machine_load, cpu_model
from specdec_hf.evaluation.metrics import corpus_quality, fraction_identical
from specdec_hf.evaluation.preflight import check_models, check_pairs
from specdec_hf.evaluation.strategies import Strategy, generation_kwargs, parse_strategy
from specdec_hf.evaluation.timing import timed
from specdec_hf.files import write_json_atomic
from specdec_hf.linear_kernel_selection import kernel_choices_to_json

ROOT = Path(__file__).resolve().parents[1]
DEMO_DIR = "models/demo-en-de"
# the Debian validation split is ordered by origin (dictionary rows first): its rows are drawn at random
VALIDATION_SEED = 0
CPU = torch.device("cpu")
logger = logging.getLogger("compare_demo_pairs")


def check_pair_dir(directory: Path) -> None:
    """Raises `FileNotFoundError` (saying what is missing) unless `directory` holds `verifier/` and `drafter/`."""
    if not directory.is_dir():
        raise FileNotFoundError(f"directory {str(directory)!r} does not exist")
    missing = [name for name in ("verifier", "drafter") if not (directory / name).is_dir()]
    if missing:
        raise FileNotFoundError(
            f"{str(directory)!r} has no {' or '.join(f'{name}/' for name in missing)}: a pair directory holds "
            f"verifier/ and drafter/, as {DEMO_DIR} does"
        )


def parse_pair(value: str) -> tuple[str, str]:
    """`NAME=DIR` or `NAME=git:TAG` → `(NAME, DIR or git:TAG)`; a directory is checked at once (`check_pair_dir`).
    Raises `argparse.ArgumentTypeError`, which argparse reports as `argument --pair: ...`."""
    name, equals, spec = value.partition("=")
    if not equals or not name or not spec:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=DIR or NAME=git:TAG (e.g. v2={DEMO_DIR})")
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", name):
        # NAME becomes a directory under --output_dir (a tag's pair is extracted there, replacing what was there)
        raise argparse.ArgumentTypeError(f"{value!r}: NAME must be letters, digits, '_', '-' or '.' (e.g. v1)")
    if not spec.startswith("git:"):
        try:
            check_pair_dir(Path(spec))
        except FileNotFoundError as err:
            raise argparse.ArgumentTypeError(f"{value!r}: {err}") from None
    return name, spec


def materialise_tag(tag: str, destination: Path, repo: Path = ROOT) -> Path:
    """Extract `models/demo-en-de` as committed at `tag` in `repo` into `destination` (replaced), so that
    `destination/verifier` exists; `SystemExit` when the tag is missing (naming the fetch command) or holds no pair."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{tag}^{{commit}}"], cwd=repo, capture_output=True
    )
    if found.returncode != 0:
        raise SystemExit(
            f"error: argument --pair: git tag {tag!r} is not in the repository at {repo}; fetch it with "
            f"`git fetch origin tag {tag}` (or pass the pair's directory instead)."
        )
    archive = subprocess.run(["git", "archive", "--format=tar", tag, DEMO_DIR], cwd=repo, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"error: `git archive {tag} {DEMO_DIR}` failed: {archive.stderr.decode().strip()}")
    if destination.exists():  # a directory of ours from an earlier run: no file of another tag may linger
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    strip = f"--strip-components={len(Path(DEMO_DIR).parts)}"  # DIR/verifier, not DIR/models/demo-en-de/verifier
    subprocess.run(["tar", "-x", "-C", str(destination), strip], input=archive.stdout, check=True)
    try:
        check_pair_dir(destination)
    except FileNotFoundError as err:
        raise SystemExit(f"error: argument --pair: {DEMO_DIR} at git tag {tag!r}: {err}") from None
    return destination


@dataclass
class Row:
    """One line of the table: a strategy of a pair, with its models, `generate()` arguments and batches per split."""

    label: str
    pair: str
    strategy: Strategy
    kwargs: dict[str, Any]  # empty for CTranslate2
    models: EvaluationModels
    eos_ids: list[int]
    batches: dict[str, list[Batch]]  # per split, one row per batch in data order: batch g is row g for every pair


def load_rows(path: str, split: str, args: argparse.Namespace, seed: int | None = None) -> tuple:
    """The translation rows of a JSONL file (its first `args.limit`, or with `seed` that many drawn at random), their
    `DataArguments` and a description."""
    data_args = DataArguments(
        data_files={split: [path]}, source_lang=args.source_lang, target_lang=args.target_lang,
        max_samples=args.limit if seed is None else None,  # a random draw reads the whole split
    )  # fmt: skip
    rows = load_text_pairs(data_args, split)
    source = f"{path} [{split}]"
    if seed is None:
        description = f"{rows.num_rows} first {source}"
    else:
        total = rows.num_rows
        rows = rows.select(sample_indices(total, args.limit, seed))
        drawn = f"all {total} of" if total <= args.limit else f"{rows.num_rows} drawn with seed {seed} from"
        description = f"{drawn} {source}"
    check_pairs(rows, source)
    return rows, data_args, description


def load_pair(
    name: str, directory: Path, args: argparse.Namespace, splits: dict, workers: contextlib.ExitStack
) -> tuple[list[Row], str]:
    """A pair's rows: greedy and β=1 on its models loaded as the main job loads them (`load_models`), and CTranslate2
    greedy where asked and its verifier converts faithfully; else the reason for leaving that row out (or `""`)."""
    eval_args = EvaluationArguments(
        verifier_name_or_path=str(directory / "verifier"), drafters=[str(directory / "drafter")],
        strategies=["greedy", f"spec_k{args.num_draft_tokens}_b1_t0"], batch_size=1, device="cpu", sweep=False,
        max_new_tokens=args.max_new_tokens, dtype="float32", drafter_dtype=args.drafter_dtype,
        prepack_linear=args.prepack_linear,
    )  # fmt: skip
    models = load_models(eval_args, CPU)
    verifier, tokenizer = models.verifier, models.tokenizer
    strategies = eval_args.resolved_strategies
    check_models(verifier, tokenizer, models.drafters, eval_args.drafters, None, strategies, args.max_new_tokens)
    batches = {}
    for split, (data, data_args, _) in splits.items():  # each pair encodes the same texts with its own tokenizer
        languages = data_args.languages or (None, None)
        prefix = default_source_prefix(verifier.config.model_type, data_args.task, *languages)
        encoded = encode_sources(tokenizer, list(data["source"]), prefix, source_length_limit(tokenizer, verifier))
        batches[split] = make_batches(encoded, 1, verifier.config.pad_token_id, CPU, sort_by_length=False)
    eos_ids = eos_token_ids(verifier)
    rows = []
    for strategy in strategies:
        label = f"{name} greedy" if strategy.kind == "greedy" else f"{name} spec k{args.num_draft_tokens} β1"
        kwargs = generation_kwargs(strategy, args.max_new_tokens, drafter=models.drafters[0])
        rows.append(Row(label, name, strategy, kwargs, models, eos_ids, batches))
    if not args.ct2:
        return rows, ""
    try:  # CTranslate2's converter assumes Marian's layout, and its decoding the verifier's settings
        ctranslate2_peer.check_marian_layout(verifier)
        ctranslate2_peer.decoding_options(verifier, tokenizer)
    except ValueError as reason:
        return rows, str(reason)
    ct2 = parse_strategy("ct2")
    output_dir = Path(args.output_dir) / "ct2" / name  # converted once, reused while the weights are the same
    verifier_dir = str(directory / "verifier")
    models.ct2_workers = ctranslate2_peer.start_ct2_workers(
        [ct2], verifier, tokenizer, verifier_dir, output_dir, args.ct2_threads, workers
    )
    return [*rows, Row(f"{name} ct2 float32", name, ct2, {}, models, eos_ids, batches)], ""


def instrumented(row: Row, split: str, max_new_tokens: int) -> StrategyRun:
    """One pass of `row` over a split, as `evaluate.py` makes it: its warm-up, outputs and Tok."""
    batches = row.batches[split]
    if row.strategy.kind == "ctranslate2":
        worker = row.models.ct2_workers[row.strategy.name]
        return ctranslate2_peer.run_ct2_strategy(row.strategy, worker, row.models.tokenizer, batches, max_new_tokens)
    verifier = row.models.verifier
    return run_strategy(
        row.strategy, verifier, batches, row.kwargs, CPU, row.eos_ids, measure_memory=False, disable_tqdm=True
    )


def measure(row: Row, max_new_tokens: int) -> Callable[[int], float]:
    """`measure(g)`: the seconds of `row` on test row `g`, nothing attached (CTranslate2: its worker's own seconds)."""
    groups = [[batch] for batch in row.batches["test"]]
    if row.strategy.kind == "ctranslate2":
        worker = row.models.ct2_workers[row.strategy.name]
        return ctranslate2_peer.ct2_group_measure(worker, row.models.tokenizer, groups, max_new_tokens)
    run = group_runner(row.models.verifier, groups, row.kwargs)
    return lambda group: timed(lambda: run(group), CPU)[0]


def score(rows: list[Row], runs: dict, times: dict[str, list[float]], splits: dict) -> dict[str, dict]:
    """Per row: BLEU, agreement with its pair's greedy and Tok. per split; seconds per 100 sentences; speed-ups
    (paired per-repeat ratios) over its own greedy and over the first pair's greedy."""
    greedy_of = {row.pair: row.label for row in rows if row.strategy.kind == "greedy"}
    baseline = greedy_of[rows[0].pair]
    results = {}
    for row in rows:
        result: dict[str, Any] = {"pair": row.pair, "strategy": row.strategy.name}
        for split, (data, _, _) in splits.items():
            run, greedy = runs[row.label, split], runs[greedy_of[row.pair], split]
            hypotheses = row.models.tokenizer.batch_decode(run.sequences, skip_special_tokens=True)
            result[split] = {
                "quality": corpus_quality(hypotheses, list(data["target"])),
                "identical_to_own_greedy": fraction_identical(run.sequences, greedy.sequences),
                "tokens_per_iteration": run.tokens_per_iteration,
            }
        per_100 = 100 / splits["test"][0].num_rows
        result["seconds_per_100_sentences"] = timing_summary([t * per_100 for t in times[row.label]], None)
        result["speedup_over_own_greedy"] = timing_summary(times[row.label], times[greedy_of[row.pair]])
        result["speedup_over_baseline_greedy"] = timing_summary(times[row.label], times[baseline])
        results[row.label] = result
    return results


def compare(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Run every row of every pair, time them interleaved, and write `pairs.md` and `pairs.json`; return the record."""
    # 1. Everything that can fail before a model loads: the pairs, the data (the arguments are checked); the machine.
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    directories = {}
    for name, spec in args.pair:
        tag = spec.removeprefix("git:")
        directories[name] = materialise_tag(tag, output_dir / "pairs" / name, ROOT) if tag != spec else Path(spec)
    splits = {"test": load_rows(args.data_files, "test", args)}
    if args.validation_files:
        splits["validation"] = load_rows(args.validation_files, "validation", args, seed=VALIDATION_SEED)
    torch.set_num_threads(args.num_threads)
    # what else keeps the cores busy, for the header; the runs take turns, so the busiest sets the cores needed
    machine = check_machine_load(max(args.num_threads, args.ct2_threads if args.ct2 else 0))

    with contextlib.ExitStack() as workers:  # CTranslate2 worker processes, stopped however the run ends
        # 2. Every pair's rows; 3. each once per split, instrumented (the warm-up, the outputs).
        rows, skipped = [], {}
        for name, directory in directories.items():
            pair_rows, reason = load_pair(name, directory, args, splits, workers)
            rows += pair_rows
            if reason:
                skipped[f"{name} ct2 float32"] = reason
                logger.warning("no CTranslate2 row for pair %s: %s", name, reason)
        runs = {(row.label, split): instrumented(row, split, args.max_new_tokens) for row in rows for split in splits}
        # 4. The timed passes: every row of every pair in one interleave call, one test sentence per group.
        measures = {row.label: measure(row, args.max_new_tokens) for row in rows}
        times = interleave(measures, splits["test"][0].num_rows, args.repeats, "timed passes", disable_tqdm=True)

    header = [
        f"machine: {cpu_model()}, {os.cpu_count()} logical cores; threads: torch {args.num_threads}"
        + (f", CTranslate2 {args.ct2_threads}" if args.ct2 else ""),
        f"torch {torch.__version__}, transformers {transformers.__version__}; CPU, batch size 1, max_new_tokens "
        f"{args.max_new_tokens}; verifiers float32, drafters {args.drafter_dtype}, "
        f"{'linear layers prepacked where measured faster' if args.prepack_linear else 'plain linear layers'}",
        "rows: " + "; ".join(description for _, _, description in splits.values()),
        f"repeats: {args.repeats}, all rows interleaved one sentence at a time in a rotating order after an "
        "instrumented warm-up; median (min–max); speed-ups: paired per-repeat ratios",
        "pairs: " + ", ".join(f"{name} = {spec}" for name, spec in args.pair) + f" (baseline: {args.pair[0][0]})",
        f"command: {command}",
    ]
    if machine["shared_machine_warning"]:
        header.append(f"warning: {machine['shared_machine_warning']}")
    results = score(rows, runs, times, splits)
    table = markdown(results, header, args.pair[0][0], list(splits), skipped)
    print(table)
    (output_dir / "pairs.md").write_text(table, encoding="utf-8")
    pairs = {name: {"given": spec, "directory": str(directories[name])} for name, spec in args.pair}
    for row in rows:  # the kernel chosen per linear layer signature of each pair's models (`--prepack_linear`)
        pairs[row.pair]["linear_kernels"] = kernel_choices_to_json(row.models.kernel_choices)
    record = {"header": header, "machine": machine, "pairs": pairs, "rows": results, "skipped_rows": skipped}
    write_json_atomic(output_dir / "pairs.json", record)
    return record


def _cell(summary: dict[str, Any], key: str, suffix: str = "") -> str:
    return format_spread(summary[key], summary[f"{key}_min"], summary[f"{key}_max"], 2, suffix)


def markdown(results: dict[str, dict], header: list[str], baseline: str, splits: list[str], skipped: dict) -> str:
    """The table of `compare`'s rows under its header lines, with the reason for each CTranslate2 row left out."""
    validation = "validation" in splits
    columns = ["row", "BLEU", "= own greedy"] + (["BLEU val", "= own greedy val"] if validation else [])
    columns += ["Tok.", "s / 100 sentences", "× own greedy", f"× {baseline} greedy"]
    lines = [*(f"- {line}" for line in header), "", f"| {' | '.join(columns)} |", "|---" * len(columns) + "|"]
    for label, result in results.items():
        cells = [label]
        for split in splits:
            figures = result[split]
            cells += [f"{figures['quality']['bleu']:.2f}", f"{figures['identical_to_own_greedy']:.0%}"]
        tokens = result["test"]["tokens_per_iteration"]
        cells.append("–" if tokens is None else f"{tokens:.2f}")
        cells.append(_cell(result["seconds_per_100_sentences"], "time_s"))
        cells += [
            _cell(result[key], "speedup", "×") for key in ("speedup_over_own_greedy", "speedup_over_baseline_greedy")
        ]
        lines.append(f"| {' | '.join(cells)} |")
    lines += [f"\n{label}: not run: {reason}" for label, reason in skipped.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see `--help`)."""
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=formatter)
    parser.add_argument(
        "--pair", type=parse_pair, action="append", required=True, metavar="NAME=DIR|NAME=git:TAG",
        help=f"A pair: a directory with verifier/ and drafter/, or git:TAG for {DEMO_DIR} at that tag (extracted into "
        "<output_dir>/pairs/NAME). Repeat it; the first is the baseline of the last column.",
    )  # fmt: skip
    parser.add_argument("--data_files", default=f"{DEMO_DIR}/heldout_test.jsonl", help="JSONL of translation rows.")
    parser.add_argument(
        "--validation_files", default=None,
        help=f"JSONL of validation rows (e.g. {DEMO_DIR}/heldout_validation.jsonl, or the corpus's whole split): BLEU "
        f"and = own greedy also on them (`--limit` of them drawn with seed {VALIDATION_SEED} where there are more), "
        "from one untimed pass per row.",
    )  # fmt: skip
    parser.add_argument("--source_lang", default="en", help="Source language of the rows' `translation`.")
    parser.add_argument("--target_lang", default="de", help="Target language of the rows' `translation`.")
    parser.add_argument(
        "--limit", type=positive_int, default=100, help="Test rows: the first N; validation rows: N drawn at random."
    )
    parser.add_argument(
        "--num_draft_tokens", type=positive_int, default=4, help="k of the speculative rows (β=1, τ=0)."
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="Timed passes over every row, interleaved.")
    parser.add_argument("--max_new_tokens", type=positive_int, default=96, help="Generation length limit.")
    parser.add_argument("--num_threads", type=positive_int, default=2, help="torch's CPU threads.")
    parser.add_argument(
        "--ct2_threads",
        type=positive_int,
        default=None,
        help="CTranslate2's intra-op threads (default: --num_threads).",
    )
    parser.add_argument(
        "--ct2", action="store_true",
        help="Add a CTranslate2 float32 greedy row for every verifier in Marian's layout (<pad> last); others are "
        "skipped with the reason.",
    )  # fmt: skip
    parser.add_argument("--output_dir", default="outputs/demo_pairs", help="Where pairs.md and pairs.json go.")
    parser.add_argument(
        "--prepack_linear", action=argparse.BooleanOptionalAction, default=True,
        help="Run every model's linear layers on oneDNN-prepacked weights where measured faster "
        "(specdec_hf.prepack_where_faster), as the main job.",
    )  # fmt: skip
    parser.add_argument(
        "--drafter_dtype", default="float32", choices=list(TORCH_DTYPES), help="The drafters' weights."
    )
    args = parser.parse_args(argv)
    if args.ct2_threads is None:
        args.ct2_threads = args.num_threads
    names = [name for name, _ in args.pair]
    if len(set(names)) != len(names):
        parser.error(f"argument --pair: the names must differ, got {names}")
    if args.ct2:
        try:
            ctranslate2_peer.check_ctranslate2_available()
        except ImportError as err:
            parser.error(f"argument --ct2: {err}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the command line and run `compare`; returns what `pairs.json` holds."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/compare_demo_pairs.py", *(sys.argv[1:] if argv is None else argv)])
    return compare(args, command)


if __name__ == "__main__":
    main()
