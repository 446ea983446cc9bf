"""What the benchmarks and the lab scripts (`lab/`, which import this module) share: a header naming the run and the
machine, `median (min–max)` figures, the demo pair and its sources, and the drafter teacher-forced at every split
point of an output.

Figures that are compared (greedy vs speculative, a drafter call vs a verifier step) are measured in one process,
interleaved in a rotating order, with `specdec_hf.evaluation.interleaved` (the scheme of `evaluate.py`): a machine's
drift over minutes then hits both alike, and ratios are taken per repeat.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence

import torch
import transformers
from transformers import AutoModelForSeq2SeqLM

from specdec_hf import SpecDrafterModel, prepack_linear_layers
from specdec_hf.data.loading import sample_indices
from specdec_hf.data.local_files import read_jsonl
from specdec_hf.evaluation.interleaved import format_spread, spread
from specdec_hf.evaluation.machine import cpu_model, load_average
from specdec_hf.model_files import load_pretrained

__all__ = [
    "GREEDY_KWARGS",
    "TimedCall",
    "add_demo_pair_arguments",
    "load_demo_pair",
    "positive_int",
    "print_header",
    "read_sources",
    "split_targets",
    "teacher_forced_drafts",
    "with_range",
]

# greedy decoding of one demo sentence, as the main job runs it (speculative runs add their own arguments)
GREEDY_KWARGS = dict(do_sample=False, num_beams=1, max_new_tokens=96)


def positive_int(text: str) -> int:
    """An `argparse` type: an integer of at least 1 (counts, threads, repeats)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def print_header(repeats: int | None) -> None:
    """Print the command line, the machine (CPU model, cores, load), the versions, torch's threads and the runs.

    Args:
        repeats (`int`, *optional*): The interleaved runs each figure is the median of; `None` for a script that
            prints every call's time in the order they ran.
    """
    load = load_average()
    main = sys.modules["__main__"]
    # a script run as a module (`python -m lab.<name>`) is rerun so, from the repository root
    module = getattr(getattr(main, "__spec__", None), "name", None)
    program = ["-m", module] if module else sys.argv[:1]
    print(f"command: python {shlex.join([*program, *sys.argv[1:]])}")
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} logical cores, load average "
        f"{'unknown' if load is None else f'{load:.2f}'} at start; {platform.platform()}"
    )
    runs = (
        "every call timed once, in the order printed"
        if repeats is None
        else f"{repeats} runs interleaved in a rotating order after a warm-up; figures: median (min–max) over the runs"
    )
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} thread(s); {runs}"
    )


def with_range(values: Sequence[float], digits: int = 3, scale: float = 1.0, suffix: str = "") -> str:
    """`median (min–max)` of `values`, e.g. `with_range(ratios, 2, suffix="×")`.

    Args:
        values (`Sequence[float]`): One figure per run.
        digits (`int`): Decimals shown.
        scale (`float`): Multiplies every value (1e3: seconds shown in ms).
        suffix (`str`): Written after the median (a unit).
    """
    median, low, high = spread(values)
    return format_spread(median * scale, low * scale, high * scale, digits, suffix)


class TimedCall:
    """Wraps a callable and accumulates the wall time spent in it (signature preserved for `custom_generate`)."""

    def __init__(self, function):
        self.total = 0.0
        self.function = function
        functools.update_wrapper(self, function)

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.function(*args, **kwargs)
        finally:
            self.total += time.perf_counter() - start


def teacher_forced_drafts(verifier, drafter, inputs: dict, output: torch.LongTensor, num_draft_tokens: int):
    """One teacher-forced verifier pass over `output` and the drafter's logits at every split point of it (a prefix of
    1, 2, ... `output.shape[1] - 1` tokens), as decoding would have called it there (batch size 1). `drafter` is a
    [`SpecDrafterModel`] (not an adapter: its config and encoder are read).

    Returns:
        `(teacher_forced, logits)`: the verifier's `Seq2SeqLMOutput` (its decoder states included when the drafter
        reads them) and the drafter's logits `(num_splits, num_draft_tokens, head_size)`.
    """
    encoder_states = verifier.get_encoder()(**inputs).last_hidden_state
    layers = drafter.config.verifier_state_layers
    teacher_forced = verifier(
        encoder_outputs=(encoder_states,),
        attention_mask=inputs.get("attention_mask"),
        decoder_input_ids=output,
        output_hidden_states=bool(layers),
        use_cache=False,
    )
    states = None
    if layers:
        states = torch.cat([teacher_forced.decoder_hidden_states[index] for index in layers], dim=-1)
    # the drafter casts the verifier's states to its dtype itself
    logits = drafter(
        input_ids=None if drafter.encoder is None else inputs["input_ids"],
        attention_mask=inputs.get("attention_mask"),
        encoder_hidden_states=encoder_states if drafter.encoder is None else None,
        decoder_input_ids=output,
        verifier_states=states,
        split_lengths=torch.arange(1, output.shape[1]),
        num_draft_tokens=num_draft_tokens,
    ).logits[0]
    return teacher_forced, logits


def split_targets(output: torch.LongTensor, num_draft_tokens: int) -> torch.LongTensor:
    """`(num_splits, num_draft_tokens)`: the token of `output` (batch size 1) each draft slot of each split point
    should have drafted; -1 past the output's end (never right)."""
    length = output.shape[1]
    split_lengths = torch.arange(1, length, device=output.device)
    targets = torch.full((length - 1, num_draft_tokens), -1, dtype=output.dtype, device=output.device)
    for slot in range(num_draft_tokens):
        positions = split_lengths + slot
        inside = positions < length
        targets[inside, slot] = output[0, positions[inside]]
    return targets


def read_sources(path, tokenizer, limit: int, seed: int | None = None) -> list:
    """Tokenised sources of a JSON-lines file, one batch of one per row: `translation.en` (the en→de pair's rows) or
    `document` (the summarization pair's).

    Args:
        path: The file (e.g. `models/demo-en-de/heldout_test.jsonl`).
        tokenizer: The verifier's tokenizer.
        limit (`int`): Rows to read: the first `limit`, or with `seed` a random sample of that many, in file order.
        seed (`int`, *optional*): Draw the sample with this seed.
    """
    examples = list(read_jsonl(path))  # a malformed line is reported with the file and line number
    rows = range(min(limit, len(examples))) if seed is None else sample_indices(len(examples), limit, seed)
    return [tokenizer(source_text(examples[row]), return_tensors="pt") for row in rows]


def source_text(example: dict) -> str:
    """The source of a held-out row of either demo pair."""
    if "translation" in example:
        return example["translation"]["en"]
    if "document" in example:
        return example["document"]
    raise ValueError(f"a row with neither `translation` nor `document`: keys {sorted(example)}")


def add_demo_pair_arguments(parser, limit: int, num_draft_tokens: int) -> None:
    """The arguments of the benchmarks that decode demo sentences: the pair, the sentences, the dtypes and k.

    Args:
        parser (`argparse.ArgumentParser`): Gains `--verifier`, `--drafter`, `--data`, `--limit`, `--dtype` (the
            verifier's), `--drafter_dtype` and `--num_draft_tokens`.
        limit (`int`), num_draft_tokens (`int`): The benchmark's defaults for `--limit` and `--num_draft_tokens`.
    """
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--drafter", default="models/demo-en-de/drafter")
    parser.add_argument(
        "--data", default="models/demo-en-de/heldout_test.jsonl", help="JSON lines with translation.en or document"
    )
    parser.add_argument("--limit", type=int, default=limit, help="Sentences (the first N rows).")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="The verifier's.")
    parser.add_argument(
        "--drafter_dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="The drafter's (float32: as the main job loads it).",
    )
    parser.add_argument("--num_draft_tokens", type=int, default=num_draft_tokens)


def load_demo_pair(args, prepack: bool, attn_implementation: str | None = None):
    """The verifier and drafter of `add_demo_pair_arguments`' `args`, in eval mode, prepacked if asked.

    Returns:
        `(verifier, drafter)`; the verifier's stored `max_length` is dropped (`GREEDY_KWARGS` passes `max_new_tokens`,
        and a stored `max_length` would only make generate() warn).
    """
    verifier = load_pretrained(
        AutoModelForSeq2SeqLM.from_pretrained,
        args.verifier,
        "--verifier",
        dtype=getattr(torch, args.dtype),
        attn_implementation=attn_implementation,
    ).eval()
    verifier.generation_config.max_length = None
    drafter_dtype = getattr(torch, args.drafter_dtype)
    drafter = load_pretrained(SpecDrafterModel.from_pretrained, args.drafter, "--drafter", dtype=drafter_dtype).eval()
    if prepack:
        prepack_linear_layers(verifier)
        prepack_linear_layers(drafter)
    return verifier, drafter
