"""Loading (source, target) text pairs for drafter distillation and evaluation, with one schema for every source.

Whatever the origin — a Hub dataset with its own loading code (WMT14 EN↔DE, WMT16 EN↔RO, CNN/DailyMail, XSum), local
JSONL / JSON / CSV / TSV / Parquet files, or the offline Debian corpora built by `specdec_hf.data.debian_corpus` —
`load_text_pairs` returns a `datasets.Dataset` with three string columns:

* `source`: the text the verifier reads (an English sentence, an article);
* `target`: the human reference (its translation, its summary);
* `id`: the dataset's own id where it has one (CNN/DailyMail, XSum, `debian_sum`), else the row number in the split.

Example:

```python
from specdec_hf.data import DataArguments, load_text_pairs

train = load_text_pairs(DataArguments(dataset_name="wmt14", source_lang="en", target_lang="de"), "train")
local = load_text_pairs(DataArguments(data_files=["train=pairs.tsv"]), "train")  # columns `source`, `target`
debian = load_text_pairs(DataArguments(dataset_name="debian_en_de"), "validation")
```
"""

from __future__ import annotations

import glob
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import datasets
import pyarrow as pa
from datasets.exceptions import DatasetGenerationError

from .local_files import check_not_empty, explain_read_error

logger = logging.getLogger(__name__)

__all__ = [
    "KNOWN_DATASETS",
    "DataArguments",
    "KnownDataset",
    "load_text_pair_splits",
    "load_text_pairs",
    "sample_indices",
]

PAIR_FEATURES = datasets.Features(
    {"id": datasets.Value("string"), "source": datasets.Value("string"), "target": datasets.Value("string")}
)
# file suffix -> (`datasets` packaged builder, extra builder arguments)
_BUILDERS = {
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
    # `keep_default_na=False`: a text such as "NA" or "null" stays a string instead of becoming a missing value.
    ".csv": ("csv", {"keep_default_na": False}),
    # quoting=3 (csv.QUOTE_NONE): TSV corpora contain unbalanced quotes, which must not start quoted fields.
    ".tsv": ("csv", {"delimiter": "\t", "quoting": 3, "keep_default_na": False}),
}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")
# The feature `datasets` (4 and later) gives a nested field whose rows differ in shape; none in older versions.
_JSON_FEATURE = getattr(datasets, "Json", ())
# Column pairs recognised in local files when no columns are given, in order of preference.
_DEFAULT_COLUMN_PAIRS = (("source", "target"), ("document", "summary"), ("article", "highlights"))


@dataclass(frozen=True)
class KnownDataset:
    """
    A registered dataset: where it lives and which columns hold the (source, target) pair.

    Args:
        path (`str`):
            The Hub id, or for a local corpus its default directory (relative to the working directory).
        task (`str`):
            `"translation"` (pair nested as `{"translation": {lang: text}}`) or `"summarization"`.
        config_name (`str`, *optional*):
            The Hub configuration (`"de-en"`, `"3.0.0"`).
        languages (`tuple[str, str]`, *optional*):
            Default `(source_lang, target_lang)` of a translation dataset.
        source_column, target_column (`str`, *optional*):
            The columns of a summarization dataset.
        build_command (`str`, *optional*):
            For a local corpus: the command that builds it; `{dir}` stands for the directory.
    """

    path: str
    task: str
    config_name: str | None = None
    languages: tuple[str, str] | None = None
    source_column: str | None = None
    target_column: str | None = None
    build_command: str | None = None

    @property
    def is_local(self) -> bool:
        return self.build_command is not None


KNOWN_DATASETS: dict[str, KnownDataset] = {
    # The canonical ids moved under organisations when `datasets` dropped loading scripts; both names are accepted.
    "wmt14": KnownDataset("wmt/wmt14", "translation", config_name="de-en", languages=("en", "de")),
    "wmt16": KnownDataset("wmt/wmt16", "translation", config_name="ro-en", languages=("en", "ro")),
    "cnn_dailymail": KnownDataset(
        "abisee/cnn_dailymail",
        "summarization",
        config_name="3.0.0",
        source_column="article",
        target_column="highlights",
    ),
    "xsum": KnownDataset("EdinburghNLP/xsum", "summarization", source_column="document", target_column="summary"),
    "debian_en_de": KnownDataset(
        "data/debian_en_de",
        "translation",
        languages=("en", "de"),
        build_command="python -m specdec_hf.data.debian_corpus --task translation --output_dir {dir}",
    ),
    "debian_sum": KnownDataset(
        "data/debian_sum",
        "summarization",
        source_column="document",
        target_column="summary",
        build_command="python -m specdec_hf.data.debian_corpus --task summarization --output_dir {dir}",
    ),
}
_ALIASES = {entry.path: name for name, entry in KNOWN_DATASETS.items() if not entry.is_local}


@dataclass
class DataArguments:
    """
    Which text pairs to load; usable with `transformers.HfArgumentParser` (command line) and from YAML.

    Exactly one origin is used: `data_files` (local files), else `data_dir` (a directory of `<split>.<ext>` files),
    else `dataset_name` (a registered name or any Hub id). A registered name combined with `data_files` or `data_dir`
    reads a local copy with that dataset's schema and column mapping.
    """

    # what a YAML config may give beyond the command line's form (`specdec_hf.config_parsing` checks it)
    config_file_types: ClassVar[dict[str, Any]] = {"data_files": list[str] | dict[str, list[str] | str] | None}

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": f"A registered dataset ({', '.join(KNOWN_DATASETS)}) or any Hub dataset id "
            "(then give --source_column/--target_column or --source_lang/--target_lang)."
        },
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "Hub configuration (default: the registered one, e.g. `de-en` for wmt14)."}
    )
    data_files: list[str] | None = field(
        default=None,
        metadata={
            "help": "Local JSONL/JSON/CSV/TSV/Parquet files: `split=path` items (e.g. `train=a.jsonl "
            "validation=b.jsonl`) or plain paths, which form the `train` split. From Python or YAML a path or a "
            "`{split: path(s)}` dict also works."
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory holding one `<split>.<ext>` file per split (default for the Debian corpora: "
            "`data/debian_en_de`, `data/debian_sum`)."
        },
    )
    source_column: str | None = field(
        default=None, metadata={"help": "Column of the source text; dotted for nested fields (`translation.en`)."}
    )
    target_column: str | None = field(
        default=None, metadata={"help": "Column of the target text; dotted for nested fields (`translation.de`)."}
    )
    id_column: str | None = field(
        default=None, metadata={"help": "Column kept as `id` (default: `id` when present, else the row number)."}
    )
    source_lang: str | None = field(
        default=None, metadata={"help": "Source language of `{'translation': {lang: text}}` rows (e.g. `en`)."}
    )
    target_lang: str | None = field(
        default=None, metadata={"help": "Target language of `{'translation': {lang: text}}` rows (e.g. `de`)."}
    )
    train_split: str = field(default="train", metadata={"help": "Name of the training split."})
    validation_split: str = field(default="validation", metadata={"help": "Name of the validation split."})
    test_split: str = field(default="test", metadata={"help": "Name of the test split."})
    max_samples: int | None = field(
        default=None, metadata={"help": "Keep the first N rows of each split (rows with empty texts then skipped)."}
    )
    max_samples_seed: int | None = field(
        default=None,
        metadata={
            "help": "With `max_samples`: draw the N rows at random with this seed (kept in the split's order) "
            "instead of taking the first N, for corpora stored sorted by origin."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "`datasets` cache directory."})
    num_proc: int | None = field(default=None, metadata={"help": "Processes for loading and mapping."})

    def __post_init__(self):
        if self.dataset_name is None and self.data_files is None and self.data_dir is None:
            raise ValueError("no data given: set `dataset_name`, `data_files` or `data_dir`")
        self.data_files = _normalize_data_files(self.data_files)
        if (self.source_lang is None) != (self.target_lang is None):
            raise ValueError("give both `source_lang` and `target_lang` (e.g. `--source_lang en --target_lang de`)")
        if (self.source_column is None) != (self.target_column is None):
            raise ValueError("give both `source_column` and `target_column`")
        if self.max_samples is not None and self.max_samples <= 0:
            raise ValueError(f"`max_samples` must be positive, got {self.max_samples}")
        if self.max_samples_seed is not None and self.max_samples is None:
            raise ValueError("`max_samples_seed` draws `max_samples` rows at random: set `max_samples` too")
        if self.dataset_name is not None and self.known is None:
            has_columns = self.source_column is not None or self.source_lang is not None
            if self.data_files is None and self.data_dir is None and not has_columns:
                raise ValueError(
                    f"unknown dataset {self.dataset_name!r}: registered datasets are {sorted(KNOWN_DATASETS)}. "
                    "For another Hub dataset give `--source_column`/`--target_column` (or `--source_lang`/"
                    "`--target_lang`); for local files use `--data_files`."
                )
        known = self.known
        if known is not None and known.task == "translation" and self.source_lang is not None:
            allowed = set(self.languages_available or ())
            if allowed and not {self.source_lang, self.target_lang} <= allowed:
                raise ValueError(
                    f"{self.dataset_name} ({self.dataset_config_name or known.config_name}) has languages "
                    f"{sorted(allowed)}, not {self.source_lang}->{self.target_lang}; pick another "
                    "`dataset_config_name` (e.g. `fr-en`) or other languages."
                )

    @property
    def known(self) -> KnownDataset | None:
        """The registry entry of `dataset_name` (by registered name or Hub id), if any."""
        if self.dataset_name is None:
            return None
        return KNOWN_DATASETS.get(_ALIASES.get(self.dataset_name, self.dataset_name))

    @property
    def languages_available(self) -> tuple[str, ...] | None:
        """The two languages of a registered translation dataset (`"de-en"` → `("de", "en")`)."""
        known = self.known
        if known is None or known.task != "translation":
            return None
        config = self.dataset_config_name or known.config_name
        return tuple(config.split("-")) if config else known.languages

    @property
    def task(self) -> str | None:
        """`"translation"`, `"summarization"`, or None when unknown (local files with plain columns)."""
        if self.known is not None:
            return self.known.task
        return "translation" if self.source_lang is not None else None

    @property
    def languages(self) -> tuple[str, str] | None:
        """`(source_lang, target_lang)`: the given ones, else the registered dataset's default direction."""
        if self.source_lang is not None:
            return self.source_lang, self.target_lang
        available = self.languages_available
        if available is None:
            return None
        if self.known.languages is not None and set(self.known.languages) <= set(available):
            return self.known.languages
        # Another configuration of a registered dataset (e.g. wmt14 `fr-en`): translate out of English.
        other = [lang for lang in available if lang != "en"]
        return ("en", other[0]) if "en" in available and other else (available[0], available[1])


def load_text_pairs(args: DataArguments, split: str) -> datasets.Dataset:
    """
    Loads one split as (source, target) text pairs.

    Args:
        args (`DataArguments`): Where the data is and which columns hold the texts.
        split (`str`): The split name (`"train"`, `"validation"`, `"test"`).

    Returns:
        `datasets.Dataset` with string columns `id`, `source` and `target` (num_rows ≤ `args.max_samples`). Rows
        whose source or target is empty or missing are skipped, and their count is logged.

    Raises:
        `FileNotFoundError`: a file or a corpus directory is missing (the message gives the command that builds it).
        `ValueError`: a column is missing, a split is not in `data_files`, or no column pair can be inferred.
        `ConnectionError`: a Hub dataset cannot be reached and is not cached (the message gives the offline fix).
    """
    raw = _load_raw(args, split)
    if args.max_samples is not None:
        # Select before mapping so that `max_samples` on a 4.5M-row WMT split does not process the whole split.
        if args.max_samples_seed is None:
            raw = raw.select(range(min(args.max_samples, raw.num_rows)))
        else:
            raw = raw.select(sample_indices(raw.num_rows, args.max_samples, args.max_samples_seed))
    raw = raw.flatten()  # nested `translation` dicts become `translation.en` / `translation.de` columns
    source_column, target_column = _resolve_columns(args, raw.column_names)
    id_column = args.id_column or ("id" if "id" in raw.column_names else None)
    locations = {}
    for role, column in (("source", source_column), ("target", target_column), ("id", id_column)):
        locations[role] = None if column is None else _locate(raw, column)
        if column is not None and locations[role] is None:
            raise ValueError(
                f"{role} column {column!r} not found in {_describe(args, split)}; columns present: "
                f"{raw.column_names}. Set `--{role}_column` (dotted for nested fields)."
            )
    try:
        pairs = raw.map(
            _extract_pairs,
            batched=True,
            with_indices=True,
            remove_columns=raw.column_names,
            features=PAIR_FEATURES,
            fn_kwargs={"locations": locations},
            num_proc=args.num_proc,
            desc=f"Extracting {split} pairs",
        )
    except UnicodeDecodeError as err:  # pyarrow reads a JSON file's bytes unchecked: they are decoded only here
        raise ValueError(f"{_describe(args, split)} is not UTF-8 text ({err}): save it as UTF-8.") from err
    skipped = raw.num_rows - pairs.num_rows
    if skipped:
        row, role = _first_incomplete_row(raw, locations)
        column = source_column if role == "source" else target_column
        logger.warning(
            "skipped %d of %d rows of %s with an empty or missing source or target (the first is row %d, counting "
            "from 1, whose %s %r is empty or missing)",
            skipped,
            raw.num_rows,
            _describe(args, split),
            row + 1,
            role,
            column,
        )
    return pairs


def sample_indices(num_rows: int, limit: int, seed: int) -> list[int]:
    """The rows `evaluate.py --limit N --limit_seed S` evaluates: `limit` of `num_rows` drawn at random with `seed`,
    in the split's order; every row when there are no more than `limit` (draw them from `load_text_pairs`' rows, which
    leave out incomplete ones)."""
    if num_rows <= limit:
        return list(range(num_rows))
    return sorted(random.Random(seed).sample(range(num_rows), limit))


def load_text_pair_splits(args: DataArguments, splits: Sequence[str] | None = None) -> datasets.DatasetDict:
    """
    Loads several splits with `load_text_pairs`.

    Args:
        args (`DataArguments`): As for `load_text_pairs`.
        splits (`Sequence[str]`, *optional*): Split names; default `(args.train_split, args.validation_split)`.

    Returns:
        `datasets.DatasetDict` mapping each split name to its pairs.
    """
    splits = (args.train_split, args.validation_split) if splits is None else splits
    return datasets.DatasetDict({split: load_text_pairs(args, split) for split in splits})


# ----------------------------------------------------------------------------------------------------------------
# Loading the raw split
# ----------------------------------------------------------------------------------------------------------------
def _load_raw(args: DataArguments, split: str) -> datasets.Dataset:
    if args.data_files is not None:
        if isinstance(args.data_files, dict):
            if split not in args.data_files:
                raise ValueError(
                    f"split {split!r} is not in data_files (splits given: {sorted(args.data_files)}); "
                    f"add `{split}=<path>` to `--data_files`"
                )
            files = args.data_files[split]
        elif split == "train":
            files = args.data_files
        else:
            raise ValueError(
                f"data_files {args.data_files} carry no split names, so they form the `train` split only; to load "
                f"them as {split!r}, name the split: `--data_files {split}={args.data_files[0]}`"
            )
        return _load_files(files, split, args)
    known = args.known
    if args.data_dir is not None or (known is not None and known.is_local):
        return _load_split_dir(Path(args.data_dir or known.path), split, args)
    return _load_hub(args, split)


def _load_files(files: list[str], split: str, args: DataArguments) -> datasets.Dataset:
    for path in files:
        if os.path.isdir(path):
            raise IsADirectoryError(
                f"data file {path!r} (split {split!r}) is a directory: name the files in it in `--data_files`, or "
                f"pass the directory as `--data_dir` (it then holds one `<split>.<ext>` file per split)"
            )
        if not (glob.glob(path) if glob.has_magic(path) else os.path.isfile(path)):
            raise FileNotFoundError(f"data file {path!r} (split {split!r}) does not exist; check `--data_files`")
    suffixes = {_data_suffix(path) for path in files}
    if len(suffixes) > 1:
        raise ValueError(f"the {split} files mix formats {sorted(suffixes)}; convert them to one format")
    (suffix,) = suffixes
    if suffix not in _BUILDERS:
        raise ValueError(f"cannot read {files[0]!r}: supported formats are {', '.join(_BUILDERS)} (optionally .gz)")
    builder, builder_kwargs = _BUILDERS[suffix]
    for path in files:
        for match in glob.glob(path) if glob.has_magic(path) else [path]:
            check_not_empty(match)  # `datasets` reports an empty JSON Lines file as a bare StopIteration
    try:
        return datasets.load_dataset(
            builder,
            data_files={split: files},
            split=split,
            cache_dir=args.cache_dir,
            num_proc=args.num_proc,
            **builder_kwargs,
        )
    except (DatasetGenerationError, pa.ArrowException, ValueError) as err:
        # `datasets` names neither the file nor the line: find them (only now, so good files are read once)
        paths = [match for path in files for match in (glob.glob(path) if glob.has_magic(path) else [path])]
        explained = explain_read_error(paths, suffix, err)
        if explained is None:
            raise
        raise explained from err


def _load_split_dir(directory: Path, split: str, args: DataArguments) -> datasets.Dataset:
    known = args.known
    if not directory.is_dir():
        if known is not None and known.is_local:
            raise FileNotFoundError(
                f"the {args.dataset_name} corpus is not built: {str(directory)!r} does not exist. Build it with "
                f"`{known.build_command.format(dir=directory)}` (a few minutes; needs apt-get), or pass `--data_dir`."
            )
        raise FileNotFoundError(f"data_dir {str(directory)!r} does not exist")
    candidates = [directory / f"{split}{suffix}" for suffix in _BUILDERS]
    candidates += [path.with_name(path.name + ext) for path in candidates for ext in _COMPRESSION_SUFFIXES]
    found = [str(path) for path in candidates if path.is_file()]
    if not found:
        present = sorted(path.name for path in directory.iterdir())
        raise FileNotFoundError(
            f"no file for split {split!r} in {str(directory)!r} (expected `{split}.jsonl`, `.csv`, `.tsv`, "
            f"`.parquet` or `.json`); files present: {present}"
        )
    return _load_files(found[:1], split, args)


def _load_hub(args: DataArguments, split: str) -> datasets.Dataset:
    known = args.known
    path = known.path if known is not None else args.dataset_name
    config_name = args.dataset_config_name or (known.config_name if known is not None else None)
    try:
        return datasets.load_dataset(path, config_name, split=split, cache_dir=args.cache_dir, num_proc=args.num_proc)
    except ConnectionError as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
        reason = "HF_HUB_OFFLINE is set" if offline else "the Hub is unreachable"
        fix = "unset HF_HUB_OFFLINE (with network access) to download it" if offline else "retry with network access"
        raise ConnectionError(
            f"cannot load dataset {path!r} ({config_name or 'default config'}, split {split!r}): {reason} and it is "
            f"not in the `datasets` cache. Either {fix}, or pass a local copy with the same columns: "
            f"`--dataset_name {args.dataset_name} --data_files {split}=<file.jsonl|.parquet|...>`."
        ) from err


def _data_suffix(path: str) -> str:
    """`a/b.jsonl.gz` → `.jsonl`: the format suffix, ignoring a compression suffix."""
    name = path.lower()
    for compression in _COMPRESSION_SUFFIXES:
        if name.endswith(compression):
            name = name[: -len(compression)]
    return os.path.splitext(name)[1]


def _normalize_data_files(data_files) -> dict[str, list[str]] | list[str] | None:
    """`"a.jsonl"`, `["a.jsonl"]`, `["train=a.jsonl", "test=b.jsonl"]`, `{"train": "a.jsonl"}` → list or dict."""
    if data_files is None:
        return None
    if isinstance(data_files, dict):
        return {split: [files] if isinstance(files, str) else list(files) for split, files in data_files.items()}
    items = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    items = [str(item) for item in items]
    if not items:
        raise ValueError("`data_files` is empty")
    named = ["=" in item for item in items]
    if not any(named):
        return items
    if not all(named):
        raise ValueError(f"name the split of every data file or of none: {items}")
    mapping: dict[str, list[str]] = {}
    for item in items:
        split, path = item.split("=", 1)
        mapping.setdefault(split, []).append(path)
    return mapping


# ----------------------------------------------------------------------------------------------------------------
# Columns
# ----------------------------------------------------------------------------------------------------------------
def _resolve_columns(args: DataArguments, columns: list[str]) -> tuple[str, str]:
    """Explicit columns, else the languages (nested translation form), else the registry, else a known pair."""
    if args.source_column is not None:
        return args.source_column, args.target_column
    languages = args.languages
    if languages is not None:
        return f"translation.{languages[0]}", f"translation.{languages[1]}"
    known = args.known
    if known is not None:
        return known.source_column, known.target_column
    for source_column, target_column in _DEFAULT_COLUMN_PAIRS:
        if source_column in columns and target_column in columns:
            return source_column, target_column
    nested = [column for column in columns if column.startswith("translation.")]
    if nested:
        raise ValueError(
            f"rows hold translations ({nested}): set `--source_lang` and `--target_lang` "
            f"(e.g. `--source_lang {nested[0].split('.', 1)[1]}`)"
        )
    for pair in _DEFAULT_COLUMN_PAIRS:
        present = [column for column in pair if column in columns]
        if len(present) == 1:
            (missing,) = set(pair) - set(present)
            raise ValueError(
                f"the rows have a `{present[0]}` column but no `{missing}` column (columns present: {columns}): add "
                f"`{missing}` to every row, or set `--source_column` and `--target_column`"
            )
    raise ValueError(
        f"cannot tell which columns hold the texts (columns present: {columns}); set `--source_column` and "
        f"`--target_column`, or name them `source` and `target`"
    )


def _locate(raw: datasets.Dataset, column: str) -> tuple[str, tuple[str, ...]] | None:
    """Where a (dotted) column's values are: the column itself, or keys inside a JSON column, or None.

    `datasets` keeps a nested field whose rows differ in shape (`{"translation": {"en": ...}}` in some rows,
    `{"en": ..., "de": ...}` in others) as one JSON column, which `flatten()` leaves whole.
    """
    if column in raw.column_names:
        return column, ()
    parts = column.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in raw.column_names and isinstance(raw.features[prefix], _JSON_FEATURE):
            return prefix, tuple(parts[cut:])
    return None


def _values(batch: dict[str, list], location: tuple[str, tuple[str, ...]]) -> list:
    """A located column's values in a batch (None where a row lacks the nested key)."""
    column, keys = location
    values = batch[column]
    for key in keys:
        values = [value.get(key) if isinstance(value, dict) else None for value in values]
    return values


def _is_text(value) -> bool:
    return value is not None and bool(str(value).strip())


def _extract_pairs(batch: dict[str, list], indices: list[int], locations: dict) -> dict[str, list[str]]:
    """Batched map: renames the columns to the common schema and drops rows with an empty or missing text."""
    ids = _values(batch, locations["id"]) if locations["id"] is not None else indices
    out = {"id": [], "source": [], "target": []}
    rows = zip(ids, _values(batch, locations["source"]), _values(batch, locations["target"]), strict=True)
    for row_id, source, target in rows:
        if _is_text(source) and _is_text(target):
            out["id"].append(str(row_id))
            out["source"].append(str(source))
            out["target"].append(str(target))
    return out


def _first_incomplete_row(raw: datasets.Dataset, locations: dict) -> tuple[int, str]:
    """The index of the first row with an empty or missing text, and which (`"source"` or `"target"`)."""
    start = 0
    for batch in raw.iter(batch_size=1_000):
        sources, targets = _values(batch, locations["source"]), _values(batch, locations["target"])
        for offset, (source, target) in enumerate(zip(sources, targets, strict=True)):
            if not _is_text(source):
                return start + offset, "source"
            if not _is_text(target):
                return start + offset, "target"
        start += len(sources)
    raise AssertionError("no incomplete row although rows were skipped")


def _describe(args: DataArguments, split: str) -> str:
    origin = args.data_files if args.data_files is not None else args.data_dir or args.dataset_name
    return f"{origin} [{split}]"
