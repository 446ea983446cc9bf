"""Sequence-level knowledge distillation: the verifier's own outputs on the training sources, as a reusable dataset.

The Spec-Drafter learns to predict what the *verifier* will say, not the human reference (Xia et al., 2023,
arXiv 2203.16487, §3.3; sequence-level KD as in Kim & Rush, 2016). This command runs the verifier once over the
sources (greedy or beam search, batched by length) and writes, to `output_dir`, a `datasets.Dataset` with columns

* `id`, `source`: the example and its text;
* `target`: the verifier's output, decoded with `skip_special_tokens=True`;
* `reference`: the original (human) target;
* `input_ids`: the source ids as the verifier saw them (task prefix and truncation applied);
* `target_ids`: the verifier's output ids from the decoder start token up to and including the first EOS, no
  padding — what drafter training consumes.

The work is written in shards (`shards/shard-00000.parquet`, …; each written under a temporary name, then renamed),
so an interrupted run resumes where it stopped: finished shards are checked against the data and skipped. The merged
dataset (`datasets.load_from_disk(output_dir)`) and `distillation_config.json` are written at the end.

Example:

```bash
python -m specdec_hf.distillation --verifier runs/demo_verifier/best --dataset_name debian_en_de \\
    --split train --output_dir data/distilled/debian_en_de --batch_size 64 --max_new_tokens 128
```
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import transformers
from accelerate import PartialState
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from .config_parsing import parse_yaml_and_cli
from .data.loading import DataArguments, load_text_pairs
from .data.padding import pad_token_ids, trim_at_eos
from .data.tokenization import check_tokenizer_matches, default_source_prefix, source_length_limit, tokenize_pairs
from .dtypes import TORCH_DTYPES
from .files import write_json_atomic
from .model_files import load_pretrained

logger = logging.getLogger(__name__)

__all__ = [
    "DistillationArguments",
    "DistillationSettings",
    "distill",
    "load_distilled_dataset",
    "main",
    "run_distillation",
]

CONFIG_NAME = "distillation_config.json"
SHARDS_DIR = "shards"
_SETTINGS_NAME = "settings.json"
_MERGE_CACHE_DIR = ".merge_cache"
# Files `Dataset.save_to_disk` writes; removed by `overwrite` along with the shards.
_SAVED_DATASET_FILES = ("dataset_info.json", "state.json")


@dataclass(kw_only=True)
class DistillationSettings:
    """How `distill` decodes the sources and where it writes the distilled dataset."""

    output_dir: str = field(metadata={"help": "Directory of the shards, the merged dataset and its config."})
    num_beams: int = field(default=1, metadata={"help": "1 for greedy decoding, more for beam search."})
    batch_size: int = field(default=32, metadata={"help": "Sources per `generate` call (sorted by length)."})
    max_new_tokens: int = field(default=128, metadata={"help": "Most tokens generated per source."})
    source_prefix: str | None = field(
        default=None,
        metadata={"help": "Prepended to each source (default: the T5 task prefix for t5/mt5 verifiers; '' for none)."},
    )
    max_source_length: int | None = field(
        default=None,
        metadata={"help": "Longer sources are truncated (default: the longest the verifier and tokenizer can read)."},
    )
    shard_size: int = field(default=1024, metadata={"help": "Examples per shard (the unit of resumption)."})
    max_shards: int | None = field(
        default=None, metadata={"help": "Stop after writing this many new shards (time-boxed runs); rerun to go on."}
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Discard shards and outputs of an earlier run in `output_dir`."}
    )

    def __post_init__(self):
        for name in ("num_beams", "batch_size", "max_new_tokens", "max_source_length", "shard_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be at least 1, got {getattr(self, name)}")
        if self.max_shards is not None and self.max_shards < 1:
            raise ValueError(f"`max_shards` must be at least 1, got {self.max_shards}")


@dataclass(kw_only=True)
class DistillationArguments(DistillationSettings):
    """The command line's arguments: which verifier to load, how, and which split to distill (the data:
    `DataArguments`), besides the [`DistillationSettings`]."""

    verifier: str = field(metadata={"help": "Path or Hub id of the verifier (a seq2seq model)."})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer path or id (default: the verifier's)."})
    split: str | None = field(
        default=None, metadata={"help": "Split whose sources are distilled (default: the data's `train_split`)."}
    )
    device: str | None = field(default=None, metadata={"help": "`cuda` or `cpu` (default: cuda when available)."})
    dtype: str = field(default="float32", metadata={"help": f"Verifier weights dtype: {', '.join(TORCH_DTYPES)}."})

    def __post_init__(self):
        super().__post_init__()
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"`dtype` must be one of {list(TORCH_DTYPES)}, got {self.dtype!r}")


def _position_table(verifier) -> int | None:
    """The length of the verifier's learned position table (`max_position_embeddings`), `None` without one."""
    return getattr(verifier.config, "max_position_embeddings", None)


def _checked_max_source_length(requested: int | None, tokenizer, verifier) -> int:
    """The source length a run truncates to: `requested`, or the least limit the verifier and its tokenizer state.

    Raises `ValueError` above the verifier's learned position table (`max_position_embeddings`): such a source would
    index past it mid-run, after hours of decoding. Other stated limits (a tokenizer's `model_max_length`, a T5
    config's `n_positions`) are defaults, not walls: relative positions read longer sources.
    """
    if requested is None:
        return source_length_limit(tokenizer, verifier)
    table = _position_table(verifier)
    if table is not None and requested > table:
        raise ValueError(
            f"`max_source_length` is {requested}, but the verifier's position embeddings cover {table} tokens: "
            f"pass `max_source_length` <= {table}, or leave it unset for the verifier's limit"
        )
    return requested


def distill(
    verifier: transformers.PreTrainedModel,
    tokenizer: transformers.PreTrainedTokenizerBase,
    dataset: datasets.Dataset,
    args: DistillationSettings,
    metadata: dict[str, Any] | None = None,
    progress: bool = True,
    state: PartialState | None = None,
) -> datasets.Dataset | None:
    """
    Decodes every source with the verifier and writes the distilled dataset to `args.output_dir`, resumably.

    The verifier's `generation_config` applies, except for `num_beams`, `do_sample=False` and `max_new_tokens`.

    Args:
        verifier (`PreTrainedModel`): A seq2seq model, on the device and in the dtype to run.
        tokenizer (`PreTrainedTokenizerBase`): Its tokenizer (checked with `check_tokenizer_matches`).
        dataset (`datasets.Dataset`): Column `source` (str), optionally `target` (kept as `reference`) and `id`.
        args ([`DistillationSettings`], or the command line's [`DistillationArguments`]): Where the shards, the
            merged dataset and `distillation_config.json` go (`output_dir`); the decoding (`num_beams`,
            `batch_size`: sources per `generate` call, each shard sorted by source length before batching;
            `max_new_tokens`; `source_prefix`, e.g. T5's `"summarize: "`; `max_source_length`, longer sources
            truncated with EOS kept, None for the longest the verifier and its tokenizer read); `shard_size`, the
            unit of resumption; `max_shards`, stop after writing this many new shards in this call;
            `overwrite_output_dir`, discard an earlier run's outputs first.
        metadata (`dict`, *optional*): Extra JSON-serialisable facts for `distillation_config.json` (e.g. the data).
        progress (`bool`): Show a tqdm progress bar.
        state (`accelerate.PartialState`, *optional*): The processes sharing the work (e.g. under `accelerate
            launch`; `None`: this process alone). Process p decodes the shards whose index is p modulo the number
            of processes, and only process 0 writes the settings and the merged dataset, after a barrier. The
            result is the single-process one, row for row.

    Returns:
        `datasets.Dataset` with `dataset.num_rows` rows and columns `id` (when given), `source`, `target`,
        `reference` (when given), `input_ids` and `target_ids` (both `list[int]`), or None when `max_shards` stopped
        the run before the end (rerun to finish).

    Raises:
        `ValueError`: `output_dir` holds a run with other settings or other data (use `overwrite` or another
            directory), the tokenizer does not match the verifier, or `max_source_length` exceeds the verifier's
            position embeddings.
    """
    check_tokenizer_matches(tokenizer, verifier.config)
    # checked before an overwrite removes anything
    max_source_length = _checked_max_source_length(args.max_source_length, tokenizer, verifier)
    if "source" not in dataset.column_names:
        raise ValueError(f"the dataset needs a `source` column (columns: {dataset.column_names}); see load_text_pairs")
    if dataset.num_rows == 0:
        raise ValueError("the dataset has no rows: nothing to distill (check the split and `max_samples`)")
    if "target" in dataset.column_names:
        dataset = dataset.rename_column("target", "reference")  # `target` becomes the verifier's output
    process_index, num_processes = (0, 1) if state is None else (state.process_index, state.num_processes)
    barrier = (lambda: None) if state is None else state.wait_for_everyone
    main_process = process_index == 0
    output_dir = Path(args.output_dir)
    shards_dir = output_dir / SHARDS_DIR
    if args.overwrite_output_dir and main_process:
        _remove_outputs(output_dir)
    barrier()
    shard_size = args.shard_size
    settings = {
        "verifier": verifier.name_or_path,
        # the weights themselves: another model saved to the same path must not add to these shards
        "verifier_sha256": weights_digest(verifier),
        "tokenizer": tokenizer.name_or_path,
        "dtype": str(verifier.dtype).removeprefix("torch."),
        "num_beams": args.num_beams,
        "max_new_tokens": args.max_new_tokens,
        "source_prefix": args.source_prefix or "",
        "max_source_length": max_source_length,
        "shard_size": shard_size,
    }
    if main_process:
        _check_or_write_settings(shards_dir, settings, _position_table(verifier))
    barrier()
    if not main_process:
        _check_or_write_settings(shards_dir, settings, _position_table(verifier))  # written by process 0: checked
    sources_sha256 = _sources_digest(dataset)
    finished = _load_finished(output_dir, settings, sources_sha256)
    if finished is not None:
        logger.info("%s already holds the finished distillation (%d examples)", output_dir, finished.num_rows)
        return finished

    start_time = time.perf_counter()
    tokenized = tokenize_pairs(
        dataset,
        tokenizer,
        source_prefix=args.source_prefix,
        max_source_length=max_source_length,
        overlong="truncate",
        with_targets=False,
    )
    num_shards = math.ceil(dataset.num_rows / shard_size)
    shard_paths = [shards_dir / f"shard-{index:05d}.parquet" for index in range(num_shards)]
    mine = range(process_index, num_shards, num_processes)
    todo = [index for index in mine if not _is_done(shard_paths[index], tokenized, index, shard_size)]
    my_rows = sum(_shard_rows(index, shard_size, dataset.num_rows) for index in mine)
    done_rows = my_rows - sum(_shard_rows(index, shard_size, dataset.num_rows) for index in todo)
    if done_rows:
        logger.info("resuming: %d of %d shards of this process already written", len(mine) - len(todo), len(mine))
    bar = tqdm(total=my_rows, initial=done_rows, unit="ex", desc="Distilling", disable=not progress)
    for written, index in enumerate(todo):
        if args.max_shards is not None and written >= args.max_shards:
            logger.info("stopped after %d new shards (max_shards); rerun to continue", written)
            break
        rows = tokenized[index * shard_size : (index + 1) * shard_size]
        rows.update(_decode_shard(verifier, tokenizer, rows["input_ids"], args, bar))
        _write_shard(rows, shard_paths[index])
    bar.close()
    barrier()  # every process's shards are written (or it stopped at max_shards)
    missing = [path.name for path in shard_paths if not path.is_file()]
    if missing and args.max_shards is None:
        raise RuntimeError(
            f"{len(missing)} shard(s) ({', '.join(missing[:3])}, ...) are missing after every process finished: the "
            f"processes do not share {shards_dir} (several machines need a shared filesystem for `output_dir`)."
        )
    if missing:
        return None

    if main_process:
        merged = _merge_shards(shard_paths, output_dir)
        config = {
            **(metadata or {}),  # first, so that it cannot shadow the settings a resumed run is checked against
            **settings,
            "generation_config": verifier.generation_config.to_diff_dict(),
            "num_examples": merged.num_rows,
            "sources_sha256": sources_sha256,
            "columns": merged.column_names,
            "seconds_last_run": round(time.perf_counter() - start_time, 1),
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
            "num_processes": num_processes,
        }
        write_json_atomic(output_dir / CONFIG_NAME, config)
        logger.info("wrote %d distilled examples to %s", merged.num_rows, output_dir)
    barrier()
    return load_distilled_dataset(output_dir)


def load_distilled_dataset(path: str | os.PathLike, vocab_size: int | None = None) -> datasets.Dataset:
    """
    Loads the dataset a finished `distill` run wrote (memory-mapped), for drafter training.

    Args:
        path (`str` or `os.PathLike`): The run's `output_dir`.
        vocab_size (`int`, *optional*): The verifier's vocabulary size: every id must lie in `[0, vocab_size)`.

    Returns:
        `datasets.Dataset` with columns `input_ids` and `target_ids` (`list[int]`; `target_ids` from the decoder
        start token up to and including the first EOS) besides `source`, `target`, `reference` and `id`.

    Raises:
        `FileNotFoundError`: `path` is missing or holds an unfinished run (the message says how to finish it).
        `ValueError`: the dataset lacks `input_ids` or `target_ids`, holds them as anything but lists of integers,
            has no rows, or (with `vocab_size`) holds ids outside the vocabulary.
        `OSError`: a file of the dataset cannot be read (the message names the directory).
    """
    path = Path(path)
    if not (path / CONFIG_NAME).is_file():
        state = "holds an unfinished distillation" if (path / SHARDS_DIR).is_dir() else "is not a distilled dataset"
        raise FileNotFoundError(
            f"{str(path)!r} {state}: run (or rerun, to resume) `python -m specdec_hf.distillation --verifier <verifier> "
            f"--dataset_name <data> --output_dir {path}`"
        )
    fix = "rerun the distillation with `--overwrite_output_dir`"
    state = path / "state.json"
    if state.is_file() and json.loads(state.read_text(encoding="utf-8")).get("_data_files") == []:
        # a dataset of no rows is saved without data files, which `load_from_disk` fails on with an IndexError
        raise ValueError(f"{str(path)!r} holds no rows: nothing to train on; {fix} on a split with data.")
    try:
        dataset = datasets.load_from_disk(str(path))
    except (OSError, pa.ArrowException) as err:  # a truncated `data-*.arrow` file: Arrow names no file
        raise OSError(
            f"the distilled dataset in {str(path)!r} cannot be read ({err}); one of its files is damaged (e.g. "
            "truncated by a full disk): rerun the distillation with `--overwrite_output_dir`."
        ) from err
    missing = [column for column in ("input_ids", "target_ids") if column not in dataset.column_names]
    if missing:
        raise ValueError(f"{str(path)!r} lacks column(s) {missing} (columns: {dataset.column_names})")
    for column in ("input_ids", "target_ids"):
        arrow_type = dataset.data.schema.field(column).type
        if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) or not pa.types.is_integer(
            arrow_type.value_type
        ):
            raise ValueError(
                f"{str(path)!r}: column `{column}` holds {arrow_type}, not lists of token ids (integers): it was not "
                f"written by `specdec_hf.distillation`; {fix}."
            )
    if dataset.num_rows == 0:
        raise ValueError(f"{str(path)!r} holds no rows: nothing to train on; {fix} on a split with data.")
    if vocab_size is not None:
        for column in ("input_ids", "target_ids"):
            ids = pc.list_flatten(dataset.data.column(column))
            low, high = pc.min(ids).as_py(), pc.max(ids).as_py()
            if low is not None and (low < 0 or high >= vocab_size):
                raise ValueError(
                    f"{str(path)!r}: column `{column}` holds ids from {low} to {high}, outside the verifier's "
                    f"vocabulary [0, {vocab_size}): it was distilled with another verifier or tokenizer; {fix} and "
                    "this verifier."
                )
    return dataset


@torch.no_grad()
def _decode_shard(verifier, tokenizer, input_ids: list[list[int]], args: DistillationSettings, bar) -> dict[str, list]:
    """Generates for one shard, longest sources first (least padding per batch), and restores the shard's order."""
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else verifier.config.pad_token_id
    eos_token_id = verifier.generation_config.eos_token_id
    order = sorted(range(len(input_ids)), key=lambda i: -len(input_ids[i]))
    target_ids: list[list[int] | None] = [None] * len(input_ids)
    for start in range(0, len(order), args.batch_size):
        rows = order[start : start + args.batch_size]
        batch_ids, attention_mask = pad_token_ids([input_ids[i] for i in rows], pad_token_id)
        sequences = verifier.generate(
            input_ids=batch_ids.to(verifier.device),
            attention_mask=attention_mask.to(verifier.device),
            num_beams=args.num_beams,
            do_sample=False,
            # The decoder starts from one token, so this is `max_new_tokens`; given as `max_length` because
            # `max_new_tokens` makes generate warn on every call when the verifier's config sets `max_length`.
            max_length=args.max_new_tokens + 1,
        )
        for i, ids in zip(rows, trim_at_eos(sequences, eos_token_id), strict=True):
            target_ids[i] = ids
        bar.update(len(rows))
    return {"target": tokenizer.batch_decode(target_ids, skip_special_tokens=True), "target_ids": target_ids}


# ----------------------------------------------------------------------------------------------------------------
# Shards and outputs on disk
# ----------------------------------------------------------------------------------------------------------------
def _write_shard(rows: dict[str, list], path: Path) -> None:
    """Writes one shard under a temporary name, then renames it, so a kill never leaves a half-written shard."""
    columns = [name for name in ("id", "source", "target", "reference", "input_ids", "target_ids") if name in rows]
    table = pa.table({name: rows[name] for name in columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    pq.write_table(table, temporary)
    os.replace(temporary, path)


def _merge_shards(shard_paths: list[Path], output_dir: Path) -> datasets.Dataset:
    """Concatenate the shards, in order, into the saved dataset without holding the rows in Python memory.

    `datasets` converts the parquet files into a memory-mapped Arrow cache (under `output_dir`, removed afterwards)
    and `save_to_disk` copies it batch by batch: the peak memory is a few record batches, not the corpus.
    """
    cache_dir = output_dir / _MERGE_CACHE_DIR
    merged = datasets.Dataset.from_parquet([str(path) for path in shard_paths], cache_dir=str(cache_dir))
    merged.save_to_disk(str(output_dir))
    del merged
    shutil.rmtree(cache_dir, ignore_errors=True)
    return datasets.load_from_disk(str(output_dir))


def _is_done(path: Path, tokenized: datasets.Dataset, index: int, shard_size: int) -> bool:
    """True when shard `index` exists and holds exactly this data's sources for that slice."""
    if not path.is_file():
        return False
    try:
        written = pq.read_table(path, columns=["source"]).column("source").to_pylist()
    except (OSError, pa.ArrowException) as err:  # damaged (pyarrow: "Parquet magic bytes not found"): decode again
        logger.warning("%s cannot be read (%s): decoding its shard again", path, err)
        return False
    expected = tokenized[index * shard_size : (index + 1) * shard_size]["source"]
    if written == expected:
        return True
    shorter, longer = sorted((written, expected), key=len)
    if longer[: len(shorter)] == shorter:
        return False  # the last shard of a run over fewer or more examples of the same data: recompute it
    raise ValueError(
        f"{path} holds other sources than this data (shard {index}): {path.parent.parent} belongs to a run over "
        "other data. Use another `output_dir`, or `--overwrite_output_dir` to discard it."
    )


def _shard_rows(index: int, shard_size: int, num_rows: int) -> int:
    return min(shard_size, num_rows - index * shard_size)


def _check_or_write_settings(shards_dir: Path, settings: dict[str, Any], position_table: int | None = None) -> None:
    """Refuses to mix shards decoded with other settings; records the settings of a new run.

    A setting the earlier run did not record (`verifier_sha256`, added later) is taken as matching and recorded. So is
    a longer `max_source_length` than the verifier's `position_table`, where this run truncates at the table (the
    default was 1024 whatever the verifier): that run could not decode a source beyond the table, so its shards hold
    none, and truncating at the table from here on writes what it would have; the record is updated.
    """
    path = shards_dir / _SETTINGS_NAME
    if path.is_file():
        previous = json.loads(path.read_text(encoding="utf-8"))
        recorded = previous.get("max_source_length")
        longer_limit = (
            position_table is not None
            and settings["max_source_length"] == position_table
            and isinstance(recorded, int)
            and recorded > position_table
        )
        differ = {
            key: (previous[key], value)
            for key, value in settings.items()
            if key in previous and previous[key] != value and not (key == "max_source_length" and longer_limit)
        }
        if differ:
            changes = ", ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in differ.items())
            reason = (
                " (the verifier's weights changed: another model was saved to its path)"
                if "verifier_sha256" in differ
                else ""
            )
            raise ValueError(
                f"{shards_dir.parent} holds a distillation with other settings{reason} ({changes}). Use another "
                "`output_dir`, or `--overwrite_output_dir` to discard it."
            )
        if settings.keys() - previous.keys() or longer_limit:
            write_json_atomic(path, {**previous, **settings})
        return
    write_json_atomic(path, settings)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a model's parameters and buffers (names, dtypes, shapes and bytes): identifies the weights
    whatever path they were loaded from."""
    digest = hashlib.sha256()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)}".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _sources_digest(dataset: datasets.Dataset) -> str:
    """SHA-256 of the sources, in order: identifies the data a finished run was made from."""
    digest = hashlib.sha256()
    for batch in dataset.select_columns(["source"]).iter(batch_size=10_000):
        for source in batch["source"]:
            digest.update(source.encode("utf-8") + b"\0")
    return digest.hexdigest()


def _load_finished(output_dir: Path, settings: dict[str, Any], sources_sha256: str) -> datasets.Dataset | None:
    """The merged dataset of a finished run with these settings over these sources, else None."""
    path = output_dir / CONFIG_NAME
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("sources_sha256") != sources_sha256 or any(config.get(k) != v for k, v in settings.items()):
        return None
    return datasets.load_from_disk(str(output_dir))


def _remove_outputs(output_dir: Path) -> None:
    """Removes what `distill` writes (and nothing else a user may keep in `output_dir`)."""
    shutil.rmtree(output_dir / SHARDS_DIR, ignore_errors=True)
    shutil.rmtree(output_dir / _MERGE_CACHE_DIR, ignore_errors=True)
    for name in (CONFIG_NAME, *_SAVED_DATASET_FILES):
        (output_dir / name).unlink(missing_ok=True)
    for path in output_dir.glob("data-*-of-*.arrow"):
        path.unlink()


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------
def run_distillation(data_args: DataArguments, args: DistillationArguments) -> datasets.Dataset | None:
    """
    Loads the verifier, its tokenizer and the sources, then runs `distill`.

    Args:
        data_args (`DataArguments`): The data (`args.split` of it is distilled).
        args (`DistillationArguments`): The verifier and decoding settings.

    Returns:
        As `distill`.
    """
    # one process per device under `accelerate launch` / torchrun (a single plain process otherwise)
    state = PartialState(cpu=args.device == "cpu")
    device = args.device or state.device
    verifier = load_pretrained(
        AutoModelForSeq2SeqLM.from_pretrained, args.verifier, "verifier", dtype=TORCH_DTYPES[args.dtype]
    )
    verifier = verifier.to(device).eval()
    tokenizer_argument = "tokenizer" if args.tokenizer else "verifier"
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, args.tokenizer or args.verifier, tokenizer_argument)
    if args.source_prefix is None:
        languages = data_args.languages or ()
        args = replace(
            args, source_prefix=default_source_prefix(verifier.config.model_type, data_args.task, *languages)
        )
    split = args.split or data_args.train_split
    with state.main_process_first():  # one process downloads and caches the data, the others read the cache
        dataset = load_text_pairs(data_args, split)
    metadata = {"data": {**asdict(data_args), "split": split}}
    return distill(verifier, tokenizer, dataset, args, metadata, progress=state.is_local_main_process, state=state)


def parse_args(argv: list[str] | None = None) -> tuple[DataArguments, DistillationArguments]:
    """Reads `--config <yaml>` (keys of both dataclasses) as defaults, then the other flags as overrides."""
    data_args, args = parse_yaml_and_cli([DataArguments, DistillationArguments], argv)
    return data_args, args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    data_args, args = parse_args(argv)
    result = run_distillation(data_args, args)
    if result is None:
        print(f"stopped early (max_shards={args.max_shards}); rerun the same command to continue")
    else:
        print(f"distilled {result.num_rows} examples into {args.output_dir} (datasets.load_from_disk)")


if __name__ == "__main__":
    main()
