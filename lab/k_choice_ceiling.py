"""What choosing k per iteration could buy over the best fixed k: the drafter's or the verifier's confidence, bounds.

For each source this decodes greedily, runs the drafter teacher-forced at every split point of the output with all
its mask slots (as `drafter_call_splits.py` does), and keeps, per split, which slots are right and the drafter's
probability of its own first choice in each slot. At β=1 the prefix at every call is the greedy output's, so an
iteration from split s that verifies k drafts accepts exactly the run of right slots up to k, and the tokens of
decoding are replayed exactly for any rule choosing k from what is known at s (k capped by the length budget, as the
loop caps it). Each iteration is costed with the cost table the `num_draft_tokens="auto"` schedule builds in this
process (decoding `--cost_rows` sources first): what an iteration of k drafts costs on this machine, the drafter's call
and the loop included; a drafter call that catches up on skipped iterations is costed as any other. Speeds are tokens
per second of the replay against the table's plain iteration (k = 0), so the rules compare with each other, not with
`generate()`.

The rules: every fixed k; from the drafts (the drafter's call paid whatever k is chosen): k maximising expected tokens
per second with the drafter's confidences mapped to acceptance by a table fitted on the other half of the sources
(cross-fitted: each half is replayed with the table of the other), verifying while each draft's own confidence stays
up to the first below a threshold (HF's `assistant_confidence_threshold`), or while the product of the confidences does; from what is
known before the drafter's call, the verifier's probability of the prefix's last token: k=3 above a threshold (else no
call; the thresholds are tried on the same sources) or the best k for that probability's bucket (cross-fitted). Two
bounds close the table: the best k per iteration in hindsight (dynamic programming over the splits, knowing every
draft's fate), once where a k = 0 iteration skips the drafter's call and once where the call is paid.

    python -m lab.k_choice_ceiling --limit 100 --threads 2

Its figures: docs/RESULTS.md, "k per iteration from the drafter's confidence or the verifier's".
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import operator
from collections.abc import Callable, Sequence

import torch
from transformers import AutoTokenizer

from benchmarks._common import (
    GREEDY_KWARGS,
    add_demo_pair_arguments,
    load_demo_pair,
    read_sources,
    split_targets,
    teacher_forced_drafts,
)
from specdec_hf import prepack_where_faster, speculative_generate
from specdec_hf.generation import draft_length
from specdec_hf.generation.draft_length import choose_draft_length

# edges of the confidence buckets the acceptance table is fitted on
EDGES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)


class Splits:
    """One source's teacher-forced drafts: `right[s][j]` (slot j right after split s, all earlier slots aside),
    `confidence[s][j]` (the drafter's probability of its slot-j choice) and `verifier_confidence[s]` (the verifier's
    probability of the last token of split s's prefix, known before the drafter is called; 1 for the start token),
    for the output's `tokens` new tokens."""

    def __init__(
        self, right: list[list[bool]], confidence: list[list[float]], verifier_confidence: list[float], tokens: int
    ):
        self.right, self.confidence, self.tokens = right, confidence, tokens
        self.verifier_confidence = verifier_confidence

    def accepted(self, split: int, k: int) -> int:
        """Drafts accepted from `split` when k are verified: the run of right slots, at most k."""
        count = 0
        while count < k and self.right[split][count]:
            count += 1
        return count


@torch.inference_mode()
def score_source(verifier, drafter, inputs: dict, slots: int) -> Splits:
    """Decode `inputs` greedily and score the drafter's `slots` slots at every split point of the output."""
    output = verifier.generate(**inputs, **GREEDY_KWARGS)
    length = output.shape[1]
    teacher_forced, logits = teacher_forced_drafts(verifier, drafter, inputs, output, slots)
    confidence, choice = logits.float().softmax(-1).max(-1)
    drafts = drafter.from_draft_vocab(choice)
    targets = split_targets(output, slots).to(drafts.device)
    # the verifier's probability of each output token after the start token, from the position before it
    emitted = teacher_forced.logits[0, :-1].float().softmax(-1).gather(1, output[0, 1:, None]).squeeze(1)
    verifier_confidence = [1.0, *emitted.tolist()][: length - 1]
    return Splits((drafts == targets).tolist(), confidence.tolist(), verifier_confidence, length - 1)


def replay(
    rule: Callable[[Splits, int], int],
    sources: Sequence[Splits],
    costs: Sequence[float],
    after_drafting: bool = False,
    budget: int = GREEDY_KWARGS["max_new_tokens"],
) -> tuple[float, float]:
    """Decode every source again under `rule(splits, split) -> k`; returns (speed against k = 0 everywhere, Tok.).

    k is capped as the loop caps it, by the length budget (`budget` new tokens), not by where the output will end: a
    rule does not know that. A run of right drafts that takes in the output's EOS token ends the source.

    With `after_drafting` the rule reads the drafts (their confidence), so the drafter was called whatever k it
    chooses: k = 0 then costs a drafting iteration less its one draft's verification, not a plain iteration.
    """
    chosen_costs = _chosen_costs(costs, after_drafting)
    seconds = tokens = iterations = 0
    for splits in sources:
        split = 0
        while split < splits.tokens:
            k = max(0, min(rule(splits, split), budget - split - 1, len(costs) - 1))
            seconds += chosen_costs[k]
            iterations += 1
            split += splits.accepted(split, k) + 1
        tokens += splits.tokens
    return tokens / seconds * costs[0], tokens / iterations


def hindsight(sources: Sequence[Splits], costs: Sequence[float], after_drafting: bool) -> tuple[float, float]:
    """The fastest decoding of every source by any choice of k per iteration, knowing every draft's fate (dynamic
    programming over the splits: a bound no rule reaches); returns (speed against k = 0 everywhere, Tok.).

    With `after_drafting`, k = 0 is costed as `replay` costs it for rules that read the drafts (the drafter's call
    paid): the bound of such rules; without, a k = 0 iteration skips the call.
    """
    chosen_costs = _chosen_costs(costs, after_drafting)
    seconds = tokens = iterations = 0
    for splits in sources:
        # best[s]: (seconds, iterations) from split s to the end
        best = [(0.0, 0)] * (splits.tokens + 2)
        for split in range(splits.tokens - 1, -1, -1):
            best[split] = min(
                (chosen_costs[k] + best[nxt][0], best[nxt][1] + 1)
                for k in range(len(costs))
                for nxt in (min(split + splits.accepted(split, k) + 1, splits.tokens + 1),)
            )
        seconds += best[0][0]
        iterations += best[0][1]
        tokens += splits.tokens
    return tokens / seconds * costs[0], tokens / iterations


def _chosen_costs(costs: Sequence[float], after_drafting: bool) -> list[float]:
    chosen = list(costs)
    if after_drafting:
        chosen[0] = costs[1] - (costs[2] - costs[1])
    return chosen


def fit_acceptance(sources: Sequence[Splits], slots: int) -> list[list[float]]:
    """P(slot j right | slots before it right, its confidence's bucket), Laplace-smoothed, per slot and bucket."""
    counts = [[[0, 0] for _ in range(len(EDGES) + 1)] for _ in range(slots)]
    for splits in sources:
        for split in range(splits.tokens):
            for slot in range(slots):
                bucket = counts[slot][bisect.bisect_right(EDGES, splits.confidence[split][slot])]
                bucket[0] += 1
                bucket[1] += splits.right[split][slot]
                if not splits.right[split][slot]:
                    break
    return [[(right + 1) / (seen + 2) for seen, right in slot] for slot in counts]


def confidence_rule(table: list[list[float]], costs: Sequence[float]) -> Callable[[Splits, int], int]:
    """k with the most expected tokens per second, the drafts' acceptance read from `table` by their confidence (k = 0
    costed as `replay` costs it once the drafter was called)."""
    chosen_costs = _chosen_costs(costs, after_drafting=True)

    def rule(splits: Splits, split: int) -> int:
        confidences = splits.confidence[split][: len(costs) - 1]
        right = [table[slot][bisect.bisect_right(EDGES, value)] for slot, value in enumerate(confidences)]
        all_right = list(itertools.accumulate(right, operator.mul))
        return choose_draft_length(chosen_costs, all_right)

    return rule


def each_draft_rule(threshold: float, slots: int) -> Callable[[Splits, int], int]:
    """Verify drafts up to and including the first whose own confidence is below `threshold` (HF's
    `assistant_confidence_threshold`: the assistant stops after a token it is unsure of, and that token is still
    verified)."""

    def rule(splits: Splits, split: int) -> int:
        k = 1
        while k < slots and splits.confidence[split][k - 1] >= threshold:
            k += 1
        return k

    return rule


def threshold_rule(threshold: float, slots: int) -> Callable[[Splits, int], int]:
    """Verify the first draft, then each next while the product of the confidences stays at `threshold` or above."""

    def rule(splits: Splits, split: int) -> int:
        k, product = 0, 1.0
        for slot in range(slots):
            product *= splits.confidence[split][slot]
            if product < threshold and k >= 1:
                break
            k += 1
        return k

    return rule


def verifier_gate_rule(threshold: float, k: int) -> Callable[[Splits, int], int]:
    """No drafter call (k = 0) where the verifier gave the prefix's last token less than `threshold`, else `k`."""
    return lambda splits, split: 0 if splits.verifier_confidence[split] < threshold else k


def fit_by_verifier_confidence(sources: Sequence[Splits], slots: int) -> list[list[float]]:
    """Per bucket of the verifier's confidence in the prefix's last token: P(the first i + 1 drafts all right),
    i < `slots`, with a Laplace prior."""
    counts = [[0] * (slots + 1) for _ in range(len(EDGES) + 1)]  # [splits, runs of >= 1, >= 2, ...]
    for splits in sources:
        for split in range(splits.tokens):
            bucket = counts[bisect.bisect_right(EDGES, splits.verifier_confidence[split])]
            bucket[0] += 1
            for run in range(splits.accepted(split, slots)):
                bucket[run + 1] += 1
    return [[(bucket[i + 1] + 0.5) / (bucket[0] + 1) for i in range(slots)] for bucket in counts]


def by_verifier_confidence_rule(table: list[list[float]], costs: Sequence[float]) -> Callable[[Splits, int], int]:
    """The k with the most expected tokens per second for the bucket of the verifier's confidence in the prefix's
    last token (known before the drafter's call: k = 0 skips it)."""
    choices = [choose_draft_length(costs, acceptance) for acceptance in table]
    return lambda splits, split: choices[bisect.bisect_right(EDGES, splits.verifier_confidence[split])]


def main(argv: list[str] | None = None) -> None:
    """Print the auto schedule's costs and every rule's replayed speed and Tok., on all sources and by half."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_demo_pair_arguments(parser, limit=100, num_draft_tokens=0)
    parser.set_defaults(data="models/demo-en-de/heldout_validation.jsonl", drafter_dtype="float32")
    parser.add_argument("--cost_rows", type=int, default=30, help="Sources decoded at k auto to build the costs.")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    verifier, drafter = load_demo_pair(args, prepack=False)
    prepack_where_faster(verifier)
    prepack_where_faster(drafter, runs_after=verifier)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    sources = read_sources(args.data, tokenizer, args.limit)
    slots = drafter.config.max_draft_tokens
    auto = dict(custom_generate=speculative_generate, drafter=drafter, num_draft_tokens="auto")
    with torch.inference_mode():
        for inputs in sources[: args.cost_rows]:
            verifier.generate(**inputs, **GREEDY_KWARGS, **auto)
    table = draft_length._COST_TABLES[drafter][verifier][(1, "cpu", slots)]
    if table.calibration is not None:  # calibrated in the loop's own iterations: 3 per k, up to its cap if one
        raise SystemExit(f"--cost_rows {args.cost_rows}: too few rows to time every k up to {slots}; pass more")
    if table.largest_k < slots:
        raise SystemExit(f"the cost table stopped at k = {table.largest_k} (no k above it expected to pay)")
    costs = table.iteration_seconds(slots)
    print(f"verifier forward by drafts (ms): {' '.join(f'{s * 1e3:.2f}' for s in table.verify_seconds)}")
    print(f"iteration by k (ms): {' '.join(f'{s * 1e3:.2f}' for s in costs)}")
    scored = [score_source(verifier, drafter, inputs, slots) for inputs in sources]
    halves = (scored[: len(scored) // 2], scored[len(scored) // 2 :])
    fitted = [fit_acceptance(half, slots) for half in halves]
    by_verifier = [fit_by_verifier_confidence(half, slots) for half in halves]
    # name: (the rule for the first half, for the second, whether it reads the drafts); the bounds follow the rules
    rules: dict[str, tuple[Callable, Callable, bool]] = {
        f"fixed k={k}": (lambda s, i, k=k: k, lambda s, i, k=k: k, False) for k in range(slots + 1)
    }
    # each half replayed with the table fitted on the other
    rules["drafter's confidences, cross-fitted"] = (
        confidence_rule(fitted[1], costs),
        confidence_rule(fitted[0], costs),
        True,
    )
    for threshold in (0.3, 0.5, 0.7):
        rule = each_draft_rule(threshold, slots)
        rules[f"each draft's confidence >= {threshold}"] = (rule, rule, True)
    for threshold in (0.2, 0.3, 0.5):
        rule = threshold_rule(threshold, slots)
        rules[f"product of the drafter's confidences >= {threshold}"] = (rule, rule, True)
    # thresholds tried on these sources: the best of them is chosen in hindsight
    for threshold in (0.3, 0.5, 0.7, 0.9):
        rule = verifier_gate_rule(threshold, 3)
        rules[f"k=3 where the verifier gave >= {threshold}, else no drafter call"] = (rule, rule, False)
    rules["k by the verifier's confidence, cross-fitted"] = (
        by_verifier_confidence_rule(by_verifier[1], costs),
        by_verifier_confidence_rule(by_verifier[0], costs),
        False,
    )
    print("| rule | speed, all | Tok., all | speed, first half | speed, second half |")
    print("|---|---|---|---|---|")
    for name, (first, second, after_drafting) in rules.items():
        parts = [replay(first, halves[0], costs, after_drafting), replay(second, halves[1], costs, after_drafting)]
        tokens = sum(s.tokens for s in scored)
        # the halves' replays joined: times add up, tokens too
        seconds = sum(sum(s.tokens for s in half) / speed for half, (speed, _) in zip(halves, parts, strict=True))
        iterations = sum(sum(s.tokens for s in half) / tok for half, (_, tok) in zip(halves, parts, strict=True))
        print(
            f"| {name} | {tokens / seconds:.3f} | {tokens / iterations:.2f} | {parts[0][0]:.3f} | {parts[1][0]:.3f} |"
        )
    for after_drafting, name in ((False, "skipping the drafter"), (True, "once the drafts are made")):
        bound = hindsight(scored, costs, after_drafting)
        halves_bound = [hindsight(half, costs, after_drafting)[0] for half in halves]
        print(
            f"| bound: the best k per iteration in hindsight, {name} | {bound[0]:.3f} | {bound[1]:.2f} | "
            f"{halves_bound[0]:.3f} | {halves_bound[1]:.3f} |"
        )


if __name__ == "__main__":
    main()
