"""What `prepack_linear_layers` buys on CPU: single linear layers, then greedy and speculative decoding, both ways.

First tables, one per dtype: one linear layer of the demo pair's shapes (the verifier's 256 -> 256 attention,
256 -> 1024 and 1024 -> 256 feed-forward, 256 -> 8,000 LM head; the drafter's 768 -> 256 state projection and
256 -> 4,096 head) over 1, 2, 5 and 9 rows (a greedy step, a verification of k = 1, 4, 8), as `nn.Linear` and
prepacked, median of interleaved rounds, each layer alone (its weight warm in the caches, unlike inside a decoding).
Then greedy `generate()` and speculative β=1 on the held-out sentences, with the plain models, with every linear layer of
both models prepacked, and with both prepacked where measured faster (`prepack_where_faster`; separate instances of
the same checkpoints), the six runs interleaved per sentence in a rotating order; each speed-up is taken within a
repeat; identical outputs are counted. The table after it sets every run against plain greedy, the baseline a user
without this module has.

    python -m lab.bench_prepacked_linear --dtype float32 --threads 2
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
from torch import nn
from transformers import AutoTokenizer

from benchmarks._common import (
    GREEDY_KWARGS,
    add_demo_pair_arguments,
    load_demo_pair,
    print_header,
    read_sources,
    with_range,
)
from specdec_hf import PrepackedLinear, prepack_where_faster, speculative_generate
from specdec_hf.evaluation.interleaved import interleave, paired_speedups, rotation

VARIANTS = ("plain", "prepacked", "where faster")
SHAPES = ((256, 256), (256, 1024), (1024, 256), (256, 8000), (768, 256), (256, 4096))
ROWS = (1, 2, 5, 9)


def layer_table(dtype: torch.dtype, rounds: int, calls: int) -> None:
    """Microseconds per call of `nn.Linear` and its `PrepackedLinear`, interleaved per round."""
    print(f"\n| {str(dtype).removeprefix('torch.')} layer | " + " | ".join(f"{r} row(s)" for r in ROWS) + " |")
    print("|---|" + "---|" * len(ROWS))
    for in_features, out_features in SHAPES:
        torch.manual_seed(0)
        plain = nn.Linear(in_features, out_features).to(dtype)
        packed = PrepackedLinear.from_linear(plain)
        cells = []
        for rows in ROWS:
            inputs = torch.randn(1, rows, in_features).to(dtype)
            samples = {"plain": [], "prepacked": []}
            with torch.no_grad():
                for layer in (plain, packed):  # warm-up (and the packing itself)
                    for _ in range(calls):
                        layer(inputs)
                for round_index in range(rounds):
                    for name in rotation(list(samples), round_index):
                        layer = plain if name == "plain" else packed
                        start = time.perf_counter()
                        for _ in range(calls):
                            layer(inputs)
                        samples[name].append((time.perf_counter() - start) / calls)
            plain_us, packed_us = (statistics.median(samples[name]) * 1e6 for name in ("plain", "prepacked"))
            cells.append(f"{plain_us:.0f} → {packed_us:.0f} µs")
        print(f"| {in_features} → {out_features} | " + " | ".join(cells) + " |")


def decoding_table(args) -> None:
    """Greedy and speculative β=1, plain and prepacked, interleaved per sentence."""
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    sources = read_sources(args.data, tokenizer, args.limit)
    models = {variant: load_demo_pair(args, prepack=variant == "prepacked") for variant in VARIANTS}
    # the kernel per signature and row count as measured now, after the thread count is set
    verifier, drafter = models["where faster"]
    choices = {"verifier": prepack_where_faster(verifier)}
    choices["drafter"] = prepack_where_faster(drafter, runs_after=verifier)
    outputs: dict[str, dict[int, torch.Tensor]] = {}

    def run(name: str, group: int) -> float:
        variant, strategy = name.rsplit(" ", 1)
        verifier, drafter = models[variant]
        extra = {}
        if strategy == "speculative":
            extra = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=args.num_draft_tokens)
        start = time.perf_counter()
        output = verifier.generate(**sources[group], **GREEDY_KWARGS, **extra)
        elapsed = time.perf_counter() - start
        outputs.setdefault(name, {})[group] = output
        return elapsed

    names = [f"{variant} {strategy}" for variant in VARIANTS for strategy in ("greedy", "speculative")]
    measures = {name: functools.partial(run, name) for name in names}
    with torch.no_grad():
        interleave(measures, num_groups=min(3, len(sources)), repeats=1, desc="warm-up")
        totals = interleave(measures, num_groups=len(sources), repeats=args.repeats, desc="sentences")

    def identical(a: str, b: str) -> int:
        return sum(torch.equal(outputs[a][g], outputs[b][g]) for g in range(len(sources)))

    print(
        f"\nverifier {args.verifier} ({args.dtype}), drafter {args.drafter} ({args.drafter_dtype}), k={args.num_draft_tokens}, "
        f"batch 1, {len(sources)} sentences"
    )
    print("\n| models | greedy (s) | speculative (s) | speculative / greedy of the same models | = greedy |")
    print("|---|---|---|---|---|")
    for variant in VARIANTS:
        greedy, spec = totals[f"{variant} greedy"], totals[f"{variant} speculative"]
        same = identical(f"{variant} greedy", f"{variant} speculative")
        print(
            f"| {variant} | {with_range(greedy)} | {with_range(spec)} | "
            f"{with_range(paired_speedups(greedy, spec), 2, suffix='×')} | {same}/{len(sources)} |"
        )
    print("\n| models | greedy against plain greedy | speculative against plain greedy | greedy = plain greedy |")
    print("|---|---|---|---|")
    for variant in VARIANTS:
        greedy = paired_speedups(totals["plain greedy"], totals[f"{variant} greedy"])
        spec = paired_speedups(totals["plain greedy"], totals[f"{variant} speculative"])
        same = identical("plain greedy", f"{variant} greedy")
        print(
            f"| {variant} | {with_range(greedy, 2, suffix='×')} | {with_range(spec, 2, suffix='×')} | {same}/{len(sources)} |"
        )
    for role, role_choices in choices.items():
        print(f"\nwhere faster, {role}: " + "; ".join(choice.describe() for choice in role_choices))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=60, num_draft_tokens=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=9, help="Interleaved rounds of the layer table.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--skip_layers", action="store_true", help="Only the decoding table.")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print_header(args.repeats)
    if not args.skip_layers:
        for layer_dtype in (torch.float32, torch.bfloat16):
            layer_table(layer_dtype, args.rounds, calls=100)
    decoding_table(args)


if __name__ == "__main__":
    main()
