"""An n-gram store of a verifier's own outputs: for each short context, the tokens that followed it most often.

Retrieval-based speculative decoding (REST, He et al., 2023, arXiv 2311.08252) drafts the next tokens by looking the
last generated ones up in a datastore of text, with no drafter model to run. [`NgramStore`] is such a datastore built
from what the verifier itself generates (the targets of `specdec_hf.distillation`, its greedy outputs for training
sources): what a context was followed by in those outputs is what greedy decoding tends to emit after it again. It
keeps, for every context of 1 to `max_ngram_size` tokens seen at least `min_count` times, its `max_continuations`
most frequent next tokens and the share of the context's occurrences each took; `NgramStoreDrafter` drafts from it.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import huggingface_hub
import torch
from safetensors.torch import load_file, save_file

from .lookup_common import is_positive_int

__all__ = ["NgramStore", "is_ngram_store"]

WEIGHTS_NAME = "ngram_store.safetensors"
CONFIG_NAME = "ngram_store.json"
# ids fit int16 below this vocabulary size: the store's largest table halves
_INT16_VOCAB_LIMIT = 2**15


def _check_positive_int(name: str, value) -> None:
    if not is_positive_int(value):
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")


def is_ngram_store(
    name_or_path: str | os.PathLike, revision: str | None = None, token: str | bool | None = None
) -> bool:
    """Whether `name_or_path` holds a saved n-gram store (its `ngram_store.json`): a local directory, or a Hub
    repository whose `ngram_store.json` is in the local cache or, unless offline (`HF_HUB_OFFLINE`), can be fetched
    (one request; an unreachable Hub means not a store, and the model loader then tries the name)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return (path / CONFIG_NAME).is_file()
    name = str(name_or_path)
    try:
        huggingface_hub.utils.validate_repo_id(name)
    except huggingface_hub.errors.HFValidationError:  # a missing local path: the loader names it
        return False
    if isinstance(huggingface_hub.try_to_load_from_cache(name, CONFIG_NAME, revision=revision), str):
        return True
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return False
    try:
        # the file is fetched anyway when the store loads
        huggingface_hub.hf_hub_download(name, CONFIG_NAME, revision=revision, token=token)
    except OSError:  # an unreachable Hub (LocalEntryNotFoundError), no such file or repository (HfHubHTTPError)
        return False
    return True


def _resolve(name_or_path: str | os.PathLike, filename: str, **hub_kwargs) -> str:
    """The local path of `filename` in a directory or a Hub repository (`hub_kwargs`: `hf_hub_download`'s)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / filename).is_file():
            raise FileNotFoundError(f"{str(name_or_path)!r} holds no {filename}: it is not a saved n-gram store.")
        return str(path / filename)
    return huggingface_hub.hf_hub_download(str(name_or_path), filename, **hub_kwargs)


class NgramStore:
    """Contexts of up to `max_ngram_size` tokens, each with its most frequent continuations and their shares.

    Args:
        continuations (`dict[tuple[int, ...], tuple[tuple[int, ...], tuple[float, ...]]]`): For each context, its
            continuation ids, most frequent first, and the share of the context's occurrences each followed.
        vocab_size (`int`): The vocabulary the ids index (the verifier's).
        max_ngram_size (`int`): The longest context.
        build_settings (`dict`, *optional*): How the store was built (`max_continuations`, `min_count`,
            `num_sequences`), kept with it when saved.
    """

    def __init__(
        self,
        continuations: dict[tuple[int, ...], tuple[tuple[int, ...], tuple[float, ...]]],
        vocab_size: int,
        max_ngram_size: int,
        build_settings: dict | None = None,
    ):
        _check_positive_int("vocab_size", vocab_size)
        _check_positive_int("max_ngram_size", max_ngram_size)
        self.continuations = continuations
        self.vocab_size = vocab_size
        self.max_ngram_size = max_ngram_size
        self.build_settings = dict(build_settings or {})
        self.check()  # once, here: a draft outside the vocabulary would reach the verifier's embedding

    def __len__(self) -> int:
        return len(self.continuations)

    @classmethod
    def from_sequences(
        cls,
        sequences: Iterable[Sequence[int]],
        vocab_size: int,
        max_ngram_size: int = 2,
        max_continuations: int = 4,
        min_count: int = 2,
    ) -> NgramStore:
        """Count every context of 1 to `max_ngram_size` tokens in `sequences` and what followed it.

        Args:
            sequences (iterable of `list[int]`): Token ids, each a whole output (e.g. from the decoder start token
                to EOS, as the verifier generated it).
            vocab_size (`int`): The verifier's vocabulary size; every id must lie in `[0, vocab_size)`.
            max_ngram_size (`int`, *optional*, defaults to 2): The longest context kept.
            max_continuations (`int`, *optional*, defaults to 4): Continuations kept per context, most frequent
                first (at most 255).
            min_count (`int`, *optional*, defaults to 2): Contexts seen fewer times are left out (a context seen
                once says little, and they are most of the store).

        Raises:
            ValueError: for a setting out of range, an id outside the vocabulary, or sequences with no context.
        """
        for name, value in (
            ("vocab_size", vocab_size),
            ("max_ngram_size", max_ngram_size),
            ("max_continuations", max_continuations),
            ("min_count", min_count),
        ):
            _check_positive_int(name, value)
        if max_continuations > 255:
            raise ValueError(f"`max_continuations` must be at most 255, got {max_continuations}.")
        counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        num_sequences = 0
        for sequence in sequences:
            ids = [int(token) for token in sequence]
            bad = [token for token in ids if not 0 <= token < vocab_size]
            if bad:
                raise ValueError(
                    f"sequence {num_sequences} holds id {bad[0]}, outside the vocabulary [0, {vocab_size}): build the "
                    "store from the outputs of the verifier it drafts for."
                )
            num_sequences += 1
            for end in range(1, len(ids)):
                for size in range(1, min(max_ngram_size, end) + 1):
                    counts[tuple(ids[end - size : end])][ids[end]] += 1
        continuations = {}
        for context, followers in counts.items():
            total = sum(followers.values())
            if total < min_count:
                continue
            top = followers.most_common(max_continuations)
            continuations[context] = (tuple(t for t, _ in top), tuple(n / total for _, n in top))
        if not continuations:
            raise ValueError(
                f"no context of the {num_sequences} sequences occurs {min_count} times or more: give more sequences "
                "(or a lower `min_count`)."
            )
        settings = {"max_continuations": max_continuations, "min_count": min_count, "num_sequences": num_sequences}
        return cls(continuations, vocab_size, max_ngram_size, settings)

    @classmethod
    def from_distilled(cls, path: str | os.PathLike, vocab_size: int, **kwargs) -> NgramStore:
        """A store counting the verifier outputs (`target_ids`) of a finished `specdec_hf.distillation` run in
        `path`; `kwargs` go to `from_sequences` (`max_ngram_size`, `max_continuations`, `min_count`)."""
        from ..distillation import load_distilled_dataset  # datasets is imported only where a dataset is read

        dataset = load_distilled_dataset(path, vocab_size).select_columns(["target_ids"])
        sequences = (ids for batch in dataset.iter(batch_size=10_000) for ids in batch["target_ids"])
        return cls.from_sequences(sequences, vocab_size, **kwargs)

    def lookup(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """The continuations of the longest stored context that ends `tokens`: `(ids, shares)`, or `None`."""
        for size in range(min(self.max_ngram_size, len(tokens)), 0, -1):
            found = self.continuations.get(tuple(tokens[len(tokens) - size :]))
            if found is not None:
                return found
        return None

    def check(self) -> None:
        """Check that the store can draft and be saved: contexts of 1 to `max_ngram_size` ids, 1 to 255 continuations
        each with a share in [0, 1], every id inside the vocabulary (run when the store is built, and again when it is
        saved: `continuations` is a plain dictionary).

        Raises:
            ValueError: naming the first context at fault.
        """
        for context, (followers, shares) in self.continuations.items():
            problem = None
            if not 1 <= len(context) <= self.max_ngram_size:
                problem = f"has {len(context)} tokens (1 to max_ngram_size={self.max_ngram_size})"
            elif not 1 <= len(followers) <= 255 or len(shares) != len(followers):
                problem = f"has {len(followers)} continuations and {len(shares)} shares (1 to 255 of each)"
            elif not all(0.0 <= share <= 1.0 for share in shares):  # also false for NaN
                problem = f"has shares {shares} outside [0, 1]"
            elif not all(0 <= token < self.vocab_size for token in (*context, *followers)):
                problem = f"holds an id outside the vocabulary [0, {self.vocab_size})"
            if problem is not None:
                raise ValueError(f"the store's context {context} {problem}: build it with `from_sequences`.")

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write the store as `ngram_store.safetensors` (its tables: ids in int16 where the vocabulary allows, shares
        in float16) and `ngram_store.json` (its settings)."""
        self.check()
        directory = Path(save_directory)
        if directory.is_file():
            raise NotADirectoryError(f"`save_directory` {str(directory)!r} is a file: give a directory.")
        directory.mkdir(parents=True, exist_ok=True)
        id_dtype = torch.int16 if self.vocab_size <= _INT16_VOCAB_LIMIT else torch.int32
        contexts, sizes, ids, shares = [], [], [], []
        for context, (followers, parts) in self.continuations.items():
            contexts.append([-1] * (self.max_ngram_size - len(context)) + list(context))  # right-aligned
            sizes.append(len(followers))
            ids.extend(followers)
            shares.extend(parts)
        tensors = {
            "contexts": torch.tensor(contexts, dtype=id_dtype).reshape(-1, self.max_ngram_size),
            "num_continuations": torch.tensor(sizes, dtype=torch.uint8),
            "continuations": torch.tensor(ids, dtype=id_dtype),
            "shares": torch.tensor(shares, dtype=torch.float16),
        }
        save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
        config = {"vocab_size": self.vocab_size, "max_ngram_size": self.max_ngram_size, **self.build_settings}
        (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, **hub_kwargs) -> NgramStore:
        """Load a store that `save_pretrained` wrote, from a local directory or a Hub repository (`hub_kwargs`, e.g.
        `revision`, `token`, `local_files_only`, `cache_dir`, go to `huggingface_hub.hf_hub_download`).

        Raises:
            FileNotFoundError: for a directory without the store's files.
            ValueError: for tables that do not fit together or do not fit the settings (a damaged or edited store).
        """
        config = json.loads(Path(_resolve(name_or_path, CONFIG_NAME, **hub_kwargs)).read_text(encoding="utf-8"))
        tensors = load_file(_resolve(name_or_path, WEIGHTS_NAME, **hub_kwargs))
        damaged = ValueError(
            f"the n-gram store {str(name_or_path)!r} has tables that do not fit together or its {CONFIG_NAME}: "
            "build and save it again."
        )
        try:
            max_ngram_size, vocab_size = config["max_ngram_size"], config["vocab_size"]
            table = tensors["contexts"]
            sizes = tensors["num_continuations"].tolist()
            ids = tensors["continuations"].tolist()
            shares = tensors["shares"].float().tolist()
        except KeyError as err:
            raise damaged from err
        if table.dim() != 2 or table.shape[1] != max_ngram_size or table.shape[0] != len(sizes):
            raise damaged
        if not sum(sizes) == len(ids) == len(shares):
            raise damaged
        continuations = {}
        start = 0
        for row, size in zip(table.tolist(), sizes, strict=True):
            key = tuple(token for token in row if token >= 0)
            # right-aligned: -1 before the context's ids only, never among them
            if row[max_ngram_size - len(key) :] != list(key) or key in continuations:
                raise damaged
            continuations[key] = (tuple(ids[start : start + size]), tuple(shares[start : start + size]))
            start += size
        settings = {key: config[key] for key in ("max_continuations", "min_count", "num_sequences") if key in config}
        return cls(continuations, vocab_size, max_ngram_size, settings)
