"""One table from several `evaluate.py` runs: what `make demo` writes into docs/main_job.md and the README.

Every figure comes from the runs' `results.json`; nothing is copied by hand. A run is a *pass* (a name and an output
directory); each row is one strategy of one pass, with its speed-up against the pass's own greedy and, where the pass
timed beam search, against beam search too: the median over repeats of the paired ratio of totals, as `evaluate.py`
reports its speed-ups (both were timed interleaved in the same repeats).

    python -m specdec_hf.evaluation.summary --run float32=outputs/demo_en_de --run bfloat16=outputs/demo_en_de_bf16 \\
        --output docs/main_job.md --readme README.md --started_at 1764770000 --command "make demo"

With `--readme`, the text between the README's `<!-- main-job:start -->` and `<!-- main-job:end -->` lines is
replaced by the same table, so that the two cannot disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..drafters.ngram_store import CONFIG_NAME as NGRAM_STORE_CONFIG
from .interleaved import format_spread, paired_speedups, spread
from .loading import parse_drafter_entry
from .report import RESULTS_FILE
from .strategies import parse_strategy

__all__ = ["README_END", "README_START", "main", "render_summary", "replace_readme_block", "strategy_label"]

README_START = "<!-- main-job:start -->"
README_END = "<!-- main-job:end -->"
_PEER_LABELS = {
    "greedy": "greedy",
    "assisted": "HF assisted (AR assistant)",
    "prompt_lookup": "HF prompt lookup",
    "ct2": "CTranslate2 greedy, float32",
    "ct2_int8": "CTranslate2 greedy, int8",
    "ct2_int8_float32": "CTranslate2 greedy, int8 / float32",
}


def strategy_label(name: str, drafters: Sequence[str] = (), num_beams: int | None = None) -> str:
    """A strategy's name as a reader says it, e.g. `spec_k2_b1_t0` → `speculative k=2, β=1`.

    Args:
        name (`str`): The strategy's name in `results.json`.
        drafters (`Sequence[str]`): The run's `drafters` entries (paths, `source_copy`, `source_copy+<path>`): with
            more than one, the row names its drafter.
        num_beams (`int`, *optional*): The run's beam width, for `beam`.
    """
    base = re.sub(r"_d\d+$", "", name) if len(drafters) > 1 else name
    strategy = parse_strategy(base)
    if strategy.kind == "beam":
        beams = strategy.num_beams or num_beams
        return f"beam-{beams}" if beams else "beam search"
    if strategy.kind != "speculative":
        return _PEER_LABELS.get(name, name)
    label = f"speculative k={strategy.num_draft_tokens}, β={strategy.beta}"
    if strategy.beta > 1 or strategy.tau:
        label += f", τ={strategy.tau:g}"
    if strategy.confidence_threshold is not None:
        label += f", c={strategy.confidence_threshold:g}"
    match = re.search(r"_d(\d+)$", name)
    if len(drafters) > 1 and match is not None:
        label += f" ({_drafter_label(drafters[int(match[1])])})"
    return label


def _drafter_label(entry: str) -> str:
    """A `drafters` entry as the table names it: a trained drafter or an n-gram store by its directory (by the
    directory above, for one named just `drafter` or `ngram_store`), the source copy by name, so that `x/drafter` and
    `source_copy+x/drafter` read apart."""
    copies, path = parse_drafter_entry(entry)
    if path is None:
        return "source copy"
    directory = Path(path)
    # a local look only: a summary is rendered offline, from saved results
    stored = (directory / NGRAM_STORE_CONFIG).is_file()
    kind, generic = ("n-gram store", "ngram_store") if stored else ("drafter", "drafter")
    name = directory.parent.name if directory.name == generic and directory.parent.name else directory.name
    return f"source copy, else {name} {kind}" if copies else f"{name} {kind}"


def _load_run(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `evaluate.py` with `output_dir: {directory}` first.")
    return json.loads(path.read_text())


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _against(reference_times: Sequence[float], times: Sequence[float]) -> str:
    return format_spread(*spread(paired_speedups(reference_times, times)), 2, "×")


# quality columns: (header, key in results.json, scale to 0-100); a table shows those its runs report
_QUALITY_COLUMNS = (
    ("BLEU", "bleu", 1.0),
    ("chrF", "chrf", 1.0),
    ("R-1", "rouge1", 100.0),
    ("R-2", "rouge2", 100.0),
    ("R-L", "rougeL", 100.0),
)


def render_summary(
    runs: Sequence[tuple[str, dict[str, Any]]],
    command: str,
    started_at: float | None = None,
    finished_at: float | None = None,
) -> str:
    """The Markdown of the summary: a header naming the machine, the date and the wall time, one table per data set
    (consecutive passes on the same rows share a table, with the quality metrics they report), a legend.

    Args:
        runs (`Sequence[tuple[str, dict]]`): (pass name, the run's `results.json` content), in table order.
        command (`str`): What produced the runs (e.g. `make demo`), named in the header.
        started_at, finished_at (`float`, *optional*): Unix times of the command's start and end: the header states
            the wall time between them.
    """
    if not runs:
        raise ValueError("no runs to summarise: give at least one `--run NAME=DIR`.")
    environment = runs[0][1]["environment"]
    date = environment["date"][:10]
    wall = ""
    if started_at is not None and finished_at is not None:
        minutes, seconds = divmod(round(finished_at - started_at), 60)
        wall = f", {minutes} min {seconds:02d} s from the start of the command to its end"
    lines = [
        f"`{command}`, {date}{wall}: {environment['device_name']}, {environment['cpu_count']} CPU cores, "
        f"{environment['num_threads']} threads, torch {environment['torch']}, transformers "
        f"{environment['transformers']}.",
    ]
    groups: list[list[tuple[str, dict[str, Any]]]] = []
    for pass_name, run in runs:
        if groups and groups[-1][0][1]["data"]["description"] == run["data"]["description"]:
            groups[-1].append((pass_name, run))
        else:
            groups.append([(pass_name, run)])
    for group in groups:
        lines += ["", *_render_table(group)]
    lines += [
        "",
        "Columns: **= greedy**, the fraction of rows whose output is token for token greedy decoding's; **Tok.**, "
        "tokens per verifier forward pass (tokens emitted ÷ passes, the bonus token included; 1 for greedy); "
        "**time (s)**, the total over all rows, median over the repeats (min–max); **× greedy** and **× beam**, "
        "the speed-up against the same pass's greedy and beam search, the median (min–max) over repeats of the ratio "
        "of the two totals of the same repeat. Every strategy of a pass is timed interleaved with the others.",
    ]
    return "\n".join(lines) + "\n"


def _render_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One table of passes on the same rows: a line naming the rows, then the table."""
    data, config = runs[0][1]["data"], runs[0][1]["config"]
    lines = [
        f"{data['num_samples']} rows of {data['description']}, batch size {config['evaluation']['batch_size']}, "
        f"{config['evaluation']['repeats']} interleaved repeats per pass.",
        "",
    ]
    reported = {key for _, run in runs for result in run["strategies"].values() for key in result["quality"]}
    quality_columns = [column for column in _QUALITY_COLUMNS if column[1] in reported]
    with_beam = any("beam" in run["strategies"] for _, run in runs)
    header = ["pass", "strategy", *(title for title, _, _ in quality_columns)]
    header += ["= greedy", "Tok.", "time (s)", "× greedy"] + (["× beam"] if with_beam else [])
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for pass_name, run in runs:
        evaluation = run["config"]["evaluation"]
        drafters, num_beams = evaluation.get("drafters") or [], evaluation.get("num_beams")
        beam = run["strategies"].get("beam")
        for name, result in run["strategies"].items():
            speed, quality = result["speed"], result["quality"]
            cells = [pass_name, strategy_label(name, drafters, num_beams)]
            for _, key, scale in quality_columns:
                cells.append(_number(None if quality.get(key) is None else scale * quality[key]))
            cells += [
                _number(result["identical_to_greedy"], 3),
                _number(result["tokens_per_iteration"]),
                format_spread(speed["time_s"], speed["time_s_min"], speed["time_s_max"], 2),
                format_spread(speed["speedup"], speed["speedup_min"], speed["speedup_max"], 2, "×"),
            ]
            if with_beam:
                cells.append("–" if beam is None else _against(beam["speed"]["times_s"], speed["times_s"]))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def replace_readme_block(readme: str, block: str) -> str:
    """`readme` with the text between its `README_START` and `README_END` lines replaced by `block`.

    Raises:
        ValueError: the README lacks the markers, or has them out of order.
    """
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"the README needs a line {README_START!r} followed by a line {README_END!r}.")
    return readme[: start + len(README_START)] + "\n" + block + readme[end:]


def _parse_run(value: str) -> tuple[str, str]:
    name, sep, directory = value.partition("=")
    if not sep or not name or not directory:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=DIR (e.g. float32=outputs/demo_en_de)")
    return name, directory


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=_parse_run, action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--output", required=True, help="The Markdown file to write.")
    parser.add_argument("--readme", help="A README whose main-job block is replaced by the same table.")
    parser.add_argument("--command", default="make demo", help="What produced the runs, named in the header.")
    parser.add_argument("--started_at", type=float, help="Unix time at which the command started.")
    parser.add_argument(
        "--check_only", action="store_true", help="Check the arguments and the README's markers; write nothing."
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str | None:
    """Write the summary (and the README's block); return its Markdown (`None` with `--check_only`)."""
    args = parse_args(argv)
    readme = None if args.readme is None else Path(args.readme)
    if readme is not None:
        replace_readme_block(readme.read_text(), "")  # fails before any work when the markers are missing
    if args.check_only:
        return None
    runs = [(name, _load_run(directory)) for name, directory in args.run]
    text = render_summary(runs, args.command, args.started_at, time.time() if args.started_at else None)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    if readme is not None:
        readme.write_text(replace_readme_block(readme.read_text(), text))
    print(text)
    print(f"Written: {args.output}" + (f" and the main-job block of {readme}" if readme is not None else ""))
    return text


if __name__ == "__main__":
    main()
