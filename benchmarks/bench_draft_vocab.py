"""Reduced-vocabulary drafter heads (FR-Spec, Zhao et al. 2025, arXiv 2502.14856): Tok. and speed per head size.

A drafter trained with `draft_vocab_size` N keeps its head rows in order of target-token frequency
(`specdec_hf.training.frequent_token_ids`), so its first n < N rows are the head a drafter trained with n would
have chosen. This takes such a drafter, cuts its head to each `--sizes` n, and measures on random validation rows,
batch 1, β = 1 (identical output checked): Tok., the drafter's share of the time, and the speed-up over greedy
`generate()`, all strategies timed interleaved in one process (rotating order, median of `--repeats` with range).
Pick the size by the speed-up, the product of Tok. and the call's cost.

    python benchmarks/bench_draft_vocab.py --drafter runs/drafter_debian_en_de_eagle --sizes 1024 2048 4096 \
        --data data/debian_en_de/validation.jsonl --limit 60 --threads 2
"""

from __future__ import annotations

import argparse
import copy

import torch
from _common import print_header, read_sources, with_range
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from specdec_hf import SpecDrafterModel, speculative_generate
from specdec_hf.evaluation.interleaved import paired_speedups, time_interleaved


def cut_head(drafter: SpecDrafterModel, size: int) -> SpecDrafterModel:
    """A copy of `drafter` whose head keeps its first `size` rows (its `size` most frequent ids)."""
    if drafter.draft_vocab_ids is None or size > drafter.config.draft_vocab_size:
        raise ValueError(
            f"--sizes must not exceed the drafter's draft_vocab_size ({drafter.config.draft_vocab_size})."
        )
    cut = copy.deepcopy(drafter)
    cut.config.draft_vocab_size = size
    cut.lm_head.weight = torch.nn.Parameter(drafter.lm_head.weight[:size].clone())
    cut.final_logits_bias = drafter.final_logits_bias[:, :size].clone()
    cut.draft_vocab_ids = drafter.draft_vocab_ids[:size].clone()
    return cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--data", default="data/debian_en_de/validation.jsonl")
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_draft_tokens", type=int, default=8)
    parser.add_argument("--threshold", type=float, default=None, help="draft_confidence_threshold")
    parser.add_argument("--drafter_dtype", default="bfloat16")
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)
    print(f"batch 1, {args.limit} validation rows, k = {args.num_draft_tokens}, drafter {args.drafter_dtype}")

    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    drafter = SpecDrafterModel.from_pretrained(args.drafter, dtype=torch.float32).eval()
    variants = {f"head {size}": cut_head(drafter, size).to(getattr(torch, args.drafter_dtype)) for size in args.sizes}
    inputs = read_sources(args.data, tokenizer, args.limit, seed=args.seed)
    plain = dict(do_sample=False, num_beams=1, max_new_tokens=args.max_new_tokens)
    speculative = dict(custom_generate=speculative_generate, num_draft_tokens=args.num_draft_tokens)
    if args.threshold is not None:
        speculative["draft_confidence_threshold"] = args.threshold

    with torch.inference_mode():
        greedy = [verifier.generate(**batch, **plain) for batch in inputs]
        tok = {}
        for name, variant in variants.items():
            outputs = [
                verifier.generate(**batch, **plain, **speculative, drafter=variant, return_dict_in_generate=True)
                for batch in inputs
            ]
            assert all(torch.equal(o.sequences, g) for o, g in zip(outputs, greedy, strict=True)), name
            generated = sum(sum(o.speculative_stats.generated_tokens) for o in outputs)
            tok[name] = generated / sum(sum(o.speculative_stats.iterations) for o in outputs)
        runners = {"greedy": lambda g: verifier.generate(**inputs[g], **plain)}
        for name, variant in variants.items():
            runners[name] = lambda g, v=variant: verifier.generate(**inputs[g], **plain, **speculative, drafter=v)
        totals = time_interleaved(runners, len(inputs), args.repeats, torch.device("cpu"), disable_tqdm=True)

    print("| head size | Tok. | time (s) | speed-up vs greedy |")
    print("|---|---|---|---|")
    for name in runners:
        speedups = paired_speedups(totals["greedy"], totals[name])
        print(
            f"| {name} | {tok.get(name, 1.0):.2f} | {with_range(totals[name], 2)} | {with_range(speedups, 2, suffix='×')} |"
        )


if __name__ == "__main__":
    main()
