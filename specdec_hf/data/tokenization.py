"""Tokenizing (source, target) pairs with the verifier's tokenizer, for drafter training and distillation.

The drafter shares the verifier's vocabulary (Xia et al., 2023, arXiv 2203.16487, §3), so every id it reads or
predicts comes from the verifier's tokenizer: `check_tokenizer_matches` guards that, `tokenize_pairs` does the work
with one batched, cached `datasets.map`, and `default_source_prefix` gives the task prefix T5-style verifiers were
trained with.
"""

from __future__ import annotations

import logging

import datasets

logger = logging.getLogger(__name__)

__all__ = [
    "T5_LANGUAGE_NAMES",
    "check_tokenizer_matches",
    "default_source_prefix",
    "source_length_limit",
    "tokenize_pairs",
]

# Model types whose checkpoints expect a task prefix in the source text.
_PREFIX_MODEL_TYPES = ("t5", "mt5")
T5_LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}
# BOS is left out: several families (Marian, Pegasus) declare a config `bos_token_id` their tokenizer lacks.
_SPECIAL_IDS = ("pad_token_id", "eos_token_id")


def default_source_prefix(
    model_type: str, task: str | None, source_lang: str | None = None, target_lang: str | None = None
) -> str | None:
    """
    The task prefix a T5 / mT5 verifier expects (`"translate English to German: "`, `"summarize: "`).

    Args:
        model_type (`str`): `verifier.config.model_type`.
        task (`str`, *optional*): `"translation"` or `"summarization"`; None when unknown.
        source_lang, target_lang (`str`, *optional*): Language codes (`"en"`, `"de"`) for translation.

    Returns:
        `str` or None: the prefix, or None for other model types or an unknown task.

    Raises:
        `ValueError`: translation into or out of a language T5 was not trained on (pass `source_prefix` explicitly).
    """
    if model_type not in _PREFIX_MODEL_TYPES or task is None:
        return None
    if task == "summarization":
        return "summarize: "
    if task != "translation":
        raise ValueError(f"unknown task {task!r}: expected 'translation' or 'summarization'")
    unknown = [lang for lang in (source_lang, target_lang) if lang not in T5_LANGUAGE_NAMES]
    if unknown:
        raise ValueError(
            f"no T5 prefix for languages {unknown} (T5 knows {sorted(T5_LANGUAGE_NAMES)}); pass `source_prefix` "
            "explicitly (an empty string for none)"
        )
    return f"translate {T5_LANGUAGE_NAMES[source_lang]} to {T5_LANGUAGE_NAMES[target_lang]}: "


def check_tokenizer_matches(tokenizer, verifier_config) -> None:
    """
    Checks that `tokenizer` produces ids the verifier (and so its drafter) can read.

    Args:
        tokenizer (`PreTrainedTokenizerBase`): The tokenizer used for the data.
        verifier_config (`PretrainedConfig`): The verifier's config.

    Raises:
        `ValueError`: `len(tokenizer)` exceeds the verifier's `vocab_size`, or the pad or EOS id differs.
    """
    # Seq2seq configs keep the vocabulary size on the decoder side for composite models (e.g. EncoderDecoder).
    config = verifier_config.get_text_config(decoder=True)
    vocab_size = config.vocab_size
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the verifier's vocabulary has {vocab_size}: ids past "
            f"{vocab_size - 1} would index out of the embeddings. Load the verifier's own tokenizer "
            "(`AutoTokenizer.from_pretrained(<verifier>)`) or resize the verifier's embeddings."
        )
    for name in _SPECIAL_IDS:
        tokenizer_id, config_id = getattr(tokenizer, name, None), getattr(config, name, None)
        config_ids = config_id if isinstance(config_id, list) else [config_id]
        if tokenizer_id is not None and config_id is not None and tokenizer_id not in config_ids:
            raise ValueError(
                f"tokenizer {name} = {tokenizer_id} but the verifier's {name} = {config_id} "
                f"(tokenizer of {len(tokenizer)} tokens, verifier vocabulary {vocab_size}): they are not the same "
                "vocabulary. Load the verifier's own tokenizer (`AutoTokenizer.from_pretrained(<verifier>)`)."
            )


def source_length_limit(tokenizer, model) -> int:
    """The longest source `model` and `tokenizer` can read: the least of the limits they state (1024 if none does)."""
    limits = [
        getattr(tokenizer, "model_max_length", None),
        getattr(model.config, "max_position_embeddings", None),
        getattr(model.config, "n_positions", None),
    ]
    # tokenizers without a limit state a huge sentinel (int(1e30)): not a limit
    limits = [int(limit) for limit in limits if limit is not None and 0 < limit < 1_000_000]
    return min(limits) if limits else 1024


def tokenize_pairs(
    dataset: datasets.Dataset,
    tokenizer,
    source_prefix: str | None = None,
    max_source_length: int = 1024,
    max_target_length: int | None = 128,
    overlong: str = "drop",
    with_targets: bool = True,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """
    Tokenizes the `source` (and `target`) columns with one batched `map` (cached when `dataset` comes from files).

    Args:
        dataset (`datasets.Dataset`): Pairs with string columns `source` and `target` (see `load_text_pairs`).
        tokenizer (`PreTrainedTokenizerBase`): The verifier's tokenizer.
        source_prefix (`str`, *optional*): Prepended to every source (T5's `"summarize: "`, see
            `default_source_prefix`).
        max_source_length (`int`): Most source tokens, special tokens included.
        max_target_length (`int`, *optional*): Most target tokens, special tokens included; None for no limit.
        overlong (`str`): `"drop"` removes pairs over either limit (the count is logged); `"truncate"` cuts them
            (the tokenizer keeps the final EOS).
        with_targets (`bool`): Also tokenize `target` into `labels`; False tokenizes sources only (distillation).
        num_proc (`int`, *optional*): Processes for `map` / `filter`.

    Returns:
        `datasets.Dataset`: the input columns plus `input_ids` (`list[int]` of length ≤ `max_source_length`) and,
        when `with_targets`, `labels` (target ids ending with EOS, no decoder start token; length ≤
        `max_target_length`). No padding: batches are padded by the collator.
    """
    if overlong not in ("drop", "truncate"):
        raise ValueError(f"`overlong` must be 'drop' or 'truncate', got {overlong!r}")
    missing = [
        column for column in ("source",) + (("target",) if with_targets else ()) if column not in dataset.column_names
    ]
    if missing:
        raise ValueError(f"dataset lacks column(s) {missing} (columns: {dataset.column_names}); see load_text_pairs")
    truncate = overlong == "truncate"
    tokenized = dataset.map(
        _tokenize_batch,
        batched=True,
        fn_kwargs={
            "tokenizer": tokenizer,
            "source_prefix": source_prefix or "",
            # Tokenize in full when dropping: a truncated sequence could not be told from one that fits.
            "max_source_length": max_source_length if truncate else None,
            "max_target_length": max_target_length if truncate else None,
            "with_targets": with_targets,
        },
        num_proc=num_proc,
        desc="Tokenizing",
    )
    if truncate:
        return tokenized
    kept = tokenized.filter(
        _fits,
        batched=True,
        input_columns=["input_ids", "labels"] if with_targets else ["input_ids"],
        fn_kwargs={"max_source_length": max_source_length, "max_target_length": max_target_length},
        num_proc=num_proc,
        desc="Dropping over-long pairs",
    )
    dropped = tokenized.num_rows - kept.num_rows
    if dropped:
        logger.warning(
            "dropped %d of %d pairs longer than %d source / %s target tokens",
            dropped,
            tokenized.num_rows,
            max_source_length,
            max_target_length,
        )
    return kept


def _tokenize_batch(
    batch: dict[str, list],
    tokenizer,
    source_prefix: str,
    max_source_length: int | None,
    max_target_length: int | None,
    with_targets: bool,
) -> dict[str, list[list[int]]]:
    sources = [source_prefix + source for source in batch["source"]]
    out = {
        "input_ids": tokenizer(sources, truncation=max_source_length is not None, max_length=max_source_length)[
            "input_ids"
        ]
    }
    if with_targets:
        out["labels"] = tokenizer(
            text_target=batch["target"], truncation=max_target_length is not None, max_length=max_target_length
        )["input_ids"]
    return out


def _fits(
    input_ids: list[list[int]],
    labels: list[list[int]] | None = None,
    max_source_length: int = 1024,
    max_target_length: int | None = None,
) -> list[bool]:
    keep = [len(ids) <= max_source_length for ids in input_ids]
    if labels is not None and max_target_length is not None:
        keep = [k and len(ids) <= max_target_length for k, ids in zip(keep, labels, strict=True)]
    return keep
