"""What the prepared causal mask saves a verify forward: the demo verifier fed k + 1 tokens on a cache of C, with the
mask the loop passes (`specdec_hf.generation.verifier_mask.CausalMaskTable`) and with the decoder building its own,
interleaved in a rotating order after one warm-up call of each; the logits are checked equal. A one-token forward (a
greedy step) is timed beside them for scale.

    python -m lab.bench_verify_mask --threads 2
    python -m lab.bench_verify_mask --attn_implementation eager --cache_length 16 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DynamicCache, EncoderDecoderCache

from benchmarks._common import print_header, with_range
from specdec_hf.evaluation.interleaved import rotation
from specdec_hf.generation.verifier_mask import CausalMaskTable

SOURCE = "Click the arrow next to the icon to open the menu of the command line tools."


def main() -> None:
    """Time the forwards and print one row per k."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--num_draft_tokens", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--cache_length", type=int, nargs="+", default=[16, 48], help="Positions cached before.")
    parser.add_argument("--attn_implementation", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50, help="Forwards per variant and round.")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.rounds)

    verifier = AutoModelForSeq2SeqLM.from_pretrained(
        args.verifier, dtype=torch.float32, attn_implementation=args.attn_implementation
    ).eval()
    source = AutoTokenizer.from_pretrained(args.verifier)(SOURCE, return_tensors="pt")
    print(f"\n{args.verifier} (float32, attention {args.attn_implementation}), batch 1; ms per forward\n")
    print("| cache | tokens fed | decoder builds the mask | prepared mask | saved | one token (a greedy step) |")
    print("|---|---|---|---|---|---|")
    with torch.inference_mode():
        encoder_outputs = verifier.get_encoder()(**source)
        for cache_length in args.cache_length:
            for k in args.num_draft_tokens:
                print(time_forwards(verifier, encoder_outputs, cache_length, k + 1, args))


def time_forwards(verifier, encoder_outputs, cache_length: int, num_fed: int, args: argparse.Namespace) -> str:
    """One table row: `num_fed` tokens on a cache of `cache_length`, mask built and prepared, and one token."""
    table = CausalMaskTable(verifier)
    if not table.supported:
        raise SystemExit(
            f"--verifier {args.verifier}: its family or attention takes no prepared mask; nothing to time"
        )
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 4000, (1, cache_length + num_fed), generator=generator)
    tokens[:, 0] = verifier.config.decoder_start_token_id
    cache = EncoderDecoderCache(DynamicCache(config=verifier.config), DynamicCache(config=verifier.config))
    kwargs = dict(encoder_outputs=encoder_outputs, cache=cache, use_cache=True)
    verifier(decoder_input_ids=tokens[:, :cache_length], **kwargs)

    def forward(fed: int, prepared: bool) -> tuple[float, torch.Tensor]:
        start = time.perf_counter()
        mask = table.mask(1, cache_length, fed, tokens.device) if prepared else None
        logits = verifier(
            decoder_input_ids=tokens[:, cache_length : cache_length + fed], **kwargs, decoder_attention_mask=mask
        ).logits
        elapsed = time.perf_counter() - start
        cache.crop(-fed)
        return elapsed, logits

    variants = {"built": (num_fed, False), "prepared": (num_fed, True), "one": (1, False)}
    if not torch.equal(forward(num_fed, False)[1], forward(num_fed, True)[1]):
        raise RuntimeError("the prepared mask changed the logits")
    forward(1, False)  # with the two above, one warm-up call of each variant
    medians = {name: [] for name in variants}
    for round_index in range(args.rounds):
        for name in rotation(list(variants), round_index):
            medians[name].append(statistics.median(forward(*variants[name])[0] for _ in range(args.calls)))
    saved = [built - prepared for built, prepared in zip(medians["built"], medians["prepared"], strict=True)]
    cells = [with_range(medians[name], 3, 1e3) for name in ("built", "prepared")]
    return (
        f"| {cache_length} | {num_fed} | {cells[0]} | {cells[1]} | {with_range(saved, 3, 1e3)} | "
        f"{with_range(medians['one'], 3, 1e3)} |"
    )


if __name__ == "__main__":
    main()
