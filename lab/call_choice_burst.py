"""How `num_draft_tokens="auto"` chooses whole calls at batch 16 when other work on the machine slows some passes:
the en→de pair, held-out rows sorted by length in batches, greedy and `"auto"` decoding each batch in turn, passes
over the same batches, and busy processes started before chosen passes and stopped after them.

Per pass: each rule's time against greedy's (the sum over the pass's batches, all timed in the same pass), which calls
drafted (`D`) and which decoded plainly (`.`), and the outputs' agreement with greedy. With `--compare`, another
`draft_length.py` (a candidate rule or an older revision: `git show <rev>:specdec_hf/generation/draft_length.py >
/tmp/rule/draft_length.py`, and its `call_choice.py` into the same folder) decodes the same batches too, its
measurements its own; only revisions from 157d93a on fit the package's loop (earlier ones timed stand-in forwards
through a `measure` the loop no longer passes to `next_k`); the rules and greedy rotate their order from batch to batch.
The figures of passes under load say how a rule bears it; those after, whether it recovers.

    python -m lab.call_choice_burst --passes 12 --burst 2 3 --compare /tmp/rule/draft_length.py

Every speculative call takes `num_draft_tokens="auto"` (`--num_draft_tokens` is not read); a call is counted as
drafting when its drafter ran (a call through the loop that never drafted counts as plain).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import time

import torch
from transformers import AutoTokenizer

from benchmarks._common import (
    GREEDY_KWARGS,
    add_demo_pair_arguments,
    load_demo_pair,
    positive_int,
    print_header,
    source_text,
)
from lab.call_choice_scenarios import load_module
from specdec_hf import prepack_where_faster, speculative_generate
from specdec_hf.data.local_files import read_jsonl
from specdec_hf.generation import api, draft_length

# what a busy process runs: float32 matrix products on one thread, until it is stopped
_BUSY = "import torch; torch.set_num_threads(1); a = torch.randn(512, 512)\nwhile True: a @ a"


def batches(path: str, tokenizer, rows: int, batch_size: int) -> list[dict]:
    """The first `rows` held-out sources, sorted by length, tokenised in padded batches of `batch_size`."""
    sources = [source_text(example) for example in itertools.islice(read_jsonl(path), rows)]
    sources.sort(key=lambda text: len(tokenizer(text).input_ids))
    return [
        dict(tokenizer(sources[start : start + batch_size], return_tensors="pt", padding=True))
        for start in range(0, len(sources), batch_size)
    ]


def _stop(processes: list) -> None:
    """Stop the busy processes (and forget them)."""
    for process in processes:
        process.kill()
        process.wait()
    processes.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=160, num_draft_tokens=2)
    parser.add_argument("--batch_size", type=positive_int, default=16)
    parser.add_argument("--passes", type=positive_int, default=12)
    parser.add_argument("--burst", type=int, nargs="*", default=[2, 3], help="Passes (from 1) run under load.")
    parser.add_argument("--burst_processes", type=positive_int, default=2, help="Busy processes during a burst.")
    parser.add_argument("--compare", help="Another draft_length.py (its call_choice.py beside it), decoding beside.")
    args = parser.parse_args()
    print_header(args.passes)
    verifier, drafter = load_demo_pair(args, prepack=False)
    prepack_where_faster(verifier)
    prepack_where_faster(drafter, runs_after=verifier)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    inputs = batches(args.data, tokenizer, args.limit, args.batch_size)
    rules = {"package": draft_length}
    if args.compare:
        rules["compared"] = load_module(args.compare)

    def decode(name: str, batch: dict):
        if name == "greedy":
            return verifier.generate(**batch, **GREEDY_KWARGS), None
        api.DraftLengthSchedule = rules[name].DraftLengthSchedule  # the rule this call decodes under
        output = verifier.generate(
            **batch, **GREEDY_KWARGS, custom_generate=speculative_generate, drafter=drafter,
            num_draft_tokens="auto", return_dict_in_generate=True,
        )  # fmt: skip
        return output.sequences, output.speculative_stats.drafter_calls > 0

    names = ["greedy", *rules]
    print(f"{len(inputs)} batches of {args.batch_size} rows; burst passes {args.burst}, {args.burst_processes} busy")
    header = " | ".join(f"{name}: × greedy, calls" for name in rules)
    print(f"| pass | load | greedy (s) | {header} | = greedy |")
    print("|---|---|---|" + "---|" * len(rules) + "---|")
    ratios_by_pass = {}
    busy = []
    try:
        for number in range(1, args.passes + 1):
            if number in args.burst:
                busy = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(args.burst_processes)]
                time.sleep(1.0)  # the busy processes started
            seconds = dict.fromkeys(names, 0.0)
            kinds = dict.fromkeys(rules, "")
            same = []
            for index, batch in enumerate(inputs):
                order = names[index % len(names) :] + names[: index % len(names)]
                outputs = {}
                for name in order:
                    start = time.perf_counter()
                    outputs[name], drafted = decode(name, batch)
                    seconds[name] += time.perf_counter() - start
                    if name in rules:
                        kinds[name] += "D" if drafted else "."
                for name in rules:
                    same.append(torch.equal(outputs[name], outputs["greedy"]))
            loaded = bool(busy)
            _stop(busy)
            ratios_by_pass[number] = {name: seconds["greedy"] / seconds[name] for name in rules}
            cells = " | ".join(f"{seconds['greedy'] / seconds[name]:.3f}× `{kinds[name]}`" for name in rules)
            load = "busy" if loaded else "–"
            print(f"| {number} | {load} | {seconds['greedy']:.2f} | {cells} | {sum(same)}/{len(same)} |", flush=True)
    finally:
        _stop(busy)  # on an error or an interrupt too: nothing busy left behind
        api.DraftLengthSchedule = draft_length.DraftLengthSchedule
    # after the last burst, or after the first pass (most of the cost tables calibrated in it) without one
    after = [number for number in ratios_by_pass if number > max(args.burst, default=1)]
    for name in rules:
        values = [ratios_by_pass[number][name] for number in after]
        if values:
            print(
                f"{name}: passes {after[0]}-{after[-1]}, median {statistics.median(values):.3f}× greedy "
                f"({min(values):.3f}–{max(values):.3f})"
            )


if __name__ == "__main__":
    main()
