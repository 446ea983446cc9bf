"""Speculative sampling vs `generate(do_sample=True)` with a trained drafter: speed-up and Tok. (a benchmark).

Both sample from the same distribution (see tests/generation/test_speculative_sampling.py); this measures what the
drafter buys. Batch 1, the demo pair by default, --repeats passes over --limit held-out sentences: each sentence is
sampled both ways back to back (rotating order, the same seed each pass), and the speed-up is the median over passes
of the ratio of the two totals of a pass, with its min–max.

    python -m lab.bench_sampling --model_dir models/demo-en-de --limit 50 --repeats 3
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from benchmarks._common import print_header, read_sources, with_range
from specdec_hf import SpecDrafterModel, speculative_generate
from specdec_hf.evaluation.interleaved import paired_speedups, time_interleaved

CPU = torch.device("cpu")


def sampler(verifier, sources: list[dict], counts: dict[str, int], **kwargs) -> Callable[[int], None]:
    """`run(i)`: sample source i alone, seeded with i (every pass draws alike); adds its tokens and verifier passes."""

    def run(group: int) -> None:
        torch.manual_seed(group)
        out = verifier.generate(**sources[group], return_dict_in_generate=True, **kwargs)
        tokens = out.sequences.shape[1] - 1
        stats = getattr(out, "speculative_stats", None)
        counts["tokens"] += tokens
        counts["passes"] += stats.verifier_calls if stats is not None else tokens

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", type=Path, default=Path("models/demo-en-de"))
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num_draft_tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)

    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.model_dir / "verifier", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir / "verifier")
    drafter = SpecDrafterModel.from_pretrained(args.model_dir / "drafter", dtype=torch.float32).eval()
    sources = read_sources(args.model_dir / "heldout_test.jsonl", tokenizer, args.limit)
    sampling = dict(do_sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    speculative = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=args.num_draft_tokens)

    counts = {name: {"tokens": 0, "passes": 0} for name in ("plain", "speculative")}
    runners = {
        "plain": sampler(verifier, sources, counts["plain"], **sampling),
        "speculative": sampler(verifier, sources, counts["speculative"], **sampling, **speculative),
    }
    time_interleaved(runners, num_groups=min(5, len(sources)), repeats=1, device=CPU, desc="warm-up")
    for count in counts.values():
        count.update(tokens=0, passes=0)
    times = time_interleaved(runners, num_groups=len(sources), repeats=args.repeats, device=CPU, desc="passes")
    speed_ups = paired_speedups(times["plain"], times["speculative"])
    print(f"{len(sources)} sentences, batch 1; sampling {sampling}")
    print("| decoding | time (s) | tokens per pass | speed-up | Tok. |")
    print("|---|---|---|---|---|")
    for name, label in (("plain", "generate(do_sample=True)"), ("speculative", "speculative sampling")):
        count = counts[name]
        speed_up = "1.00x" if name == "plain" else with_range(speed_ups, 2, suffix="x")
        print(
            f"| {label} | {with_range(times[name], 2)} | {count['tokens'] / args.repeats:.0f} | {speed_up} | "
            f"{count['tokens'] / count['passes']:.2f} |"
        )


if __name__ == "__main__":
    main()
