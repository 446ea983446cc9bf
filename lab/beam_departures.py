"""Where beam search parts from greedy, and whether a drafter's first draft carries that choice.

Teacher-forces the verifier and each drafter on the verifier's own beam-N outputs of a split's sources. At every
output position it reads the verifier's top-1 there (given beam search's prefix), the beam token's rank and
log-probability gap, and each drafter's first draft with the drafter's probability of it. From these it counts:

- departures: positions where beam search's token is not the verifier's top-1 (what the relaxed rule must let in);
- carried: departures where the drafter's first draft is beam search's token (inside top-β/τ: the rule takes it);
- noise: positions where the draft is neither beam search's token nor the top-1 but inside top-β/τ (the rule
  takes a token beam search did not write);

and the same two counts above thresholds of the drafter's confidence, to show whether a gate on it could keep the
carried departures and drop the noise. Local figures: beam search's prefix is given at every position, where a
relaxed run follows its own; the drafter's first slot only, with all its `max_draft_tokens` mask slots present (the
slots attend to each other); the verifier's scores with its `bad_words_ids` banned, as decoding sees them (the
forced EOS at the length limit is left out).

With `--relaxed` and `--beam` (two `generations/*.jsonl` files of one `evaluate.py` run), it also reads where a
relaxed run's outputs part from beam search's: the share equal to beam search's, and at each first difference
(both outputs re-tokenized as targets, the verifier teacher-forced on the shared prefix) whether the relaxed token
was a near-tie beam search did not take where beam search took the top-1 ("noise"), the top-1 where beam search
departed ("missed"), or both departed differently.

    python -m lab.beam_departures --drafters models/demo-en-de/drafter runs/drafter_beam5_scratch_export \
        --relaxed outputs/demo_en_de_beam_tuning/generations/spec_k8_b5_t3.jsonl \
        --beam outputs/demo_en_de_beam_tuning/generations/beam.jsonl --output outputs/beam_departures.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from specdec_hf import SpecDrafterModel
from specdec_hf.training.loss import verifier_teacher_outputs

RULES = {"b3_t1": (3, 1.0), "b5_t2": (5, 2.0), "b5_t3": (5, 3.0)}
THRESHOLDS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9)


def processed_log_probs(verifier, logits: torch.FloatTensor) -> torch.FloatTensor:
    """Log-probabilities with the verifier's single-token `bad_words_ids` banned, as decoding scores them."""
    banned = [ids[0] for ids in (verifier.generation_config.bad_words_ids or []) if len(ids) == 1]
    if banned:
        logits = logits.clone()
        logits[..., banned] = -float("inf")
    return torch.log_softmax(logits, dim=-1)


def beam_outputs(verifier, tokenizer, sources: list[str], num_beams: int, max_new_tokens: int) -> dict:
    """The verifier's beam-search outputs for `sources`, with the padded source batch."""
    batch = tokenizer(sources, return_tensors="pt", padding=True, truncation=True)
    sequences = verifier.generate(**batch, num_beams=num_beams, do_sample=False, max_new_tokens=max_new_tokens)
    pad = verifier.config.pad_token_id
    start = verifier.config.decoder_start_token_id
    # a row ends after its EOS; the decoder start token may equal pad (Marian), so it is counted apart
    ended = (sequences == verifier.config.eos_token_id).long().cumsum(1)
    valid = (ended == 0) | ((ended == 1) & (sequences == verifier.config.eos_token_id))
    valid[:, 0] = True
    valid &= (sequences != pad) | (torch.arange(sequences.shape[1]) == 0)
    lengths = valid.sum(1)
    assert bool((sequences[:, 0] == start).all())
    return {**batch, "target_ids": sequences, "target_lengths": lengths}


@torch.no_grad()
def measure(verifier, drafters: dict, batch: dict, counts: dict) -> None:
    """Add one batch's positions to `counts` (per drafter, per rule, per confidence threshold)."""
    target_ids, lengths = batch["target_ids"], batch["target_lengths"]
    logits = verifier(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=target_ids
    ).logits.float()
    log_probs = processed_log_probs(verifier, logits[:, :-1])  # position p - 1 predicts token p
    tokens = target_ids[:, 1:]
    valid = torch.arange(1, target_ids.shape[1])[None] < lengths[:, None]
    top1 = log_probs.argmax(-1)
    beam_lp = log_probs.gather(-1, tokens[..., None]).squeeze(-1)
    departure = valid & (tokens != top1)
    counts["positions"] += int(valid.sum())
    counts["departures"] += int(departure.sum())
    counts["sentences_departing"] += int(departure.any(1).sum())
    counts["sentences"] += int(target_ids.shape[0])
    for rule, (beta, tau) in RULES.items():
        inside = ((log_probs > beam_lp[..., None]).sum(-1) < beta) & (log_probs.max(-1).values - beam_lp <= tau)
        counts[f"departures_inside_{rule}"] += int((departure & inside).sum())
    teachers = {}  # one verifier pass per distinct set of states the drafters read
    for name, drafter in drafters.items():
        key = (drafter.config.use_verifier_encoder, tuple(drafter.config.verifier_state_layers or ()))
        if key not in teachers:
            teachers[key] = verifier_teacher_outputs(verifier, drafter, batch, soft_labels=False)
        teacher = teachers[key]
        split_lengths = torch.arange(1, target_ids.shape[1])
        drafted = (
            drafter(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                encoder_hidden_states=teacher.encoder_states,
                decoder_input_ids=target_ids,
                decoder_attention_mask=(torch.arange(target_ids.shape[1])[None] < lengths[:, None]).long(),
                split_lengths=split_lengths,
                verifier_states=teacher.decoder_states,
            )
            .logits[:, :, 0]
            .float()
        )  # first slot after each split: predicts token p at split p
        probs = torch.softmax(drafted, dim=-1)
        confidence, head_index = probs.max(-1)
        draft = drafter.from_draft_vocab(head_index)
        draft_lp = log_probs.gather(-1, draft[..., None]).squeeze(-1)
        counts[name]["first_draft_is_beam"] += int((valid & (draft == tokens)).sum())
        counts[name]["departures_drafted"] += int((departure & (draft == tokens)).sum())
        counts[name]["first_draft_is_top1"] += int((valid & (draft == top1)).sum())
        for rule, (beta, tau) in RULES.items():
            inside = ((log_probs > draft_lp[..., None]).sum(-1) < beta) & (log_probs.max(-1).values - draft_lp <= tau)
            carried = departure & (draft == tokens) & inside
            noise = valid & (draft != tokens) & (draft != top1) & inside
            for threshold in THRESHOLDS:
                sure = confidence >= threshold
                counts[name][f"{rule}_c{threshold}_carried"] += int((carried & sure).sum())
                counts[name][f"{rule}_c{threshold}_noise"] += int((noise & sure).sum())


@torch.no_grad()
def where_outputs_part(verifier, tokenizer, sources: list[str], relaxed: list[str], beam: list[str]) -> dict:
    """Counts of where each relaxed output first differs from beam search's, by what the verifier ranked there."""
    counts = {"sentences": len(sources), "equal": 0, "noise": 0, "missed": 0, "both_departed": 0}
    for source, relaxed_text, beam_text in zip(sources, relaxed, beam, strict=True):
        relaxed_ids = tokenizer(text_target=relaxed_text)["input_ids"]
        beam_ids = tokenizer(text_target=beam_text)["input_ids"]
        if relaxed_ids == beam_ids:
            counts["equal"] += 1
            continue
        first = next(
            (i for i, (a, b) in enumerate(zip(relaxed_ids, beam_ids, strict=False)) if a != b),
            min(len(relaxed_ids), len(beam_ids)),
        )
        if first >= min(len(relaxed_ids), len(beam_ids)):
            counts["both_departed"] += 1  # one output is a prefix of the other: a length difference
            continue
        start = verifier.config.decoder_start_token_id
        decoder_input_ids = torch.tensor([[start, *beam_ids[:first]]])
        logits = verifier(**tokenizer([source], return_tensors="pt"), decoder_input_ids=decoder_input_ids).logits
        top1 = int(processed_log_probs(verifier, logits[0, -1].float()).argmax())
        if beam_ids[first] == top1:
            counts["noise"] += 1
        elif relaxed_ids[first] == top1:
            counts["missed"] += 1
        else:
            counts["both_departed"] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--drafters", nargs="+", required=True)
    parser.add_argument("--split", default="data/debian_en_de/validation.jsonl")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--max_rows", type=int, default=None)
    parser.add_argument("--num_beams", type=int, default=5)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_threads", type=int, default=2)
    parser.add_argument("--relaxed", type=Path, default=None, help="generations/*.jsonl of a relaxed setting")
    parser.add_argument("--beam", type=Path, default=None, help="generations/beam.jsonl of the same run")
    parser.add_argument("--output", type=Path, default=Path("outputs/beam_departures.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.num_threads)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=torch.float32).eval()
    drafters = {path: SpecDrafterModel.from_pretrained(path, dtype=torch.float32).eval() for path in args.drafters}
    rows = [json.loads(line) for line in Path(args.split).read_text().splitlines() if line.strip()]
    sources = [row["translation"][args.source_lang] for row in rows][: args.max_rows]
    counts = {"positions": 0, "departures": 0, "sentences": 0, "sentences_departing": 0}
    counts.update({f"departures_inside_{rule}": 0 for rule in RULES})
    for name in drafters:
        counts[name] = dict.fromkeys(
            ["first_draft_is_beam", "first_draft_is_top1", "departures_drafted"]
            + [f"{r}_c{t}_{kind}" for r in RULES for t in THRESHOLDS for kind in ("carried", "noise")],
            0,
        )
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths per batch
    for start in range(0, len(order), args.batch_size):
        batch = beam_outputs(
            verifier,
            tokenizer,
            [sources[i] for i in order[start : start + args.batch_size]],
            args.num_beams,
            args.max_new_tokens,
        )
        measure(verifier, drafters, batch, counts)
        print(f"{min(start + args.batch_size, len(order))}/{len(order)} rows", flush=True)
    if args.relaxed is not None and args.beam is not None:
        read = [
            [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in (args.relaxed, args.beam)
        ]
        if [row["id"] for row in read[0]] != [row["id"] for row in read[1]]:
            raise ValueError("--relaxed and --beam must be generations of the same rows, in the same order")
        counts["where_outputs_part"] = where_outputs_part(
            verifier,
            tokenizer,
            [row["source"] for row in read[1]],
            [row["hypothesis"] for row in read[0]],
            [row["hypothesis"] for row in read[1]],
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"args": vars(args), "counts": counts}, indent=1, default=str))
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main()
