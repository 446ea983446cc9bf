"""Draft acceptance where speculative decoding calls the drafter, against at every split point of the same outputs.

A drafter is trained and evaluated teacher-forced at every split point of the verifier's outputs, but decoding calls it
only where an iteration starts: right after the verifier corrected a draft (or accepted all of them). If those points
are harder than the average one, the acceptance seen in decoding falls below the evaluation's. For each source this
decodes at β=1 (the verifier's greedy output), records the prefix lengths the drafter is called at, runs the drafter
teacher-forced on that output at every split point in one pass, and prints, for both sets of split points, the
fraction whose first j drafts are all right (j = 1..k) and the Tok. that implies (1 + their sum: a bonus token at
every call; decoding's own Tok. is lower, as a row's last pass emits nothing after an accepted EOS).

At both sets of split points it also reads what limits the first draft: the verifier's own probability of the token
it emits there (from the same teacher-forced pass, before logits processors), and where that token ranks among the
drafter's first-slot scores. A second table gives, by bucket of that probability, the share of the split points and
how often the token is the drafter's first choice or among its first two: at β=1 a drafter has to pick the
verifier's argmax, and where the verifier itself is unsure that argmax turns on small differences in its computation.

    python benchmarks/drafter_call_splits.py --limit 100 --threads 1

No timing: it runs beside other jobs without skewing anything but its own wall time.
"""

from __future__ import annotations

import argparse
import itertools
from typing import NamedTuple

import torch
from _common import add_demo_pair_arguments, load_demo_pair, read_sources, split_targets, teacher_forced_drafts
from transformers import AutoTokenizer

from specdec_hf import SpecDrafterAdapter, SpecDrafterModel, enable_speculative_decoding
from specdec_hf.acceptance import count_accepted


class CallRecordingAdapter(SpecDrafterAdapter):
    """A [`SpecDrafterAdapter`] that records the prefix length and k of every call (batch size 1)."""

    def __init__(self, model: SpecDrafterModel):
        super().__init__(model)
        self.calls: list[tuple[int, int]] = []

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        self.calls.append((int(prefix_lengths[0]), num_draft_tokens))
        return super().propose(state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states)


class SplitScores(NamedTuple):
    """One source's drafts, teacher-forced, and where decoding called the drafter.

    Args:
        runs (`torch.LongTensor` of shape `(num_splits,)`): For split index s (a prefix of s + 1 tokens), how many of
            its first k drafts are right in a row.
        calls (`list[int]`): The split indices the drafter was called at in decoding.
        runs_at_calls (`torch.LongTensor` of shape `(len(calls),)`): `runs` at `calls`, each capped at the k decoding
            drafted there (fewer than k near the length or position limit).
        accepted (`int`): The drafts decoding accepted. A check: at β=1 a call drafts from the same prefix and
            verifier states as the teacher-forced pass, so this equals `runs_at_calls.sum()` but for floating-point
            near-ties between the cached and the one-pass computation.
        confidence (`torch.FloatTensor` of shape `(num_splits,)`): The verifier's probability (softmax of its raw
            logits, before logits processors) of the token that follows each split's prefix in its output: how sure
            it was of the token the first draft has to match. Where a processor chose that token (an EOS forced at
            the length limit) it need not be the verifier's top-1.
        first_rank (`torch.LongTensor` of shape `(num_splits,)`): That token's rank among the drafter's first-slot
            scores (0: its first choice); the head's size for a token outside a reduced head.
    """

    runs: torch.LongTensor
    calls: list[int]
    runs_at_calls: torch.LongTensor
    accepted: int
    confidence: torch.FloatTensor
    first_rank: torch.LongTensor


@torch.no_grad()
def score_splits(verifier, drafter: SpecDrafterModel, inputs: dict, num_draft_tokens: int, max_new_tokens: int):
    """Decode one source at β=1 and score the drafter teacher-forced on the output.

    Args:
        verifier: An encoder-decoder model with `enable_speculative_decoding` applied.
        drafter ([`SpecDrafterModel`]): Its drafter, in eval mode.
        inputs (`dict`): One source (`input_ids`, `attention_mask`), batch size 1.
        num_draft_tokens (`int`): k.
        max_new_tokens (`int`): The output's length limit; the output plus k must fit in the drafter's
            `max_position_embeddings` (the teacher-forced pass places every split's k slots).

    Returns:
        [`SplitScores`]
    """
    adapter = CallRecordingAdapter(drafter)
    generated = verifier.generate(
        **inputs,
        drafter=adapter,
        num_draft_tokens=num_draft_tokens,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
    )
    output = generated.sequences
    length = output.shape[1]
    # one teacher-forced verifier pass (its probabilities, and its decoder states for a drafter that reads them) and
    # the drafter at every split point
    teacher_forced, logits = teacher_forced_drafts(verifier, drafter, inputs, output, num_draft_tokens)
    drafts = drafter.from_draft_vocab(logits.argmax(-1))  # (num_splits, k)
    targets = split_targets(output, num_draft_tokens).to(drafts.device)
    runs = count_accepted(drafts == targets)
    # a call's prefix is committed and the iteration adds at least its bonus token: every call lies inside the output
    assert all(prefix_length < length for prefix_length, _ in adapter.calls), (adapter.calls, length)
    calls = [prefix_length - 1 for prefix_length, _ in adapter.calls]
    drafted = torch.tensor([k for _, k in adapter.calls], dtype=torch.long)
    runs_at_calls = torch.minimum(runs[calls], drafted)
    # the first draft after the split of index s (a prefix of s + 1 tokens) predicts output[s + 1], which the
    # verifier scored from position s
    next_tokens = output[0, 1:]
    probabilities = teacher_forced.logits[0, :-1].float().softmax(dim=-1)
    confidence = probabilities.gather(1, next_tokens[:, None]).squeeze(1)
    first_rank = first_draft_rank(drafter, logits[:, 0].float(), next_tokens)
    return SplitScores(
        runs,
        calls,
        runs_at_calls,
        sum(generated.speculative_stats.accepted_tokens),
        confidence.cpu(),
        first_rank,
    )


def first_draft_rank(drafter: SpecDrafterModel, slot_logits: torch.FloatTensor, tokens: torch.LongTensor):
    """The rank of each of `tokens` (verifier ids) among the drafter's scores `(num_splits, head_size)` of one slot:
    0 for its first choice (the argmax, which takes the first of tied scores); the head's size for a token outside a
    reduced head."""
    head_size = slot_logits.shape[-1]
    rows = drafter.to_draft_vocab(tokens.to(slot_logits.device))
    inside = rows >= 0
    row = rows.clamp(min=0)[:, None]
    own = slot_logits.gather(1, row)
    before = torch.arange(head_size, device=slot_logits.device)[None, :] < row
    rank = ((slot_logits > own) | ((slot_logits == own) & before)).sum(dim=1)
    return torch.where(inside, rank, head_size).cpu()


CONFIDENCE_BUCKETS = (0.0, 0.5, 0.8, 0.95, 1.0)


def by_verifier_confidence(confidence: torch.FloatTensor, first_rank: torch.LongTensor) -> list[dict]:
    """Per bucket of the verifier's probability of its own token (`CONFIDENCE_BUCKETS`, the last one closed): the
    share of the split points, and how often the drafter's first and first-two choices hold that token."""
    table = []
    total = max(len(confidence), 1)
    for index, (low, high) in enumerate(itertools.pairwise(CONFIDENCE_BUCKETS)):
        last = index == len(CONFIDENCE_BUCKETS) - 2
        inside = (confidence >= low) & ((confidence <= high) if last else (confidence < high))
        count = int(inside.sum())
        ranks = first_rank[inside]
        table.append(
            {
                "verifier_probability": [low, high],
                "share": count / total,
                "first_choice": float((ranks == 0).float().mean()) if count else None,
                "first_two": float((ranks <= 1).float().mean()) if count else None,
            }
        )
    return table


def acceptance_profile(runs: torch.LongTensor, num_draft_tokens: int) -> list[float]:
    """For j = 1..k, the fraction of split points whose first j drafts are all right."""
    return [float((runs >= j).float().mean()) for j in range(1, num_draft_tokens + 1)] if len(runs) else []


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_demo_pair_arguments(parser, limit=100, num_draft_tokens=4)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    verifier, drafter = load_demo_pair(args, prepack=False)
    enable_speculative_decoding(verifier)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    every, called, accepted = [], [], 0
    first_draft = {"every split point": ([], []), "drafter calls": ([], [])}
    for inputs in read_sources(args.data, tokenizer, args.limit):
        scores = score_splits(verifier, drafter, inputs, args.num_draft_tokens, args.max_new_tokens)
        every.append(scores.runs)
        called.append(scores.runs_at_calls)
        for name, points in (("every split point", slice(None)), ("drafter calls", scores.calls)):
            first_draft[name][0].append(scores.confidence[points])
            first_draft[name][1].append(scores.first_rank[points])
        accepted += scores.accepted
    teacher_forced = int(torch.cat(called).sum())
    result = {"accepted_in_decoding": accepted, "accepted_teacher_forced_at_calls": teacher_forced}
    print(
        f"check: decoding accepted {accepted} drafts; teacher-forced at its calls, {teacher_forced} (equal but for "
        "floating-point near-ties)"
    )
    for name, runs in (("every split point", torch.cat(every)), ("drafter calls", torch.cat(called))):
        profile = acceptance_profile(runs, args.num_draft_tokens)
        result[name] = {"split_points": len(runs), "first_j_right": profile, "tokens_per_iteration": 1 + sum(profile)}
        figures = " / ".join(f"{value:.3f}" for value in profile)
        print(f"{name}: {len(runs)} split points; first j right, j = 1..k: {figures}; Tok. {1 + sum(profile):.3f}")
    print(
        "| split points | verifier's probability of its token | share | drafter's first choice | among its first two |"
    )
    print("|---|---|---|---|---|")
    for name, (confidence, first_rank) in first_draft.items():
        first_rank = torch.cat(first_rank)
        result[name]["first_draft"] = {
            "first_j_choices": [float((first_rank < j).float().mean()) for j in (1, 2, 3)],
            "by_verifier_probability": by_verifier_confidence(torch.cat(confidence), first_rank),
        }
        for row in result[name]["first_draft"]["by_verifier_probability"]:
            low, high = row["verifier_probability"]
            cells = [f"{row['share']:.3f}"] + [
                "–" if row[key] is None else f"{row[key]:.3f}" for key in ("first_choice", "first_two")
            ]
            print(f"| {name} | {low:.2f}–{high:.2f} | " + " | ".join(cells) + " |")
    for name in first_draft:
        choices = " / ".join(f"{value:.3f}" for value in result[name]["first_draft"]["first_j_choices"])
        print(f"{name}: the verifier's token among the drafter's first 1 / 2 / 3 choices of the first slot: {choices}")
    return result


if __name__ == "__main__":
    main()
