"""Where a drafter call's time goes: torch.profiler over `propose` along a real decoding path.

The drafter is called as the speculative loop calls it: once per iteration, the prefix growing by `--step` tokens
each time (about Tok.), its prefix cache carried over, and, for a drafter that reads verifier states, the states of a
teacher-forced verifier pass. Prints the median wall time per call, the share of it spent in torch operators (the
rest is Python: bookkeeping, argument checks, dataclass copies), and the operators by self CPU time.

    python -m lab.profile_drafter_call --drafter models/demo-en-de/drafter --threads 1
    python -m lab.profile_drafter_call --new_design --threads 1   # untrained, the config's design
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from benchmarks._common import print_header, with_range
from specdec_hf import SpecDrafterAdapter, SpecDrafterModel, prepack_linear_layers

SOURCES = [
    "Select the cells you want to copy and press Ctrl+C.",
    "This package contains the documentation for the command line tools of the GNU project.",
    "Click the arrow next to the icon to open the menu.",
]


def build_drafter(args, verifier) -> SpecDrafterModel:
    if args.new_design:
        return SpecDrafterModel.from_verifier(
            verifier,
            max_draft_tokens=args.num_draft_tokens,
            draft_vocab_ids=list(range(args.draft_vocab_size)) if args.draft_vocab_size else None,
            decoder_layers=1,
            prefix_attention="causal",
            use_verifier_encoder=True,
            verifier_state_layers=[1, 2, 3],
        )
    return SpecDrafterModel.from_pretrained(args.drafter, dtype=torch.float32)


@torch.no_grad()
def decoding_paths(verifier, tokenizer, layers):
    """Per source: encoder output, greedy output ids and (for feature drafters) teacher-forced decoder states."""
    paths = []
    for source in SOURCES:
        inputs = tokenizer(source, return_tensors="pt")
        output = verifier.generate(**inputs, do_sample=False, max_new_tokens=64)
        encoder = verifier.get_encoder()(**inputs)
        states = None
        if layers:
            decoded = verifier(encoder_outputs=encoder, decoder_input_ids=output, output_hidden_states=True)
            states = torch.cat([decoded.decoder_hidden_states[i] for i in layers], dim=-1)
        paths.append((inputs, encoder.last_hidden_state, output, states))
    return paths


@torch.no_grad()
def run_calls(drafter, paths, step: int, num_draft_tokens: int) -> list[float]:
    """Call `propose` along every path; returns the wall time of each call."""
    times = []
    drafter = SpecDrafterAdapter(drafter)
    for inputs, encoder_states, output, states in paths:
        state = drafter.init_drafting_state(inputs["input_ids"], inputs["attention_mask"], encoder_states)
        for length in range(1, output.shape[1], step):
            extra = None if states is None else states[:, :length]
            start = time.perf_counter()
            proposal = drafter.propose(state, output[:, :length], torch.tensor([length]), num_draft_tokens, extra)
            times.append(time.perf_counter() - start)
            state = proposal.state
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--drafter", default="models/demo-en-de/drafter")
    parser.add_argument("--new_design", action="store_true", help="An untrained drafter of the new demo design.")
    parser.add_argument("--draft_vocab_size", type=int, default=4096)
    parser.add_argument("--num_draft_tokens", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--step", type=int, default=2, help="Tokens the prefix grows by per call (about Tok.).")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=25, help="Operator rows to print.")
    parser.add_argument("--prepack_linear", action="store_true", help="The drafter through prepack_linear_layers.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)

    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    drafter = build_drafter(args, verifier).to(getattr(torch, args.dtype)).eval()
    if args.prepack_linear:
        prepack_linear_layers(drafter)
    paths = decoding_paths(verifier, tokenizer, drafter.config.verifier_state_layers)
    run_calls(drafter, paths, args.step, args.num_draft_tokens)  # warm-up
    per_repeat = [
        statistics.median(run_calls(drafter, paths, args.step, args.num_draft_tokens)) for _ in range(args.repeats)
    ]
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        profiled = run_calls(drafter, paths, args.step, args.num_draft_tokens)
    events = profiler.key_averages()
    # self CPU time of the operators (aten::...): what is not in them is Python around them
    operator_us = sum(event.self_cpu_time_total for event in events if event.key.startswith(("aten::", "mkldnn::")))
    print(
        f"propose, k={args.num_draft_tokens}, {args.dtype}: {with_range(per_repeat, 3, scale=1e3)} ms per call (median "
        f"call of each of {args.repeats} repeats of {len(profiled)} calls); under the profiler, torch operators take "
        f"{operator_us / 1e6 / sum(profiled):.0%} of the calls' wall time"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
