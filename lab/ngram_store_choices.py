"""The n-gram store's settings replayed on greedy outputs: Tok. per k as the loop would see it, and the first draft.

For each validation source this decodes greedily (the checkpoint's processors on) and replays β=1 decoding on that
output: from the decoder start, each iteration drafts k tokens from the prefix, accepts the longest run that equals
the output and adds the verifier's token (the bonus or the correction), as the loop does; drafts depend only on the
prefix (and the source), so the replay gives the loop's Tok. without running it. Stores are built from the distilled
training outputs with the settings in the table (`NgramStore.from_sequences`) and drafted from as
`NgramStoreDrafter` drafts (source bias 0.3 on the source's ids, the tokenizer's special ids aside, unless a row says
otherwise). The trained drafter's row replays its teacher-forced drafts (its drafts at a split depend only on the
prefix too); its first draft in product with the store's shares (log-probability plus λ log share) closes the table.

    python -m lab.ngram_store_choices --limit 300

Its figures: docs/RESULTS.md, "An n-gram store of the verifier's own outputs".
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from transformers import AutoTokenizer

from benchmarks._common import GREEDY_KWARGS, add_demo_pair_arguments, load_demo_pair, teacher_forced_drafts
from specdec_hf.distillation import load_distilled_dataset
from specdec_hf.drafters import NgramStore, NgramStoreDrafter, draft_from_store

# (label, store settings (max_ngram_size, max_continuations, min_count), drafter settings)
STORES = (
    ("n <= 2, top 4, seen >= 2, source bias 0.3 (shipped)", (2, 4, 2), {}),
    ("the same, no source bias", (2, 4, 2), dict(source_bias=0.0)),
    ("the same, special ids preferred from the source too", (2, 4, 2), dict(ignored_source_ids=())),
    ("n <= 1", (1, 4, 2), {}),
    ("n <= 3, seen >= 3", (3, 4, 3), {}),
    ("n <= 2, every continuation, seen >= 1 (about twice the size)", (2, 255, 1), {}),
)
KS = (1, 2, 3, 4)


def replay(outputs, draft, k: int) -> float:
    """Tok. of β=1 decoding with `draft(row, prefix, k)` on each row's greedy output."""
    tokens = iterations = 0
    for row, output in enumerate(outputs):
        position = 1
        while position < len(output):
            drafts = draft(row, output[:position], k)[:k]
            accepted = 0
            for drafted, target in zip(drafts, output[position : position + k], strict=False):
                if drafted != target:
                    break
                accepted += 1
            step = min(accepted + 1, len(output) - position)
            tokens += step
            iterations += 1
            position += step
    return tokens / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_pair_arguments(parser, limit=300, num_draft_tokens=4)
    parser.set_defaults(
        verifier="models/demo-sum/verifier", drafter="models/demo-sum/drafter", data="data/debian_sum/validation.jsonl"
    )
    parser.add_argument("--distilled_data", default="data/distilled/debian_sum/train")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verifier, drafter = load_demo_pair(args, prepack=False)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    vocab_size = verifier.config.vocab_size
    sequences = load_distilled_dataset(args.distilled_data, vocab_size)["target_ids"]
    special = tokenizer.all_special_ids

    outputs, sources, neural = [], [], []
    with open(args.data, encoding="utf-8") as handle:
        documents = [json.loads(line)["document"] for line in handle][: args.limit]
    for document in documents:
        inputs = tokenizer(document, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            output = verifier.generate(**inputs, **GREEDY_KWARGS)
            _, logits = teacher_forced_drafts(verifier, drafter, inputs, output, args.num_draft_tokens)
        outputs.append(output[0].tolist())
        sources.append(inputs["input_ids"])
        neural.append(logits.float())
    print(f"{len(outputs)} rows of {args.data}; stores counted from {len(sequences)} distilled outputs\n")

    print("| drafter | contexts | " + " | ".join(f"Tok. k={k}" for k in KS) + " |")
    print("|---|---|" + "---|" * len(KS))
    picks = [logits.argmax(-1).tolist() for logits in neural]
    row = [f"{replay(outputs, lambda r, prefix, k: picks[r][len(prefix) - 1], k):.3f}" for k in KS]
    print("| the trained drafter (teacher-forced) | – | " + " | ".join(row) + " |")
    default = None
    for label, (max_ngram_size, max_continuations, min_count), settings in STORES:
        store = NgramStore.from_sequences(sequences, vocab_size, max_ngram_size, max_continuations, min_count)
        store_drafter = NgramStoreDrafter(store, **{"ignored_source_ids": special, **settings})
        default = default or store_drafter
        states = [store_drafter.init_drafting_state(source, None, None) for source in sources]

        def draft(r, prefix, k, store_drafter=store_drafter, states=states):
            tokens = states[r].source_tokens[0] if states[r].source_tokens else frozenset()
            bias = store_drafter.source_bias
            return draft_from_store(
                store_drafter.store, prefix[-store_drafter.store.max_ngram_size :], tokens, k, bias
            )

        row = [f"{replay(outputs, draft, k):.3f}" for k in KS]
        print(f"| {label} | {len(store)} | " + " | ".join(row) + " |")

    # the first draft at every split point: the store, the trained drafter, and their product
    print("\n| first draft at every split point | right |\n|---|---|")
    weights = (None, 0.0, 0.5, 1.0, 2.0)
    right = dict.fromkeys(weights, 0)
    count = 0
    for r, output in enumerate(outputs):
        tokens = default.init_drafting_state(sources[r], None, None).source_tokens[0]
        log_probs = neural[r][:, 0].log_softmax(-1)
        for split in range(1, len(output)):
            prefix, target = output[:split], output[split]
            stored = draft_from_store(default.store, prefix, tokens, 1, default.source_bias)
            right[None] += bool(stored) and stored[0] == target
            found = default.store.lookup(prefix)
            for weight in weights[1:]:
                score = log_probs[split - 1].clone()
                if weight and found is not None:
                    shares = torch.full_like(score, math.log(1e-3))
                    for token, share in zip(*found, strict=True):
                        shares[token] = math.log(share + (default.source_bias if token in tokens else 0.0))
                    score += weight * shares
                right[weight] += int(score.argmax()) == target
            count += 1
    print(f"| the store (shipped settings) | {right[None] / count:.3f} |")
    for weight in weights[1:]:
        name = "the trained drafter" if weight == 0 else f"the drafter's log-probability + {weight} log share"
        print(f"| {name} | {right[weight] / count:.3f} |")


if __name__ == "__main__":
    main()
