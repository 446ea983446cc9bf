"""Greedy and speculative β=1 at several torch thread counts, interleaved in one process, on the demo pair.

Each (strategy, threads) pair decodes all sentences per run; the runs rotate in order over the repeats, and the
thread count is set before each run (`torch.set_num_threads`). Both models are prepacked unless `--plain`; with
`--prepack_where_faster` each thread count decodes with its own copy of the pair, whose kernels
`prepack_where_faster` chose under that thread count (as the main job chooses them).

    python -m lab.bench_threads --dtype float32 --threads 1 2
    python -m lab.bench_threads --drafter_dtype float32 --num_draft_tokens 3 --threads 1 2 --prepack_where_faster
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoTokenizer

from benchmarks._common import (
    GREEDY_KWARGS,
    add_demo_pair_arguments,
    load_demo_pair,
    print_header,
    read_sources,
    with_range,
)
from specdec_hf import prepack_where_faster, speculative_generate
from specdec_hf.evaluation.interleaved import interleave, paired_speedups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=60, num_draft_tokens=4)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=4)
    kernel_options = parser.add_mutually_exclusive_group()
    kernel_options.add_argument("--plain", action="store_true", help="Without prepack_linear_layers.")
    kernel_options.add_argument(
        "--prepack_where_faster", action="store_true", help="A pair per thread count, its kernels chosen under it."
    )
    args = parser.parse_args()
    print_header(args.repeats)

    if args.prepack_where_faster:
        pairs = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            verifier, drafter = load_demo_pair(args, prepack=False)
            with torch.inference_mode():
                prepack_where_faster(verifier)
                prepack_where_faster(drafter, runs_after=verifier)
            pairs[threads] = (verifier, drafter)
    else:
        pairs = dict.fromkeys(args.threads, load_demo_pair(args, prepack=not args.plain))
    sources = read_sources(args.data, AutoTokenizer.from_pretrained(args.verifier), args.limit)

    def run(strategy: str, threads: int, group: int) -> float:
        torch.set_num_threads(threads)
        verifier, drafter = pairs[threads]
        extra = {}
        if strategy == "speculative":
            extra = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=args.num_draft_tokens)
        start = time.perf_counter()
        for source in sources:
            verifier.generate(**source, **GREEDY_KWARGS, **extra)
        return time.perf_counter() - start

    measures = {
        (strategy, threads): (lambda group, s=strategy, t=threads: run(s, t, group))
        for threads in args.threads
        for strategy in ("greedy", "speculative")
    }
    with torch.no_grad():
        interleave(measures, num_groups=1, repeats=1, desc="warm-up")
        totals = interleave(measures, num_groups=1, repeats=args.repeats, desc="runs")

    kernels = "plain" if args.plain else "prepacked"
    if args.prepack_where_faster:
        kernels = "prepacked where faster, per thread count"
    print(
        f"\nverifier {args.verifier} ({args.dtype}, {kernels}), drafter "
        f"{args.drafter_dtype}, "
        f"k={args.num_draft_tokens}, batch 1, {len(sources)} sentences\n"
    )
    print("| threads | greedy (s) | speculative (s) | speculative / greedy |")
    print("|---|---|---|---|")
    for threads in args.threads:
        greedy, spec = totals[("greedy", threads)], totals[("speculative", threads)]
        ratio = with_range(paired_speedups(greedy, spec), 2, suffix="×")
        print(f"| {threads} | {with_range(greedy)} | {with_range(spec)} | {ratio} |")


if __name__ == "__main__":
    main()
