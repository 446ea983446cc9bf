"""How well signals known before the drafter's call predict that its first draft will be right (ROC AUC).

Skipping the drafter's call where its drafts will fail is what a draft-length rule could gain most from
(`k_choice_ceiling.py`: the bound of that is +25-30% on the en→de pair), so it needs a predictor of failure known
before the call. For each source this decodes greedily, runs the verifier and the drafter teacher-forced on the output
(as `k_choice_ceiling.py` does) and, at every split point, scores how well each signal ranks the splits whose first
draft is right above those whose is not: the verifier's probability of the prefix's last token, its top-1 minus top-2
probability there, minus its entropy there, whether the drafter's first draft was right at the previous split, the
split's position, and a logistic regression on those five (cross-fitted: each half of the sources scored with the
model fitted on the other). The drafter's own first-slot confidence, known only once it has been called, is shown
beside them. At the first split (the start token alone) the verifier's signals are taken as sure.

    python -m lab.first_draft_predictors --limit 100 --threads 2

Its figures: docs/RESULTS.md, "k per iteration from the drafter's confidence or the verifier's".
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoTokenizer

from benchmarks._common import (
    GREEDY_KWARGS,
    add_demo_pair_arguments,
    load_demo_pair,
    read_sources,
    teacher_forced_drafts,
)

SIGNALS = (
    "the verifier's probability of the last token",
    "the verifier's top-1 minus top-2 probability",
    "minus the verifier's entropy",
    "the previous split's first draft right",
    "the split's position (capped at 30)",
)


@torch.inference_mode()
def split_signals(verifier, drafter, inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per split of the greedy output of `inputs`: the pre-call signals `(splits, len(SIGNALS))`, the drafter's
    first-slot confidence `(splits,)` and whether its first draft is right `(splits,)`."""
    output = verifier.generate(**inputs, **GREEDY_KWARGS)
    length = output.shape[1]
    # split s (a prefix of s + 1 tokens) drafts output[s + 1] first
    teacher_forced, logits = teacher_forced_drafts(verifier, drafter, inputs, output, 1)
    logits = logits[:, 0]
    drafter_confidence, choice = logits.float().softmax(-1).max(-1)
    right = (drafter.from_draft_vocab(choice) == output[0, 1:]).float()
    # the verifier's distribution of output[t + 1] is probabilities[t]: split s's last token came from row s - 1
    probabilities = teacher_forced.logits[0, :-1].float().softmax(-1)
    top = probabilities.topk(2, dim=-1).values
    entropy = -(probabilities * probabilities.clamp_min(1e-12).log()).sum(-1)
    sure = torch.tensor([1.0, 1.0, 0.0])  # the start token: nothing verified before it
    verifier_signals = torch.cat([sure[None], torch.stack([top[:, 0], top[:, 0] - top[:, 1], -entropy], -1)[:-1]])
    previous_right = torch.cat([torch.ones(1), right[:-1]])
    position = torch.arange(length - 1).clamp(max=30).float() / 30
    signals = torch.cat([verifier_signals, previous_right[:, None], position[:, None]], dim=-1)
    return signals, drafter_confidence, right


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The probability that a random positive scores above a random negative (ties count half)."""
    positive, negative = scores[labels == 1], scores[labels == 0]
    above = (positive[:, None] > negative[None, :]).float().mean()
    tied = (positive[:, None] == negative[None, :]).float().mean()
    return (above + tied / 2).item()


def fit_logistic(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Weights (bias last) of a logistic regression of `labels` on `features`, by L-BFGS."""
    weights = torch.zeros(features.shape[1] + 1, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=200)
    design = torch.cat([features, torch.ones(len(features), 1)], dim=1)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(design @ weights, labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach()


def main(argv: list[str] | None = None) -> None:
    """Print the share of right first drafts and each signal's AUC."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_demo_pair_arguments(parser, limit=100, num_draft_tokens=0)
    parser.set_defaults(data="models/demo-en-de/heldout_validation.jsonl", drafter_dtype="float32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    verifier, drafter = load_demo_pair(args, prepack=False)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    sources = read_sources(args.data, tokenizer, args.limit)
    halves = ([], [])
    for index, inputs in enumerate(sources):
        halves[index * 2 // len(sources)].append(split_signals(verifier, drafter, inputs))
    joined = [[torch.cat(parts) for parts in zip(*half, strict=True)] for half in halves]
    signals, drafter_confidence, right = (torch.cat(parts) for parts in zip(*joined, strict=True))
    print(f"splits: {len(right)}; first draft right at {right.mean().item():.3f} of them")
    print("| signal | AUC |")
    print("|---|---|")
    for column, name in enumerate(SIGNALS):
        print(f"| {name} | {roc_auc(signals[:, column], right):.3f} |")
    weights = [fit_logistic(half[0], half[2]) for half in joined]
    # each half scored with the weights fitted on the other
    scores = torch.cat(
        [torch.cat([half[0], torch.ones(len(half[0]), 1)], 1) @ weights[1 - i] for i, half in enumerate(joined)]
    )
    print(f"| a logistic regression on all five, cross-fitted | {roc_auc(scores, right):.3f} |")
    print(f"| the drafter's own first-slot confidence (after its call) | {roc_auc(drafter_confidence, right):.3f} |")


if __name__ == "__main__":
    main()
