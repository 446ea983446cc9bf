"""Speculative sampling vs `generate(do_sample=True)` with a trained drafter: speed-up and Tok. (a benchmark).

Both sample from the same distribution (see tests/generation/test_speculative_sampling.py); this measures what the
drafter buys. Batch 1, the demo pair by default, median of --repeats passes over --limit held-out sentences.

    python benchmarks/bench_sampling.py --model_dir models/demo-en-de --limit 50 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from specdec_hf import SpecDrafterModel, speculative_generate


def sample_all(verifier, sources, seed, **kwargs) -> tuple[float, int, int]:
    """Sample every source alone; returns (seconds, generated tokens, verifier passes)."""
    torch.manual_seed(seed)
    tokens = passes = 0
    start = time.perf_counter()
    for inputs in sources:
        out = verifier.generate(**inputs, return_dict_in_generate=True, **kwargs)
        tokens += out.sequences.shape[1] - 1
        stats = getattr(out, "speculative_stats", None)
        passes += stats.verifier_calls if stats is not None else out.sequences.shape[1] - 1
    return time.perf_counter() - start, tokens, passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", type=Path, default=Path("models/demo-en-de"))
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block_size", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.model_dir / "verifier", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir / "verifier")
    drafter = SpecDrafterModel.from_pretrained(args.model_dir / "drafter", dtype=torch.float32).eval()
    lines = (args.model_dir / "heldout_test.jsonl").read_text(encoding="utf-8").splitlines()[: args.limit]
    sources = [tokenizer(json.loads(line)["translation"]["en"], return_tensors="pt") for line in lines]
    sampling = dict(do_sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    speculative = dict(custom_generate=speculative_generate, drafter=drafter, block_size=args.block_size)

    sample_all(verifier, sources[:5], 0, **sampling)  # warm-up
    sample_all(verifier, sources[:5], 0, **sampling, **speculative)
    plain, spec = [], []
    for repeat in range(args.repeats):
        plain.append(sample_all(verifier, sources, repeat, **sampling))
        spec.append(sample_all(verifier, sources, repeat, **sampling, **speculative))
    plain_time = statistics.median(t for t, _, _ in plain)
    spec_time = statistics.median(t for t, _, _ in spec)
    tok = sum(n for _, n, _ in spec) / sum(p for _, _, p in spec)
    print(
        f"torch {torch.__version__}, threads {args.threads}, {len(sources)} sentences, batch 1, "
        f"median of {args.repeats}; sampling {sampling}"
    )
    print("| decoding | time (s) | speed-up | Tok. |")
    print("|---|---|---|---|")
    print(f"| generate(do_sample=True) | {plain_time:.2f} | 1.00x | 1.00 |")
    print(f"| speculative sampling | {spec_time:.2f} | {plain_time / spec_time:.2f}x | {tok:.2f} |")


if __name__ == "__main__":
    main()
