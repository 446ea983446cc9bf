"""Greedy iterations settled on the host against the same iterations settled on tensors, interleaved in one process.

On the CPU the loop settles a greedy iteration's acceptance, stop and commit in Python from one read
(`specdec_hf.generation.host_outcome`); an accelerator runs the tensor path (`_settle_on_device`). This script runs
greedy `generate()` and β=1 with each of the two paths (the tensor path forced with `settling_on_tensors`) on the same sentences, in a rotating order per repeat, checks
every pass's outputs against greedy's and that the host leg settled on the host. The speed-ups are the medians of the
per-repeat ratios (min–max).

    python -m lab.compare_settling --num_draft_tokens 2 --limit 60 --repeats 9
    python -m lab.compare_settling --num_draft_tokens 0 --limit 60 --repeats 9   # 0: "auto"
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from transformers import AutoTokenizer

import specdec_hf.generation.speculative_loop as loop_module
from benchmarks._common import add_demo_pair_arguments, load_demo_pair, print_header, read_sources
from specdec_hf import speculative_generate
from specdec_hf.evaluation.interleaved import interleave, paired_speedups
from specdec_hf.generation.host_outcome import settling_on_tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=60, num_draft_tokens=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)
    verifier, drafter = load_demo_pair(args, prepack=True)
    sources = read_sources(args.data, AutoTokenizer.from_pretrained(args.verifier), args.limit)
    num_draft_tokens = args.num_draft_tokens or "auto"
    greedy = dict(do_sample=False, num_beams=1, max_new_tokens=args.max_new_tokens)
    speculative = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=num_draft_tokens)
    settle = loop_module.settle_on_host
    settled = []

    def counting_settle(*args, **kwargs):
        settled.append(1)
        return settle(*args, **kwargs)

    reference = {}

    def run(name: str) -> float:
        extra = {} if name == "greedy" else speculative
        settled.clear()
        path = settling_on_tensors() if name == "tensors" else contextlib.nullcontext()
        start = time.perf_counter()
        with path, torch.inference_mode():
            outputs = [verifier.generate(**source, **greedy, **extra) for source in sources]
        seconds = time.perf_counter() - start
        if name == "greedy":
            reference.setdefault("outputs", outputs)
        else:
            same = sum(torch.equal(a, b) for a, b in zip(outputs, reference["outputs"], strict=True))
            if same != len(sources):
                raise SystemExit(f"{name}: {same}/{len(sources)} outputs equal to greedy's")
            if (name == "host") != bool(settled):
                raise SystemExit(f"{name}: {len(settled)} iterations settled on the host")
        return seconds

    measures = {name: (lambda group, n=name: run(n)) for name in ("greedy", "tensors", "host")}
    loop_module.settle_on_host = counting_settle  # counts the host leg's iterations
    try:
        interleave(measures, num_groups=1, repeats=1, desc="warm-up", disable_tqdm=True)
        totals = interleave(measures, num_groups=1, repeats=args.repeats, desc="runs", disable_tqdm=True)
    finally:
        loop_module.settle_on_host = settle
    print(f"\n{len(sources)} sentences, k={num_draft_tokens}, {args.threads} threads, every output equal to greedy's")
    print(f"greedy {statistics.median(totals['greedy']):.3f} s a pass (median)")
    for name in ("tensors", "host"):
        ratios = paired_speedups(totals["greedy"], totals[name])
        print(f"β=1 settled on {name}: {statistics.median(ratios):.3f}× ({min(ratios):.3f}–{max(ratios):.3f}) greedy")
    ratios = paired_speedups(totals["tensors"], totals["host"])
    print(f"host against tensors: {statistics.median(ratios):.3f}× ({min(ratios):.3f}–{max(ratios):.3f})")


if __name__ == "__main__":
    main()
