"""What a drafter call and a k-token verification cost on this machine, per drafter design and k.

The cost side of tuning the demo pair (issue: choose k, the drafter's depth/width/prefix attention and whether it
shares the verifier's encoder, by measurement). Costs do not depend on training, so every variant is built untrained
with `SpecDrafterModel.from_verifier` on the shipped demo verifier; the accuracy side is Tok., measured with
`evaluate.py --config configs/eval/demo_en_de_tuning.yaml`. Every measurement (the greedy step, each k-token
verification, each drafter call) runs once per round, all interleaved in a rotating order, so that the ratios of a
round share the machine's speed of that moment. All costs are in units of one greedy step (the verifier's 1-token
cached decoder forward) of the same round, and the last column is the bound on the speed-up at β=1:
`Tok. x step / (verify(k) + drafter(k))` for the given --tok; each figure is the median over the rounds (min–max).

    python -m lab.bench_drafter_cost --threads 1 --tok 3
    python -m lab.bench_drafter_cost --dtype bfloat16 --variants 0 --ks 4 8   # the shipped design only
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DynamicCache, EncoderDecoderCache

from benchmarks._common import print_header, with_range
from specdec_hf import SpecDrafterAdapter, SpecDrafterModel, prepack_linear_layers
from specdec_hf.evaluation.interleaved import interleave

SOURCE = "What worries me most is not that he said it, but that he is convinced there is nothing wrong in saying it."
VARIANTS = {
    "1 causal layer, verifier's states of 3 layers, 4,096-row head (shipped)": dict(
        decoder_layers=1,
        use_verifier_encoder=True,
        prefix_attention="causal",
        verifier_state_layers=[1, 2, 3],
        draft_vocab_ids=range(4096),
    ),
    "1 causal layer, verifier's states of 3 layers, full head": dict(
        decoder_layers=1, use_verifier_encoder=True, prefix_attention="causal", verifier_state_layers=[1, 2, 3]
    ),
    "2 causal layers, verifier's encoder (shipped before)": dict(decoder_layers=2, use_verifier_encoder=True),
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


def verifier_forward(verifier, encoder_outputs, attention_mask, prefix, num_tokens: int) -> Callable[[int], float]:
    """A measure: seconds of one cached decoder forward over `num_tokens` tokens once `prefix` is in the cache."""

    def measure(group: int) -> float:
        with torch.no_grad():
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            kwargs = dict(encoder_outputs=encoder_outputs, attention_mask=attention_mask, cache=cache, use_cache=True)
            verifier(decoder_input_ids=prefix, **kwargs)
            start = time.perf_counter()
            verifier(decoder_input_ids=prefix[:, :num_tokens], **kwargs)
            return time.perf_counter() - start

    return measure


def drafter_propose(drafter, inputs, encoder_states, k: int, tokens_per_call: int) -> Callable[[int], float]:
    """A measure: median seconds of one `propose` call over a generation, the prefix growing by `tokens_per_call`."""
    drafter = SpecDrafterAdapter(drafter)
    prefix = torch.randint(5, drafter.vocab_size, (1, 128))
    # a drafter that reads verifier states gets some of the right shape (the cost does not depend on their values)
    layers = drafter.verifier_state_layers
    width = drafter.model.feature_proj.in_features if layers else 0  # the verifier's states, concatenated
    states = torch.randn(1, 128, width) if layers else None

    def measure(group: int) -> float:
        times = []
        with torch.no_grad():
            state = drafter.init_drafting_state(inputs["input_ids"], inputs["attention_mask"], encoder_states)
            for length in range(1, 40, tokens_per_call):
                start = time.perf_counter()
                state = drafter.propose(state, prefix[:, :length], torch.tensor([length]), k, states).state
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8, 10])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="The verifier's.")
    parser.add_argument("--attn_implementation", default=None, help="The verifier's (default: transformers').")
    parser.add_argument("--drafter_dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--variants",
        type=int,
        nargs="+",
        choices=range(len(VARIANTS)),
        default=None,
        help="Indices of the drafter designs to time, in the order of VARIANTS (default: all).",
    )
    parser.add_argument("--tok", type=float, default=3.0, help="Tok. assumed for the speed-up bound.")
    parser.add_argument("--repeats", type=int, default=10, help="Rounds of every measurement, interleaved.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--prepack_linear", action="store_true", help="Verifier and drafters through prepack_linear_layers."
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print_header(args.repeats)

    verifier = AutoModelForSeq2SeqLM.from_pretrained(
        args.verifier, dtype=getattr(torch, args.dtype), attn_implementation=args.attn_implementation
    ).eval()
    if args.prepack_linear:
        prepack_linear_layers(verifier)
    inputs = AutoTokenizer.from_pretrained(args.verifier)(SOURCE, return_tensors="pt")
    with torch.no_grad():
        encoder_outputs = verifier.get_encoder()(**inputs)
    prefix = torch.randint(5, verifier.config.vocab_size, (1, 20))
    forward = dict(verifier=verifier, encoder_outputs=encoder_outputs, attention_mask=inputs["attention_mask"])
    measures = {"step": verifier_forward(**forward, prefix=prefix, num_tokens=1)}
    measures.update({f"verify {k}": verifier_forward(**forward, prefix=prefix, num_tokens=k + 1) for k in args.ks})
    dtype = getattr(torch, args.drafter_dtype)
    variants = {index: name for index, name in enumerate(VARIANTS) if args.variants is None or index in args.variants}
    for index, name in variants.items():
        overrides = VARIANTS[name]
        # "causal" unless a variant says otherwise (the config's default is the paper's bidirectional prefix)
        overrides = {"prefix_attention": "causal", **overrides}
        if "draft_vocab_ids" in overrides:
            overrides["draft_vocab_ids"] = list(overrides["draft_vocab_ids"])
        drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=max(args.ks), **overrides).to(dtype).eval()
        if args.prepack_linear:
            prepack_linear_layers(drafter)
        for k in args.ks:
            measures[f"draft {index} {k}"] = drafter_propose(drafter, inputs, encoder_outputs[0], k, 2)
    interleave(measures, num_groups=1, repeats=2, desc="warm-up")
    costs = interleave(measures, num_groups=1, repeats=args.repeats, desc="rounds")
    step = costs["step"]

    def in_steps(times: list[float]) -> list[float]:
        return [time / step_time for time, step_time in zip(times, step, strict=True)]

    print(
        f"verifier {args.verifier} ({args.dtype}, attention {verifier.config._attn_implementation}"
        f"{', linear layers prepacked' if args.prepack_linear else ''}), batch 1: "
        f"greedy step {with_range(step, 2, 1e3)} ms; "
        f"drafter {args.drafter_dtype}; bound at Tok. {args.tok}"
    )
    print("\n| drafter | k | drafter call (steps) | verify k (steps) | bound on speed-up |")
    print("|---|---|---|---|---|")
    for index, name in variants.items():
        for k in args.ks:
            draft, verify = in_steps(costs[f"draft {index} {k}"]), in_steps(costs[f"verify {k}"])
            # per round: Tok. tokens for one verification and one drafter call, against one token per greedy step
            bound = with_range([args.tok / (v + d) for v, d in zip(verify, draft, strict=True)], 2, suffix="×")
            print(f"| {name} | {k} | {with_range(draft, 2)} | {with_range(verify, 2)} | {bound} |")


if __name__ == "__main__":
    main()
