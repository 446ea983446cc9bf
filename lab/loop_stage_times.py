"""Where a speculative iteration's time goes, stage by stage, against a greedy step of the same repeat.

Greedy `generate()` and speculative β=1 at a fixed k decode the same sentences in alternating runs (the order
rotating per repeat). During the speculative runs only, each stage function of the loop
(`specdec_hf.generation.speculative_loop`: draft, verify, the settling of accept, stop and commit and the rest of
its helpers) and the drafter's per-call set-up (`init_drafting_state`) are wrapped in wall-clock timers, and forward
hooks time the verifier's decoder, LM head and encoder; what `generate()` spends outside the loop is the run's time
less the loop's. Figures are per iteration of the last repeat's speculative run, in ms and in greedy steps (that
repeat's greedy run over its tokens, set-up and encoder included); the speed-up is the median over repeats. The
timers and hooks add a few microseconds per stage to the speculative runs (greedy runs none). Rows indented under
another are part of it. `benchmarks/bench_iteration_split.py` splits a run into four parts with the package's own
timers (`ModuleTimer`, `TimedDrafter`); this script splits the loop itself.

    python -m lab.loop_stage_times --num_draft_tokens 3 --limit 40 --repeats 3
    python -m lab.loop_stage_times --verifier models/demo-sum/verifier --drafter models/demo-sum/drafter \
        --data models/demo-sum/heldout_validation.jsonl --num_draft_tokens 2 --max_new_tokens 40 --limit 60

`--drafter source_copy` drafts with `SourceCopyDrafter` alone, `--drafter models/demo-sum/ngram_store` with that
n-gram store. k is fixed: with `"auto"` whole calls may skip the
loop, which this split does not follow.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import specdec_hf.generation.api as api_module
import specdec_hf.generation.speculative_loop as loop_module
from benchmarks._common import add_demo_pair_arguments, load_demo_pair, print_header, read_sources
from specdec_hf import (
    NgramStoreDrafter,
    SourceCopyDrafter,
    SpecDrafterAdapter,
    prepack_where_faster,
    speculative_generate,
)
from specdec_hf.drafters import is_ngram_store
from specdec_hf.evaluation.interleaved import interleave, paired_speedups

# the loop's stage functions, in the order an iteration calls them (`verify` and `draft` first: the largest); an
# iteration settles on the host (`settle_on_host`, `commit_on_host`: greedy on the CPU) or on tensors (`accept`, `stop`,
# `commit`, `_read_outcome`, `_budgets`, called by `_settle_on_device`, whose own lines count as the loop's)
SETTLING = ("settle_on_host", "commit_on_host", "accept", "stop", "commit", "_read_outcome", "_budgets")
STAGES = (
    "draft",
    "verify",
    "process_every_position",
    *SETTLING,
    "release_finished_rows",
    "_active_batch",
    "_reserve_columns",
    "processors_acting_on",
    "_count_iteration",
    "_advance_lengths",
    "_iteration_k",
)


class StageTimes:
    """Wall-clock seconds and calls per label, recorded while `recording` is set."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.recording = False
        self._hooks = []

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def wrap(self, owner, name: str, label: str) -> None:
        """Replace `owner.name` (a module's function or a class's method) with a call of it timed under `label`."""
        function = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.recording:
                return function(*args, **kwargs)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1

        setattr(owner, name, timed)

    def attach(self, modules: dict[str, torch.nn.Module]) -> None:
        """Time the forwards of `modules` (label → module) until `detach`."""
        for label, module in modules.items():
            starts = []

            def done(*_, starts=starts, label=label):
                self.seconds[label] += time.perf_counter() - starts.pop()
                self.calls[label] += 1

            self._hooks.append(
                module.register_forward_pre_hook(lambda *_, starts=starts: starts.append(time.perf_counter()))
            )
            self._hooks.append(module.register_forward_hook(done))

    def detach(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


def load(args):
    """The verifier, prepacked where faster, and the drafter (`SourceCopyDrafter` for `--drafter source_copy`, an
    `NgramStoreDrafter` for an n-gram store's directory)."""
    if args.drafter == "source_copy" or is_ngram_store(args.drafter):
        verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=getattr(torch, args.dtype)).eval()
        verifier.generation_config.max_length = None
        drafter = None if args.drafter == "source_copy" else NgramStoreDrafter.from_pretrained(args.drafter)
    else:
        verifier, drafter = load_demo_pair(args, prepack=False)
    with torch.inference_mode():
        print("verifier: " + "; ".join(choice.describe() for choice in prepack_where_faster(verifier)))
        if isinstance(drafter, torch.nn.Module):
            prepack_where_faster(drafter, runs_after=verifier)
    return verifier, drafter if drafter is not None else SourceCopyDrafter.from_verifier(verifier)


def report(times: StageTimes, greedy_step: float, run_seconds: float) -> None:
    """The last speculative run's split per iteration, nested rows indented under the row they are part of."""
    iterations = times.calls["verify"]
    seconds = times.seconds
    in_loop = seconds["loop"] - sum(seconds[name] for name in STAGES)
    settling = sum(seconds[name] for name in SETTLING)
    other_stages = sum(seconds[name] for name in STAGES if name not in ("draft", "verify", *SETTLING))
    outside = run_seconds - seconds["loop"]
    rows = [
        ("the loop", seconds["loop"]),
        ("  verify", seconds["verify"]),
        ("    the verifier's decoder forward", seconds["decoder forward"]),
        ("    its LM head", seconds["LM head"]),
        ("    the rest of verify", seconds["verify"] - seconds["decoder forward"] - seconds["LM head"]),
        ("  draft (the drafter's call)", seconds["draft"]),
        ("  accept, stop and commit (on the host or on tensors)", settling),
        ("  the other stages (the processors at every position, the rows' release, ...)", other_stages),
        ("  the loop's own lines between the stages", in_loop),
        ("outside the loop", outside),
        ("  the verifier's encoder", seconds["encoder"]),
        ("  the drafter's set-up (init_drafting_state)", seconds["drafter set-up"]),
        ("  the rest (generate()'s set-up and checks)", outside - seconds["encoder"] - seconds["drafter set-up"]),
        ("the whole run", run_seconds),
    ]
    print("| part | ms per iteration | greedy steps per iteration |")
    print("|---|---|---|")
    for label, total in rows:
        per_iteration = total / iterations
        print(f"| {label} | {per_iteration * 1e3:.3f} | {per_iteration / greedy_step:.3f} |")
    print("\nstage functions (calls, ms per iteration):")
    for name in STAGES:
        print(f"  {name}: {times.calls[name]}, {seconds[name] / iterations * 1e3:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=40, num_draft_tokens=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)
    verifier, drafter = load(args)
    sources = read_sources(args.data, AutoTokenizer.from_pretrained(args.verifier), args.limit)
    kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=args.max_new_tokens)

    times = StageTimes()
    for name in STAGES:
        times.wrap(loop_module, name, name)
    times.wrap(api_module, "run_speculative_loop", "loop")
    for drafter_class in (SpecDrafterAdapter, SourceCopyDrafter, NgramStoreDrafter):
        times.wrap(drafter_class, "init_drafting_state", "drafter set-up")
    modules = {
        "decoder forward": verifier.get_decoder(),
        "LM head": verifier.get_output_embeddings(),
        "encoder": verifier.get_encoder(),
    }
    tokens = {}

    def run(name: str, group: int) -> float:
        speculative = name == "speculative"
        if speculative:
            times.clear()
            times.attach(modules)
        extra = {}
        if speculative:
            extra = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=args.num_draft_tokens)
        times.recording = speculative
        count = 0
        start = time.perf_counter()
        with torch.inference_mode():
            for source in sources:
                output = verifier.generate(**source, **kwargs, **extra)
                count += output.shape[1] - 1  # batch 1; the decoder prompt is its start token
        seconds = time.perf_counter() - start
        times.recording = False
        times.detach()
        tokens[name] = count
        return seconds

    measures = {name: (lambda group, n=name: run(n, group)) for name in ("greedy", "speculative")}
    interleave(measures, num_groups=1, repeats=1, desc="warm-up", disable_tqdm=True)
    totals = interleave(measures, num_groups=1, repeats=args.repeats, desc="runs", disable_tqdm=True)

    greedy_step = totals["greedy"][-1] / tokens["greedy"]  # the repeat the split comes from
    speed_ups = paired_speedups(totals["greedy"], totals["speculative"])
    iterations = times.calls["verify"]
    print(
        f"\n{len(sources)} sentences, k={args.num_draft_tokens}, {args.threads} threads; speculative "
        f"{statistics.median(speed_ups):.3f}× ({min(speed_ups):.3f}-{max(speed_ups):.3f}) greedy; last repeat: "
        f"greedy {greedy_step * 1e3:.3f} ms a token, {iterations} iterations, Tok. "
        f"{tokens['speculative'] / iterations:.2f}, {totals['greedy'][-1] / totals['speculative'][-1]:.3f}×\n"
    )
    report(times, greedy_step, totals["speculative"][-1])


if __name__ == "__main__":
    main()
