"""What a drafter call and a k-token verification cost on this machine, per drafter design and k.

The cost side of tuning the demo pair (issue: choose k, the drafter's depth/width/prefix attention and whether it
shares the verifier's encoder, by measurement). Costs do not depend on training, so every variant is built untrained
with `SpecDrafterModel.from_verifier` on the shipped demo verifier; the accuracy side is Tok., measured with
`evaluate.py --config configs/eval/demo_en_de_tuning.yaml`. All times are medians, in units of one greedy step
(the verifier's 1-token cached decoder forward), and the last column is the bound on the speed-up at β=1:
`Tok. x step / (verify(k) + drafter(k))` for the given --tok.

    python benchmarks/bench_drafter_cost.py --threads 1 --tok 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DynamicCache, EncoderDecoderCache

from specdec_hf import SpecDrafterModel

SOURCE = "What worries me most is not that he said it, but that he is convinced there is nothing wrong in saying it."
VARIANTS = {
    "2 causal layers, verifier's encoder (shipped)": dict(decoder_layers=2, use_verifier_encoder=True),
    "1 causal layer, verifier's encoder": dict(decoder_layers=1, use_verifier_encoder=True),
    "3 causal layers, verifier's encoder": dict(decoder_layers=3, use_verifier_encoder=True),
    "2 bidirectional layers, verifier's encoder": dict(
        decoder_layers=2, use_verifier_encoder=True, prefix_attention="bidirectional"
    ),
    "2 causal layers, own 2-layer encoder": dict(decoder_layers=2, encoder_layers=2),
    "2 causal layers, width 128, verifier's encoder": dict(
        decoder_layers=2, use_verifier_encoder=True, d_model=128, decoder_ffn_dim=512
    ),
}


def median_ms(function, repeats: int) -> float:
    """Median wall time of `function()` in milliseconds, after two untimed calls."""
    function(), function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


@torch.no_grad()
def verifier_costs(verifier, encoder_outputs, attention_mask, prefix_length: int, ks, repeats: int) -> dict:
    """Median time of a cached decoder forward over 1 token (the greedy step) and over k + 1 tokens (verification)."""
    prefix = torch.randint(5, verifier.config.vocab_size, (1, prefix_length))

    def forward(num_tokens: int):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        kwargs = dict(encoder_outputs=encoder_outputs, attention_mask=attention_mask, cache=cache, use_cache=True)
        verifier(decoder_input_ids=prefix, **kwargs)
        start = time.perf_counter()
        verifier(decoder_input_ids=prefix[:, :num_tokens], **kwargs)
        return time.perf_counter() - start

    def median_forward(num_tokens: int) -> float:
        return 1e3 * statistics.median(forward(num_tokens) for _ in range(repeats))

    return {"step": median_forward(1), **{k: median_forward(k + 1) for k in ks}}


@torch.no_grad()
def drafter_cost(drafter, inputs, encoder_states, k: int, repeats: int, tokens_per_call: int) -> float:
    """Median time of one `propose` call while the prefix grows by `tokens_per_call` tokens per call."""
    prefix = torch.randint(5, drafter.vocab_size, (1, 128))

    def one_generation() -> list[float]:
        state = drafter.init_drafting_state(inputs["input_ids"], inputs["attention_mask"], encoder_states)
        times = []
        for length in range(1, 40, tokens_per_call):
            start = time.perf_counter()
            state = drafter.propose(state, prefix[:, :length], torch.tensor([length]), k).state
            times.append(time.perf_counter() - start)
        return times

    one_generation()
    return 1e3 * statistics.median(t for _ in range(repeats) for t in one_generation())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8, 10])
    parser.add_argument("--drafter_dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--tok", type=float, default=3.0, help="Tok. assumed for the speed-up bound.")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=torch.float32).eval()
    inputs = AutoTokenizer.from_pretrained(args.verifier)(SOURCE, return_tensors="pt")
    with torch.no_grad():
        encoder_outputs = verifier.get_encoder()(**inputs)
    costs = verifier_costs(verifier, encoder_outputs, inputs["attention_mask"], 20, args.ks, args.repeats)
    step = costs["step"]
    print(
        f"verifier {args.verifier} (float32), {args.threads} thread(s), batch 1, median of {args.repeats}: "
        f"greedy step {step:.2f} ms; drafter {args.drafter_dtype}; bound at Tok. {args.tok}"
    )
    print("\n| drafter | k | drafter call (steps) | verify k (steps) | bound on speed-up |")
    print("|---|---|---|---|---|")
    dtype = getattr(torch, args.drafter_dtype)
    for name, overrides in VARIANTS.items():
        drafter = SpecDrafterModel.from_verifier(verifier, block_size=max(args.ks), **overrides).to(dtype).eval()
        for k in args.ks:
            draft = drafter_cost(drafter, inputs, encoder_outputs[0], k, max(3, args.repeats // 10), 2)
            bound = args.tok * step / (costs[k] + draft)
            print(f"| {name} | {k} | {draft / step:.2f} | {costs[k] / step:.2f} | {bound:.2f}× |")


if __name__ == "__main__":
    main()
