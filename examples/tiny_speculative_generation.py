"""Speculative decoding end to end on a tiny verifier, offline, in seconds on a CPU.

1. Build a tiny random BART verifier (a stand-in for a pretrained model; no download).
2. Distil: run the verifier greedily on random sources; these outputs are the drafter's training targets.
3. Build a Spec-Drafter with `SpecDrafterModel.from_verifier` and train it briefly on those targets.
4. Save it and load it back through `AutoModel` (the same code path as a drafter on the Hub).
5. Generate on held-out sources with `model.generate(..., drafter=drafter)`: print the output, the decoding
   statistics and the agreement with plain greedy `generate()`.

    python examples/tiny_speculative_generation.py
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from transformers import AutoModel, BartConfig, BartForConditionalGeneration

import specdec_hf  # noqa: F401  (registers the drafter with AutoModel)
from specdec_hf import SpecDrafterModel, enable_speculative_decoding
from specdec_hf.training import distill_greedy_outputs, fit_drafter_in_memory


def build_tiny_verifier(seed: int) -> BartForConditionalGeneration:
    """A random 2+2-layer BART with a 500-token vocabulary, standing in for a pretrained verifier."""
    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=500,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=128,
        init_std=0.2,
        forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_draft_tokens", type=int, default=6)
    parser.add_argument("--train_steps", type=int, default=300)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models: thread hand-offs cost more than they save

    verifier = build_tiny_verifier(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    sources = torch.randint(4, 500, (264, 12), generator=generator)
    mask = torch.ones_like(sources)
    start = time.perf_counter()
    targets, lengths = distill_greedy_outputs(verifier, sources, mask, max_new_tokens=args.max_new_tokens)
    print(f"distilled {len(sources)} verifier outputs in {time.perf_counter() - start:.1f} s")

    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=args.num_draft_tokens, decoder_layers=1, prefix_attention="causal"
    )
    start = time.perf_counter()
    losses = fit_drafter_in_memory(
        drafter, sources[:256], mask[:256], targets[:256], lengths[:256], steps=args.train_steps
    )
    print(
        f"trained the drafter for {args.train_steps} steps in {time.perf_counter() - start:.1f} s "
        f"(loss {losses[0]:.2f} -> {sum(losses[-20:]) / 20:.2f})"
    )

    with tempfile.TemporaryDirectory() as directory:
        drafter.save_pretrained(directory)
        drafter = AutoModel.from_pretrained(directory).eval()
    print(f"saved and reloaded the drafter through AutoModel: {type(drafter).__name__}")

    held_out = {"input_ids": sources[256:], "attention_mask": mask[256:]}
    enable_speculative_decoding(verifier)
    start = time.perf_counter()
    greedy = verifier.generate(**held_out, do_sample=False, max_new_tokens=args.max_new_tokens)
    greedy_time = time.perf_counter() - start
    start = time.perf_counter()
    output = verifier.generate(
        **held_out, drafter=drafter, max_new_tokens=args.max_new_tokens, return_dict_in_generate=True
    )
    speculative_time = time.perf_counter() - start

    stats = output.speculative_stats
    identical = (output.sequences == greedy).all(dim=1)
    print("\nfirst output (token ids):", output.sequences[0].tolist())
    print(f"rows identical to greedy: {int(identical.sum())}/{len(identical)}")
    print(f"verifier forward passes: {stats.verifier_calls} (greedy would take {greedy.shape[1] - 1})")
    print(
        f"tokens per iteration (Tok.): {stats.tokens_per_iteration:.2f}, per row: "
        f"{[round(t, 2) for t in stats.tokens_per_iteration_per_row]}"
    )
    print(
        f"drafts accepted: {sum(stats.accepted_tokens)}/{sum(stats.verified_tokens)} "
        f"({100 * stats.acceptance_rate:.0f}%), by draft position: {stats.accepted_at_position}"
    )
    print(f"wall time, batch {len(identical)}: greedy {greedy_time:.3f} s, speculative {speculative_time:.3f} s")
    if not bool(identical.all()):
        raise SystemExit("speculative output differs from greedy")


if __name__ == "__main__":
    main()
