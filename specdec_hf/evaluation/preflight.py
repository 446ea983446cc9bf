"""Checks that fail fast, before any long work: the output directory, the data, and the models' compatibility.

Each raises `ValueError` (or `PermissionError` / `NotADirectoryError` for the output directory) with the reason and
the fix.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import datasets

from ..data.tokenization import check_tokenizer_matches
from ..drafting import validate_drafter
from ..generation import as_drafter
from .strategies import Strategy

logger = logging.getLogger(__name__)

__all__ = ["check_models", "check_output_dir", "check_pairs"]


def check_output_dir(output_dir: str | os.PathLike) -> Path:
    """Create `output_dir` if needed and make sure files can be written in it.

    Raises:
        NotADirectoryError: `output_dir` (or a parent) is a file.
        PermissionError: the directory cannot be created or written.
    """
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"output_dir {str(path)!r} is a file, not a directory: pick another --output_dir.")
    try:
        (path / "generations").mkdir(parents=True, exist_ok=True)
        probe = path / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except NotADirectoryError as err:
        raise NotADirectoryError(
            f"output_dir {str(path)!r} cannot be created: a parent is a file ({err}). Pick another --output_dir."
        ) from err
    except OSError as err:
        raise PermissionError(
            f"output_dir {str(path)!r} is not writable ({err.strerror or err}). Pick another --output_dir."
        ) from err
    return path


def check_pairs(pairs: datasets.Dataset, description: str) -> None:
    """The evaluation data has rows and a `source` and a `target` (reference) column.

    Raises:
        ValueError: for an empty split or a missing column.
    """
    missing = [column for column in ("source", "target") if column not in pairs.column_names]
    if missing:
        raise ValueError(
            f"{description} lacks the column(s) {missing} (columns: {pairs.column_names}): the references are "
            "needed for BLEU/chrF/ROUGE. Set `source_column`/`target_column` (or `source_lang`/`target_lang`)."
        )
    if pairs.num_rows == 0:
        raise ValueError(
            f"{description} has no rows with a non-empty source and reference: check the split name "
            "(`test_split`), the files, the columns and `limit`."
        )


def check_models(
    verifier,
    tokenizer,
    drafters: list,
    drafter_paths: list[str],
    assistant,
    strategies: list[Strategy],
    max_new_tokens: int,
) -> None:
    """The tokenizer, drafters and assistant fit the verifier, and each speculative setting fits its drafter.

    Raises:
        ValueError: naming the model, the mismatch and the fix.
    """
    check_tokenizer_matches(tokenizer, verifier.config)
    vocab_size = verifier.config.get_text_config(decoder=True).vocab_size
    for path, drafter in zip(drafter_paths, drafters, strict=True):
        try:
            validate_drafter(as_drafter(drafter), vocab_size)
        except ValueError as err:
            raise ValueError(f"drafter {path!r}: {err}") from err
    if assistant is not None:
        assistant_vocab = assistant.config.get_text_config(decoder=True).vocab_size
        if assistant_vocab != vocab_size:
            raise ValueError(
                f"assistant_model has vocabulary size {assistant_vocab}, the verifier {vocab_size}: transformers' "
                "assisted generation needs an assistant with the verifier's tokenizer (a smaller model of the "
                "same family)."
            )
        if not getattr(assistant.config, "is_encoder_decoder", False):
            raise ValueError("assistant_model must be an encoder-decoder model, like the verifier.")
    for strategy in strategies:
        if strategy.kind != "speculative":
            continue
        drafter = drafters[strategy.drafter_index]
        path = drafter_paths[strategy.drafter_index]
        contract = as_drafter(drafter)
        if not isinstance(strategy.num_draft_tokens, int):  # "auto": within the drafter's limits by construction
            continue
        # None: no limit (the drafting contract's default)
        limit = getattr(contract, "max_draft_tokens", None)
        if limit is not None and strategy.num_draft_tokens > limit:
            raise ValueError(
                f"strategy {strategy.name!r} drafts k={strategy.num_draft_tokens} tokens but drafter {path!r} has "
                f"{limit} mask slots (`max_draft_tokens`): use k <= {limit}."
            )
        positions = getattr(contract, "max_positions", None)
        if positions is not None and 1 + max_new_tokens + strategy.num_draft_tokens > positions:
            # not an error: the loop drafts within the drafter's positions and lets the verifier step alone past them
            logger.info(
                "strategy %s: drafter %s places %d positions, so it drafts less near position %d and not past it",
                strategy.name, path, positions, positions,
            )  # fmt: skip
