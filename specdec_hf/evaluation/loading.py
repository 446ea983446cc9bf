"""Loading the models of an evaluation run: verifier, tokenizer, drafters and the optional AR assistant."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from ..drafters import NgramStoreDrafter, SourceCopyDrafter, is_ngram_store
from ..drafters.source_copy import shares_vocabulary
from ..dtypes import TORCH_DTYPES
from ..linear_kernel_selection import KernelChoice, prepack_where_faster
from ..model_files import load_pretrained
from ..models import SpecDrafterModel
from .arguments import EvaluationArguments

__all__ = [
    "SOURCE_COPY",
    "EvaluationModels",
    "drafter_module",
    "load_drafter",
    "load_models",
    "parse_drafter_entry",
    "resolve_device",
]

# the `drafters` entry of the source-copy drafter (`source_copy+<path>`: before that trained drafter)
SOURCE_COPY = "source_copy"

logger = logging.getLogger(__name__)


@dataclass
class EvaluationModels:
    """The models of one evaluation run, in eval mode on one device."""

    verifier: torch.nn.Module
    tokenizer: object
    drafters: list  # SpecDrafterModel, NgramStoreDrafter, or SourceCopyDrafter for a `source_copy` entry
    assistant: torch.nn.Module | None
    # CTranslate2 workers of the `ct2*` strategies, by strategy name (started after the models are checked)
    ct2_workers: dict = field(default_factory=dict)
    # with `prepack_linear`: the kernel chosen per linear layer signature of each model, by role
    kernel_choices: dict[str, list[KernelChoice]] = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    """`auto` → the first GPU if there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available: use `--device cpu`.")
    return device


def parse_drafter_entry(entry: str) -> tuple[bool, str | None]:
    """One entry of `drafters` as `(copies_the_source, trained_drafter_path)`: `source_copy` -> `(True, None)`,
    `source_copy+<path>` -> `(True, path)`, any other entry -> `(False, entry)`."""
    if entry == SOURCE_COPY:
        return True, None
    if entry.startswith(SOURCE_COPY + "+"):
        return True, entry[len(SOURCE_COPY) + 1 :]
    return False, entry


def load_drafter(entry: str, verifier, dtype: torch.dtype):
    """One entry of `drafters`: a Spec-Drafter's or an n-gram store's directory or Hub id (an
    [`NgramStoreDrafter`], told apart by its `ngram_store.json`); `source_copy` (a [`SourceCopyDrafter`] of the
    verifier, no weights); or `source_copy+<drafter>`, the copy where the source continues a row and that drafter
    elsewhere.

    Raises:
        ValueError: for an n-gram store whose `source_bias` compares source ids with target ids of a verifier whose
            source and target vocabularies differ.
    """
    copies, path = parse_drafter_entry(entry)
    if path is None:
        drafter = None
    elif is_ngram_store(path):
        drafter = load_pretrained(NgramStoreDrafter.from_pretrained, path, "drafters")
        if drafter.source_bias and not shares_vocabulary(verifier):
            raise ValueError(
                f"`drafters` entry {entry!r}: the n-gram store prefers continuations found in the source "
                f"(source_bias={drafter.source_bias}), but {type(verifier).__name__}'s source and target vocabularies "
                "differ: save the store with `source_bias=0`."
            )
    else:
        drafter = load_pretrained(SpecDrafterModel.from_pretrained, path, "drafters", dtype=dtype)
    return SourceCopyDrafter.from_verifier(verifier, fallback=drafter) if copies else drafter


def drafter_module(drafter) -> torch.nn.Module | None:
    """The weights a drafter runs: the model itself, a source-copy drafter's fallback model, or `None`."""
    if isinstance(drafter, torch.nn.Module):
        return drafter
    fallback = getattr(drafter, "fallback", None)
    return getattr(fallback, "model", None)


def load_models(args: EvaluationArguments, device: torch.device) -> EvaluationModels:
    """Load every model of `args` onto `device` in `args.dtype`, frozen and in eval mode."""
    dtype = TORCH_DTYPES[args.dtype]
    tokenizer = load_pretrained(
        AutoTokenizer.from_pretrained,
        args.tokenizer_name_or_path or args.verifier_name_or_path,
        "tokenizer_name_or_path" if args.tokenizer_name_or_path else "verifier_name_or_path",
    )
    attention = {} if args.attn_implementation is None else {"attn_implementation": args.attn_implementation}
    load_seq2seq = AutoModelForSeq2SeqLM.from_pretrained
    verifier = load_pretrained(
        load_seq2seq, args.verifier_name_or_path, "verifier_name_or_path", dtype=dtype, **attention
    )
    drafter_dtype = TORCH_DTYPES[args.drafter_dtype or args.dtype]
    drafters = [load_drafter(entry, verifier, drafter_dtype) for entry in args.drafters]
    assistant = None
    if any(strategy.kind == "assisted" for strategy in args.resolved_strategies):
        assistant = load_pretrained(load_seq2seq, args.assistant_model, "assistant_model", dtype=dtype, **attention)
    roles = {"verifier": verifier}
    for index, drafter in enumerate(drafters):
        module = drafter_module(drafter)
        if module is not None:
            roles[f"drafter {index}"] = module
    if assistant is not None:
        roles["assistant"] = assistant
    kernel_choices = {}
    for role, model in roles.items():
        model.to(device).eval().requires_grad_(False)
        if args.prepack_linear and not args.check_only:
            # measured here, after the run's thread count is set: greedy and every strategy get the faster kernel;
            # a drafter's or an assistant's calls come right after the verifier's forward (prepacked first)
            partner = None if model is verifier else verifier
            kernel_choices[role] = prepack_where_faster(model, runs_after=partner)
            logger.info("%s linear layers: %s", role, "; ".join(c.describe() for c in kernel_choices[role]))
    for model in [verifier] + ([assistant] if assistant is not None else []):
        # every strategy passes `max_new_tokens`, which overrides a checkpoint's `max_length`; dropping it (on these
        # instances only) stops generate() from warning about the pair on every call
        model.generation_config.max_length = None
    return EvaluationModels(
        verifier=verifier, tokenizer=tokenizer, drafters=drafters, assistant=assistant, kernel_choices=kernel_choices
    )
