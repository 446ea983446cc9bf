"""What limits the source-copy drafter on the summarization pair: how often its copies are right, what a wider
verification costs, and the loop with and without its drafts against greedy.

1. **Copies against the greedy output**: at every position of each row's greedy output, the continuation the
   source-copy drafter (`SourceCopyDrafter`'s defaults: the longest n-gram of the prefix, 3 down to 1, found in the
   source) proposes, and how many of its tokens the greedy output goes on with; by the size of the n-gram matched.
2. **The verifier's forward by width**: its own decoder forward (LM head included) of w new tokens over a cache of
   16 decoder-start tokens, on a real row's encoder output, w = 1..9, interleaved rounds, on the kernels
   `prepack_where_faster` chose in this process.
3. **Interleaved decoding** (every row through every setting in a rotating order): greedy; the copy at k chosen as
   decoding runs; the copy at a fixed k; and the loop with a drafter that never proposes (every iteration a plain
   verifier step inside the loop: what the loop costs around a greedy step).

    python -m lab.copy_drafting_limits --limit 100 --repeats 3
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DynamicCache, EncoderDecoderCache

from benchmarks._common import print_header, read_sources, with_range
from specdec_hf import SourceCopyDrafter, prepack_where_faster, speculative_generate
from specdec_hf.drafters.source_copy import SourceNgramIndex
from specdec_hf.drafting import Drafter, DraftProposal
from specdec_hf.evaluation.interleaved import interleave, paired_speedups

# the tokens a copy proposes at most (the copy's largest k under "auto")
COPIED = 8


class NoDrafts(Drafter):
    """Proposes nothing for any row (`num_drafts` 0): every iteration of the loop is a plain verifier step."""

    num_draft_tokens = 1
    max_draft_tokens = 1

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states):
        return None

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None) -> DraftProposal:
        rows = prefix_ids.shape[0]
        draft_ids = prefix_ids.new_zeros(rows, num_draft_tokens)
        return DraftProposal(draft_ids, None, state, num_drafts=prefix_ids.new_zeros(rows))

    def select_rows(self, state, rows):
        return state


def copy_accuracy(verifier, sources, max_new_tokens: int, max_ngram_size: int) -> None:
    """Part 1: per size of the longest n-gram matched (up to the drafter's `max_ngram_size`), the positions, the
    first copied token right, the copied tokens right."""
    matched = collections.defaultdict(lambda: [0, 0, 0])
    positions = 0
    for source in sources:
        output = verifier.generate(**source, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens)[0].tolist()
        source_ids = source["input_ids"][0].tolist()
        indexes = {size: SourceNgramIndex(source_ids, size, size) for size in range(1, max_ngram_size + 1)}
        for end in range(1, len(output)):
            positions += 1
            for size in range(max_ngram_size, 0, -1):
                copied = indexes[size].continuation(output[:end], COPIED)
                if copied:
                    right = 0
                    for drafted, emitted in zip(copied, output[end:], strict=False):
                        if drafted != emitted:
                            break
                        right += 1
                    counts = matched[size]
                    counts[0] += 1
                    counts[1] += right > 0
                    counts[2] += right
                    break
    print(f"\n{positions} positions of {len(sources)} greedy outputs\n")
    print("| longest n-gram matched | positions | first copied token right | copied tokens right per match |")
    print("|---|---|---|---|")
    for size in sorted(matched):
        count, first, tokens = matched[size]
        print(f"| {size} | {count} ({count / positions:.1%}) | {first / count:.1%} | {tokens / count:.2f} |")


def forward_by_width(verifier, source, widths: range, rounds: int = 9, calls: int = 10) -> None:
    """Part 2: the decoder forward of w new tokens over a 16-token cache, median of interleaved rounds."""
    encoder_outputs = verifier.get_encoder()(input_ids=source["input_ids"])
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    start_ids = torch.full((1, 16), verifier.config.decoder_start_token_id)
    verifier(encoder_outputs=encoder_outputs, decoder_input_ids=start_ids, cache=cache, use_cache=True)
    seconds = {width: [] for width in widths}

    def forward(width: int) -> None:
        verifier(encoder_outputs=encoder_outputs, decoder_input_ids=start_ids[:, :width], cache=cache, use_cache=True)
        cache.crop(-width)

    for width in widths:
        forward(width)
    for round_index in range(rounds):
        order = list(widths)[round_index % len(widths) :] + list(widths)[: round_index % len(widths)]
        for width in order:
            start = time.perf_counter()
            for _ in range(calls):
                forward(width)
            seconds[width].append((time.perf_counter() - start) / calls)
    one = statistics.median(seconds[widths[0]])
    print("\n| tokens fed | forward (ms) | × one token |")
    print("|---|---|---|")
    for width in widths:
        median = statistics.median(seconds[width])
        print(f"| {width} | {median * 1e3:.3f} | {median / one:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="models/demo-sum/verifier")
    parser.add_argument("--data", default="models/demo-sum/heldout_validation.jsonl", help="JSON lines with document")
    parser.add_argument("--limit", type=int, default=100, help="Rows (the first N).")
    parser.add_argument("--num_draft_tokens", type=int, default=4, help="The fixed k of the copy's second setting.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)
    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=torch.float32).eval()  # as the main job
    verifier.generation_config.max_length = None  # max_new_tokens decides
    with torch.inference_mode():
        print("verifier: " + "; ".join(choice.describe() for choice in prepack_where_faster(verifier)))
    sources = read_sources(args.data, AutoTokenizer.from_pretrained(args.verifier), args.limit)
    vocab_size = verifier.config.vocab_size
    copy = SourceCopyDrafter.from_verifier(verifier)  # its defaults: what part 1 measures and part 3 times
    settings = {
        "greedy": None,
        "copy, k auto": (copy, "auto"),
        f"copy, k={args.num_draft_tokens}": (
            SourceCopyDrafter.from_verifier(verifier, num_draft_tokens=args.num_draft_tokens),
            args.num_draft_tokens,
        ),
        "the loop, no drafts": (NoDrafts(vocab_size), 1),
    }
    kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=args.max_new_tokens)
    outputs = collections.defaultdict(dict)

    def measure(name: str, group: int) -> float:
        extra = {}
        if settings[name] is not None:
            drafter, k = settings[name]
            extra = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=k)
        start = time.perf_counter()
        output = verifier.generate(**sources[group], **kwargs, **extra)
        seconds = time.perf_counter() - start
        outputs[name][group] = output[0].tolist()
        return seconds

    with torch.inference_mode():
        copy_accuracy(verifier, sources, args.max_new_tokens, copy.max_ngram_size)
        forward_by_width(verifier, sources[0], range(1, 10))
        measures = {name: (lambda group, n=name: measure(n, group)) for name in settings}
        interleave(measures, num_groups=min(10, len(sources)), repeats=1, desc="warm-up", disable_tqdm=True)
        totals = interleave(measures, num_groups=len(sources), repeats=args.repeats, disable_tqdm=True)
    print(f"\n{len(sources)} rows, batch 1, {args.threads} threads; greedy {with_range(totals['greedy'])} s a pass\n")
    print("| setting | × greedy | outputs equal to greedy's |")
    print("|---|---|---|")
    for name in settings:
        same = sum(outputs[name][row] == outputs["greedy"][row] for row in range(len(sources)))
        ratio = with_range(paired_speedups(totals["greedy"], totals[name]), suffix="×")
        print(f"| {name} | {ratio} | {same}/{len(sources)} |")


if __name__ == "__main__":
    main()
