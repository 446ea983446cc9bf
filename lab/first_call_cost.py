"""What a fresh process's first `num_draft_tokens="auto"` call costs against greedy: its cost table's calibration.

The demo pair loads with the kernels `prepack_where_faster` chooses; greedy and β=1 at a fixed k are warmed with two
calls each and timed three times each; then `"auto"`'s first call of the process (it calibrates its batch width)
and the calls after it are timed, with `calibrate` wrapped in a timer so that each calibration's time and the call it
fell in are printed. Every call decodes the same batch: the first `--batch_size` held-out rows.

    python -m lab.first_call_cost --batch_size 1
    python -m lab.first_call_cost --batch_size 16
"""

from __future__ import annotations

import argparse
import itertools
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
from specdec_hf import prepack_where_faster, speculative_generate
from specdec_hf.data.local_files import read_jsonl
from specdec_hf.generation import draft_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=16, num_draft_tokens=3)
    parser.add_argument("--batch_size", type=positive_int, default=1)
    parser.add_argument("--calls", type=positive_int, default=5, help="auto calls timed, the first included.")
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(None)
    verifier, drafter = load_demo_pair(args, prepack=False)
    prepack_where_faster(verifier)
    prepack_where_faster(drafter, runs_after=verifier)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    sources = [source_text(row) for row in itertools.islice(read_jsonl(args.data), args.batch_size)]
    batch = dict(tokenizer(sources, return_tensors="pt", padding=True))

    calibrations: list[tuple[int, float]] = []  # (auto call, seconds)
    auto_calls = 0
    calibrate = draft_length.calibrate

    def timed_calibrate(measure, widths):
        started = time.perf_counter()
        costs = calibrate(measure, widths)
        calibrations.append((auto_calls, time.perf_counter() - started))
        return costs

    def decode(num_draft_tokens) -> float:
        extra = {}
        if num_draft_tokens is not None:
            extra = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=num_draft_tokens)
        started = time.perf_counter()
        verifier.generate(**batch, **GREEDY_KWARGS, **extra)
        return (time.perf_counter() - started) * 1e3

    draft_length.calibrate = timed_calibrate
    try:
        for setting in (None, args.num_draft_tokens):
            decode(setting), decode(setting)
        greedy = [decode(None) for _ in range(3)]
        fixed = [decode(args.num_draft_tokens) for _ in range(3)]
        auto = []
        for _ in range(args.calls):
            auto_calls += 1
            auto.append(decode("auto"))
    finally:
        draft_length.calibrate = calibrate

    def listed(values) -> str:
        return ", ".join(f"{value:.1f}" for value in values)

    print(f"batch {args.batch_size}, ms per call")
    print(f"greedy: {listed(greedy)}")
    print(f"k={args.num_draft_tokens}: {listed(fixed)}")
    print(f"auto, the process's first call: {auto[0]:.1f}; the next: {listed(auto[1:])}")
    print(
        "calibrations: " + "; ".join(f"{seconds * 1e3:.1f} ms in auto call {call}" for call, seconds in calibrations)
    )


if __name__ == "__main__":
    main()
