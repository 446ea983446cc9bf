"""Greedy and β=1 on a demo pair with each layer's kernel chosen alone against the whole-model check, interleaved.

`prepack_where_faster` first chooses a kernel per layer signature, each layer timed alone, warm; then it checks the
model as a whole (the verifier's own decoding steps, the drafter's layers right after the verifier's) with every
layer that can take it on FBGEMM's float16 kernel. This loads the pair twice: once with the per-layer choice only
(the whole-model check told that the float16 assignment never pays) and once as `prepack_where_faster` chooses now,
prints both choices, and runs greedy and β=1 at each k on both copies, every sentence through every setting in a
rotating order, so that drift hits all alike. Speed-ups are per repeat against greedy on the per-layer kernels and
against greedy on the same copy.

    python -m lab.compare_kernel_choices --verifier models/demo-en-de/verifier --drafter models/demo-en-de/drafter \
        --data models/demo-en-de/heldout_test.jsonl --limit 100 --repeats 3 --threads 2 --ks 2 auto
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from benchmarks._common import print_header, read_sources, with_range
from specdec_hf import SpecDrafterModel, prepack_where_faster, speculative_generate


def per_layer_only(layers, rows, assignments) -> list[float]:
    """A whole-model measurement under which the float16 assignment never pays: the per-layer choice stays."""
    return [1.0, 2.0]


def load_pair(args, whole_model: bool):
    """The verifier and drafter in float32, their kernels chosen with or without the whole-model check."""
    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=torch.float32).eval()
    verifier.generation_config.max_length = None
    drafter = SpecDrafterModel.from_pretrained(args.drafter, dtype=torch.float32).eval()
    sweeps = None if whole_model else per_layer_only
    for role, model, partner in (("verifier", verifier, None), ("drafter", drafter, verifier)):
        choices = prepack_where_faster(model, measure_sweeps=sweeps, runs_after=partner)
        label = "whole model" if whole_model else "per layer"
        print(f"{label}, {role}: " + "; ".join(choice.describe() for choice in choices))
    return verifier, drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--drafter", default="models/demo-en-de/drafter")
    parser.add_argument("--data", default="models/demo-en-de/heldout_test.jsonl")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--ks", nargs="*", default=["2", "auto"], help="β=1 settings of k (integers or auto)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)
    pairs = {"per layer": load_pair(args, whole_model=False), "whole model": load_pair(args, whole_model=True)}
    sources = read_sources(args.data, AutoTokenizer.from_pretrained(args.verifier), args.limit)
    greedy = dict(do_sample=False, num_beams=1, max_new_tokens=args.max_new_tokens)
    runs = {}
    for label, (verifier, drafter) in pairs.items():
        runs[f"greedy, {label}"] = (verifier, greedy)
        for k in args.ks:
            extra = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=k)
            if k != "auto":
                extra["num_draft_tokens"] = int(k)
            runs[f"k={k}, {label}"] = (verifier, {**greedy, **extra})
    names = list(runs)
    totals = {name: [] for name in names}
    outputs: dict[str, list] = {name: [None] * len(sources) for name in names}
    with torch.inference_mode():
        for name in names:  # warm-up
            verifier, kwargs = runs[name]
            for source in sources[:3]:
                verifier.generate(**source, **kwargs)
        for repeat in range(args.repeats):
            seconds = dict.fromkeys(names, 0.0)
            for index, source in enumerate(sources):
                shift = (index + repeat) % len(names)
                for name in names[shift:] + names[:shift]:
                    verifier, kwargs = runs[name]
                    start = time.perf_counter()
                    outputs[name][index] = verifier.generate(**source, **kwargs)
                    seconds[name] += time.perf_counter() - start
            for name in names:
                totals[name].append(seconds[name])
    print("\n| setting | time (s) | × greedy, per layer | × greedy on the same kernels | = greedy |")
    print("|---|---|---|---|---|")
    for name in names:
        label = name.split(", ", 1)[1]
        own = totals[f"greedy, {label}"]
        against_base = [g / t for g, t in zip(totals["greedy, per layer"], totals[name], strict=True)]
        against_own = [g / t for g, t in zip(own, totals[name], strict=True)]
        same = sum(torch.equal(a, b) for a, b in zip(outputs[name], outputs[f"greedy, {label}"], strict=True))
        print(
            f"| {name} | {statistics.median(totals[name]):.2f} | {with_range(against_base, 3)} | "
            f"{with_range(against_own, 3)} | {same}/{len(sources)} |"
        )


if __name__ == "__main__":
    main()
