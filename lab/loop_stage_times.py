"""Where a speculative iteration's time goes, stage by stage, against a greedy step of the same run.

Greedy `generate()` and speculative β=1 decode the same sentences in alternating runs (the order rotating per
repeat). In the speculative runs each stage of the loop (`specdec_hf.generation.speculative_loop`: draft, verify,
accept, stop, commit, the outcome's read and the rest of its helpers) is wrapped in a wall-clock timer, and forward
hooks time the verifier's decoder, LM head and encoder; what `generate()` spends outside the loop is the run's
time less the loop's. Figures are per iteration, in ms and in greedy steps (a greedy run's time over its tokens,
set-up and encoder included), from the speculative run of the last repeat; the speed-up is the median over repeats.
The timers and hooks add a few microseconds per stage to the speculative runs, none to greedy's loop.

    python -m lab.loop_stage_times --num_draft_tokens 3 --limit 40 --repeats 3
    python -m lab.loop_stage_times --verifier models/demo-sum/verifier --drafter source_copy \
        --data models/demo-sum/heldout_validation.jsonl --num_draft_tokens auto --max_new_tokens 40

`--drafter source_copy` drafts with `SourceCopyDrafter` alone.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from transformers import AutoTokenizer

import specdec_hf.generation.api as api_module
import specdec_hf.generation.speculative_loop as loop_module
from benchmarks._common import add_demo_pair_arguments, load_demo_pair, print_header, read_sources
from specdec_hf import SourceCopyDrafter, prepack_where_faster, speculative_generate
from specdec_hf.evaluation.interleaved import interleave, paired_speedups

STAGES = (
    "draft",
    "verify",
    "accept",
    "stop",
    "commit",
    "_read_outcome",
    "release_finished_rows",
    "_active_batch",
    "_reserve_columns",
    "_budgets",
    "processors_acting_on",
    "_count_iteration",
    "_advance_lengths",
    "_iteration_k",
)


class StageTimes:
    """Wall-clock seconds and calls per stage, summed until `clear`."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.recording = False

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def wrap(self, module, name: str, label: str | None = None) -> None:
        """Replace `module.name` with a timed call of it (this process only)."""
        function, label = getattr(module, name), label or name

        def timed(*args, **kwargs):
            if not self.recording:
                return function(*args, **kwargs)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1

        setattr(module, name, timed)

    def hook(self, module: torch.nn.Module, label: str) -> None:
        """Time `module`'s forwards (those of speculative runs only)."""
        starts = []
        module.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))

        def done(*_):
            start = starts.pop()
            if self.recording:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1

        module.register_forward_hook(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=40, num_draft_tokens=3, allow_auto=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_header(args.repeats)

    copy = args.drafter == "source_copy"
    if copy:  # any drafter path loads; the copy replaces it
        args.drafter = str(args.verifier).replace("verifier", "drafter")
    verifier, drafter = load_demo_pair(args, prepack=False)
    with torch.inference_mode():
        print("verifier: " + "; ".join(choice.describe() for choice in prepack_where_faster(verifier)))
        prepack_where_faster(drafter, runs_after=verifier)
    if copy:
        drafter = SourceCopyDrafter.from_verifier(verifier)
    k = args.num_draft_tokens
    sources = read_sources(args.data, AutoTokenizer.from_pretrained(args.verifier), args.limit)
    kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=args.max_new_tokens)

    times = StageTimes()
    for name in STAGES:
        times.wrap(loop_module, name)
    times.wrap(api_module, "run_speculative_loop", "loop")
    times.hook(verifier.get_decoder(), "decoder forward")
    times.hook(verifier.get_output_embeddings(), "LM head")
    times.hook(verifier.get_encoder(), "encoder")
    tokens = {"greedy": 0, "speculative": 0}

    def run(name: str, group: int) -> float:
        times.recording = name == "speculative"
        if times.recording:
            times.clear()
        extra = {} if name == "greedy" else dict(custom_generate=speculative_generate, drafter=drafter)
        if name == "speculative":
            extra["num_draft_tokens"] = k
        start = time.perf_counter()
        count = 0
        with torch.inference_mode():
            for source in sources:
                output = verifier.generate(**source, **kwargs, **extra)
                count += output.shape[1] - 1
        tokens[name] = count
        times.recording = False
        return time.perf_counter() - start

    measures = {name: (lambda group, n=name: run(n, group)) for name in ("greedy", "speculative")}
    interleave(measures, num_groups=1, repeats=1, desc="warm-up", disable_tqdm=True)
    totals = interleave(measures, num_groups=1, repeats=args.repeats, desc="runs", disable_tqdm=True)

    greedy_step = statistics.median(totals["greedy"]) / tokens["greedy"]
    iterations = times.calls["verify"]
    speed_ups = paired_speedups(totals["greedy"], totals["speculative"])
    print(
        f"\n{len(sources)} sentences, k={k}, {args.threads} threads; greedy {greedy_step * 1e3:.3f} ms a token "
        f"(its runs {min(totals['greedy']):.2f}-{max(totals['greedy']):.2f} s); speculative "
        f"{statistics.median(speed_ups):.3f}× ({min(speed_ups):.3f}-{max(speed_ups):.3f}), {iterations} iterations, "
        f"Tok. {tokens['speculative'] / iterations:.2f}\n"
    )
    last = totals["speculative"][-1]
    rows = sorted(times.seconds.items(), key=lambda item: -item[1])
    rows.append(("outside the loop (set-up, encoder)", last - times.seconds["loop"]))
    rows.append(("the whole run", last))
    print("| part | calls | ms per iteration | greedy steps per iteration |")
    print("|---|---|---|---|")
    for label, seconds in rows:
        per_iteration = seconds / iterations
        calls = times.calls.get(label, "")
        print(f"| {label} | {calls} | {per_iteration * 1e3:.3f} | {per_iteration / greedy_step:.3f} |")


if __name__ == "__main__":
    main()
