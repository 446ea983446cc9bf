"""Where the time of a real speculative decoding goes, against greedy, on the demo pair.

Greedy `generate()` and speculative β=1 run on the same sentences, interleaved in a rotating order (one sentence
is one group), and each run's wall time is split into the verifier's encoder, its decoder forwards (greedy steps or
verifications, LM head included), the drafter's `propose` calls and the rest: everything else inside `generate()`
(its set-up; for greedy its per-step logits processing and stopping; for speculative decoding the loop's own work
and the drafter's per-call set-up). The second table alternates one (k+1)-token verification with one drafter call
that reads two new prefix tokens, as the loop does, and times each alone and right after the other, in interleaved
rounds: what their sharing one core's caches and the allocator costs.

    python benchmarks/bench_iteration_split.py --dtype bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from dataclasses import replace

import torch
from _common import GREEDY_KWARGS, add_demo_pair_arguments, load_demo_pair, print_header, read_sources, with_range
from transformers import AutoTokenizer, DynamicCache, EncoderDecoderCache

from specdec_hf import SpecDrafterAdapter, prepack_where_faster, speculative_generate
from specdec_hf.evaluation import ModuleTimer, TimedDrafter
from specdec_hf.evaluation.interleaved import interleave, rotation

CPU = torch.device("cpu")
PARTS = ("encoder", "decoder", "drafter", "rest")


def split_runs(verifier, drafter, sources, num_draft_tokens: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Per strategy and part, one total per repeat (seconds over all sentences); also forwards, calls, tokens."""
    encoder_timer = ModuleTimer([verifier.get_encoder()], CPU)
    decoder_timer = ModuleTimer([verifier.get_decoder(), verifier.get_output_embeddings()], CPU)
    timed_drafter = TimedDrafter(drafter, CPU)
    names = ("greedy", "speculative")
    parts = {name: {part: [0.0] * repeats for part in (*PARTS, "forwards", "calls", "tokens")} for name in names}
    # interleave() calls every name once per (repeat, sentence) step, repeat-major: a name's n-th call belongs to
    # repeat n // sentences
    runs = dict.fromkeys(names, 0)

    def run(name: str, group: int) -> float:
        for timer in (encoder_timer, decoder_timer):
            timer.total_s, timer.calls = 0.0, [0] * len(timer.modules)
        timed_drafter.total_s, timed_drafter.propose_s, timed_drafter.propose_calls = 0.0, 0.0, 0
        start = time.perf_counter()
        if name == "greedy":
            output = verifier.generate(**sources[group], **GREEDY_KWARGS)
        else:
            extra = dict(
                custom_generate=speculative_generate, drafter=timed_drafter, num_draft_tokens=num_draft_tokens
            )
            output = verifier.generate(**sources[group], **GREEDY_KWARGS, **extra)
        total = time.perf_counter() - start
        record = parts[name]
        r = runs[name] // len(sources)
        runs[name] += 1
        record["encoder"][r] += encoder_timer.total_s
        record["decoder"][r] += decoder_timer.total_s
        record["drafter"][r] += timed_drafter.propose_s
        record["rest"][r] += total - encoder_timer.total_s - decoder_timer.total_s - timed_drafter.propose_s
        record["forwards"][r] += decoder_timer.calls[0]
        record["calls"][r] += timed_drafter.propose_calls
        record["tokens"][r] += output.shape[1] - 1
        return total

    measures = {name: functools.partial(run, name) for name in names}
    with encoder_timer, decoder_timer:
        interleave(measures, num_groups=min(3, len(sources)), repeats=1, desc="warm-up")
        for name in names:  # the warm-up's figures went to repeat 0: start afresh
            runs[name] = 0
            for values in parts[name].values():
                values[0] = 0.0
        interleave(measures, num_groups=len(sources), repeats=repeats, desc="sentences")
    return parts


def run_totals(record: dict[str, list[float]]) -> list[float]:
    """The wall time of each repeat: the sum of its parts."""
    return [sum(record[part][repeat] for part in PARTS) for repeat in range(len(record["encoder"]))]


def alternation(verifier, drafter, source, num_draft_tokens: int, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds of a (k+1)-token verification and of a drafter call, each alone and right after the other.

    Every round runs `calls` of each pattern (verifications alone, drafter calls alone, pairs), in a rotating
    order. Each drafter call reads the same two prefix tokens past its cache, as a loop accepting about one draft
    per iteration would: the drafter's cache length is set back before every call (a `SpecDrafterModel` state).
    """
    drafter = SpecDrafterAdapter(drafter)
    prefix = torch.randint(5, min(drafter.vocab_size, 4000), (1, 40))
    prefix[:, 0] = verifier.config.decoder_start_token_id
    layers = drafter.verifier_state_layers
    states = torch.randn(1, 40, drafter.model.feature_proj.in_features) if layers else None
    with torch.no_grad():
        encoder_outputs = verifier.get_encoder()(**source)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        kwargs = dict(encoder_outputs=encoder_outputs, attention_mask=source["attention_mask"], use_cache=True)
        verifier(decoder_input_ids=prefix[:, :20], cache=cache, **kwargs)
        state = [drafter.init_drafting_state(source["input_ids"], source["attention_mask"], encoder_outputs[0])]
        state[0] = drafter.propose(
            state[0], prefix[:, :19], torch.tensor([19]), num_draft_tokens, None if states is None else states[:, :19]
        ).state

        def verify() -> float:
            start = time.perf_counter()
            verifier(
                decoder_input_ids=prefix[:, 20 : 21 + num_draft_tokens],
                cache=cache,
                output_hidden_states=True,
                **kwargs,
            )
            cache.crop(-(num_draft_tokens + 1))
            return time.perf_counter() - start

        def draft() -> float:
            start = time.perf_counter()
            extra = None if states is None else states[:, :21]
            proposal = drafter.propose(state[0], prefix[:, :21], torch.tensor([21]), num_draft_tokens, extra)
            elapsed = time.perf_counter() - start
            state[0] = replace(proposal.state, cache_length=19)  # the next call reads positions 19 and 20 again
            return elapsed

        patterns = {
            "alone": lambda: [(verify(), None) for _ in range(calls)] + [(None, draft()) for _ in range(calls)],
            "paired": lambda: [(verify(), draft()) for _ in range(calls)],
        }
        patterns["alone"](), patterns["paired"]()  # warm-up
        samples = {name: [] for name in patterns}
        for round_index in range(rounds):
            for name in rotation(list(patterns), round_index):
                samples[name].extend(patterns[name]())
    return {
        "verification alone": statistics.median(v for v, _ in samples["alone"] if v is not None),
        "verification right after a drafter call": statistics.median(v for v, _ in samples["paired"]),
        "drafter call alone": statistics.median(d for _, d in samples["alone"] if d is not None),
        "drafter call right after a verification": statistics.median(d for _, d in samples["paired"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=40, num_draft_tokens=8)
    parser.add_argument("--attn_implementation", default=None, help="The verifier's (default: transformers').")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    kernels = parser.add_mutually_exclusive_group()
    kernels.add_argument(
        "--prepack_linear", action="store_true", help="Both models through specdec_hf.prepack_linear_layers."
    )
    kernels.add_argument(
        "--prepack_where_faster",
        action="store_true",
        help="Both models through specdec_hf.prepack_where_faster (the drafter after the verifier), as the main job.",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print_header(args.repeats)

    verifier, drafter = load_demo_pair(args, prepack=args.prepack_linear, attn_implementation=args.attn_implementation)
    if args.prepack_where_faster:
        print("verifier: " + "; ".join(choice.describe() for choice in prepack_where_faster(verifier)))
        choices = prepack_where_faster(drafter, runs_after=verifier)
        print("drafter: " + "; ".join(choice.describe() for choice in choices))
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    sources = read_sources(args.data, tokenizer, args.limit)

    parts = split_runs(verifier, drafter, sources, args.num_draft_tokens, args.repeats)
    greedy_tokens = statistics.median(parts["greedy"]["tokens"])
    greedy_per_token = [total / greedy_tokens for total in run_totals(parts["greedy"])]
    print(
        f"\nverifier {args.verifier} ({args.dtype}, attention {verifier.config._attn_implementation}"
        f"{', linear layers prepacked' if args.prepack_linear else ''}"
        f"{', kernels where faster' if args.prepack_where_faster else ''}), drafter "
        f"{args.drafter} ({args.drafter_dtype}), k={args.num_draft_tokens}, batch 1, {len(sources)} sentences; "
        f"greedy costs {with_range(greedy_per_token, 2, 1e3)} ms per token"
    )
    print("\n| ms per sentence | total | encoder | decoder forwards (count) | drafter calls (count) | rest | tokens |")
    print("|---|---|---|---|---|---|---|")
    n = len(sources)
    for name, record in parts.items():
        cells = [with_range(run_totals(record), 2, 1e3 / n)] + [with_range(record[p], 2, 1e3 / n) for p in PARTS]
        cells[2] += f" ({statistics.median(record['forwards']) / n:.1f})"
        calls = statistics.median(record["calls"]) / n
        cells[3] += f" ({calls:.1f})" if calls else ""
        print(f"| {name} | " + " | ".join(cells) + f" | {statistics.median(record['tokens']) / n:.1f} |")
    spec, greedy = parts["speculative"], parts["greedy"]
    iterations = statistics.median(spec["forwards"])
    token = statistics.median(greedy_per_token)
    # greedy's cost per token includes the encoder, so the iteration's parts include its share: they then add up
    # to what an iteration costs end to end, and Tok. over their sum is the speed-up
    per_iteration = {
        "verification": statistics.median(spec["decoder"]) / iterations,
        "drafter call": statistics.median(spec["drafter"]) / statistics.median(spec["calls"]),
        "rest": statistics.median(spec["rest"]) / iterations,
        "encoder share": statistics.median(spec["encoder"]) / iterations,
    }
    total = sum(per_iteration.values())
    print(
        f"\nper speculative iteration (Tok. {statistics.median(spec['tokens']) / iterations:.2f}): "
        + ", ".join(
            f"{part} {seconds * 1e3:.2f} ms = {seconds / token:.2f}" for part, seconds in per_iteration.items()
        )
        + f"; in all {total * 1e3:.2f} ms = {total / token:.2f} greedy tokens; per greedy token: decoder forward "
        + f"{statistics.median(greedy['decoder']) / statistics.median(greedy['forwards']) * 1e3:.2f} ms, rest "
        + f"{statistics.median(greedy['rest']) / greedy_tokens * 1e3:.2f} ms"
    )

    rounds, calls = 10, 30
    times = alternation(verifier, drafter, sources[0], args.num_draft_tokens, rounds, calls)
    print(f"\n| k={args.num_draft_tokens}, median of {rounds} interleaved rounds of {calls} calls | ms |")
    print("|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds * 1e3:.3f} |")


if __name__ == "__main__":
    main()
