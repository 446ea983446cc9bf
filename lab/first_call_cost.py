"""What a fresh process's first `num_draft_tokens="auto"` calls cost against greedy, while they calibrate their cost
tables.

The demo pair loads with the kernels `prepack_where_faster` chooses; greedy and β=1 at a fixed k are warmed with two
calls each and timed three times each; then `"auto"`'s first calls of the process are timed, each beside a greedy
call, and after each, how far its cost tables' calibration got (the widths w whose forwards were all timed). Every
call decodes the same batch: the first `--batch_size` held-out rows.

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
    parser.add_argument("--calls", type=positive_int, default=8, help="auto calls timed, the first included.")
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

    def decode(num_draft_tokens) -> float:
        extra = {}
        if num_draft_tokens is not None:
            extra = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=num_draft_tokens)
        started = time.perf_counter()
        verifier.generate(**batch, **GREEDY_KWARGS, **extra)
        return (time.perf_counter() - started) * 1e3

    def calibration_state() -> str:
        """Per cost table of the pair: its batch width's bucket and the widths w whose forwards were all timed."""
        tables = draft_length._COST_TABLES.get(drafter, {}).get(verifier, {})
        return ", ".join(
            f"batch {key[0]}: {len(table.verify_seconds)}/{table.largest_k + 1} widths"
            for key, table in tables.items()
        )

    for setting in (None, args.num_draft_tokens):
        decode(setting), decode(setting)
    greedy = [decode(None) for _ in range(3)]
    fixed = [decode(args.num_draft_tokens) for _ in range(3)]
    print(f"batch {args.batch_size}, ms per call")
    print(f"greedy: {listed(greedy)}")
    print(f"k={args.num_draft_tokens}: {listed(fixed)}")
    # each auto call next to a greedy call, so that a slow moment of the machine shows in both
    for call in range(1, args.calls + 1):
        auto, plain = decode("auto"), decode(None)
        print(f"auto call {call}: {auto:.1f} (greedy right after: {plain:.1f}); tables: {calibration_state()}")


def listed(values) -> str:
    """Milliseconds, one decimal, comma-separated."""
    return ", ".join(f"{value:.1f}" for value in values)


if __name__ == "__main__":
    main()
