"""Greedy `generate()` vs speculative β=1 with an always-right drafter: speed-up and the loop's own overhead.

The drafter proposes the verifier's own greedy continuation (looked up, costing almost nothing), so this isolates
what the decoding loop and the k-token verification cost against plain greedy decoding. Greedy and speculative
runs alternate in one process (rotating order), and the speed-up is the median of the per-run ratios. Not a test: it
prints figures (median and min–max of --repeats runs) for docs/RESULTS.md.

    python -m lab.bench_loop_overhead --repeats 7
"""

from __future__ import annotations

import argparse
import statistics

import torch
from transformers import BartConfig, BartForConditionalGeneration

from benchmarks._common import TimedCall, print_header, with_range
from specdec_hf import speculative_generate
from specdec_hf.evaluation import ModuleTimer
from specdec_hf.evaluation.interleaved import paired_speedups, time_interleaved
from specdec_hf.testing import OracleDrafter

CPU = torch.device("cpu")

SHAPES = {
    # d=256, 3+3 layers, 8k vocabulary: the size of the offline demo verifier
    "tiny": dict(
        vocab_size=8000,
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
    ),
    "bart-base": dict(
        vocab_size=50265,
        d_model=768,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=12,
        decoder_attention_heads=12,
        encoder_ffn_dim=3072,
        decoder_ffn_dim=3072,
    ),
}


def build(shape: str) -> BartForConditionalGeneration:
    """A random BART verifier of `shape` that never stops early (no EOS), so every run emits the same length."""
    torch.manual_seed(0)
    config = BartConfig(**SHAPES[shape], max_position_embeddings=1024, forced_eos_token_id=None, init_std=0.05)
    model = BartForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.forced_eos_token_id = None
    return model


def bench(shape: str, num_draft_tokens: int, new_tokens: int, repeats: int) -> dict:
    """Greedy and speculative `generate()` on one source, `repeats` runs each, interleaved; per-run figures."""
    model = build(shape)
    inputs = {"input_ids": torch.randint(4, 1000, (1, 24))}
    greedy_kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=None)
    reference = model.generate(**inputs, **greedy_kwargs)
    drafter = OracleDrafter(reference, model.config.vocab_size, num_draft_tokens, "right")
    drafter.propose = TimedCall(drafter.propose)
    loop = TimedCall(speculative_generate)
    timer = ModuleTimer([model], CPU)  # the verifier's forwards: generate() calls its encoder on its own
    loop_shares, tokens_per_iteration = [], []

    def greedy(group: int) -> None:
        model.generate(**inputs, **greedy_kwargs)

    def speculative(group: int) -> None:
        timer.total_s, loop.total, drafter.propose.total = 0.0, 0.0, 0.0
        out = model.generate(
            **inputs, **greedy_kwargs, custom_generate=loop, drafter=drafter, return_dict_in_generate=True
        )
        # the loop's own work: its wall time minus the verifier's decoder forwards and the drafter's calls
        loop_shares.append((loop.total - timer.total_s - drafter.propose.total) / loop.total)
        tokens_per_iteration.append(out.speculative_stats.tokens_per_iteration)
        assert torch.equal(out.sequences, reference), "speculative output differs from greedy"

    runners = {"greedy": greedy, "speculative": speculative}
    with timer:
        time_interleaved(runners, num_groups=1, repeats=1, device=CPU, desc="warm-up")
        loop_shares.clear()
        times = time_interleaved(
            runners, num_groups=1, repeats=repeats, device=CPU, desc=f"{shape} k={num_draft_tokens}"
        )
    return {
        "shape": shape,
        "k": num_draft_tokens,
        "new_tokens": reference.shape[1] - 1,
        "greedy_s": times["greedy"],
        "speculative_s": times["speculative"],
        "speed_ups": paired_speedups(times["greedy"], times["speculative"]),
        "tokens_per_iteration": statistics.median(tokens_per_iteration),
        "loop_overhead_shares": loop_shares,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--num_draft_tokens", type=int, default=10)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print_header(args.repeats)
    print("| verifier | k | tokens | greedy (s) | speculative (s) | speed-up | Tok. | loop's own share of its time |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        r = bench(shape, args.num_draft_tokens, args.new_tokens, args.repeats)
        print(
            f"| {r['shape']} | {r['k']} | {r['new_tokens']} | {with_range(r['greedy_s'])} | "
            f"{with_range(r['speculative_s'])} | {with_range(r['speed_ups'], 2, suffix='x')} | "
            f"{r['tokens_per_iteration']:.2f} | {with_range(r['loop_overhead_shares'], 1, 100, '%')} |"
        )


if __name__ == "__main__":
    main()
