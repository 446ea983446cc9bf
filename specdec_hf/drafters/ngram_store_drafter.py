"""A drafter that looks its drafts up in an n-gram store of the verifier's own outputs: no model call per iteration.

A trained Spec-Drafter costs a forward of its own at every iteration; where the verifier is small that call is a large
part of the iteration, and where its outputs are formulaic (package synopses, headlines, boilerplate) what followed a
context in the verifier's past outputs is a draft nearly as good. [`NgramStoreDrafter`] chains, for each row, the
most frequent continuation of its last tokens in an [`~specdec_hf.drafters.ngram_store.NgramStore`] (retrieval-based
drafting, after REST, He et al., 2023, arXiv 2311.08252), preferring by `source_bias` a continuation that occurs in the
row's source: a summary or a translation names what its source names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import ModelHubMixin

from ..auto_draft_length import AUTO
from ..drafting import Drafter, DraftProposal
from .lookup_common import DEFAULT_MAX_DRAFT_TOKENS, is_positive_int, row_tails
from .ngram_store import WEIGHTS_NAME as NGRAM_STORE_WEIGHTS
from .ngram_store import NgramStore

__all__ = ["NgramStoreDrafter", "NgramStoreState", "draft_from_store"]

# the drafter's settings (its `__init__` arguments besides the store): `from_pretrained` may override them
_SETTINGS = ("num_draft_tokens", "max_draft_tokens", "source_bias", "ignored_source_ids")


@dataclass
class NgramStoreState:
    """Per-`generate()` state: each row's source ids (special ids left out), which `source_bias` prefers; `None`
    without source ids (`inputs_embeds`) or without a source bias."""

    source_tokens: list[frozenset[int]] | None


def draft_from_store(
    store: NgramStore, tokens: Sequence[int], source_tokens: Collection[int], num_tokens: int, source_bias: float
) -> list[int]:
    """Up to `num_tokens` drafts after `tokens`, one after the other: each the continuation of the longest stored
    context ending the tokens so far with the largest share, plus `source_bias` where `source_tokens` holds it (the
    first of the best, so the more frequent one on a tie); fewer where no stored context ends them.

    Args:
        store ([`~specdec_hf.drafters.ngram_store.NgramStore`]): The contexts and their continuations.
        tokens (`Sequence[int]`): The row's last tokens (at least `store.max_ngram_size` of them where it has them).
        source_tokens (`Collection[int]`): The ids a continuation is preferred for (the row's source).
        num_tokens (`int`): The most tokens drafted.
        source_bias (`float`): Added to the share of a continuation in `source_tokens`.
    """
    tokens = list(tokens)
    draft = []
    for _ in range(num_tokens):
        found = store.lookup(tokens)
        if found is None:
            break
        ids, shares = found
        best, best_score = ids[0], -1.0
        for token, share in zip(ids, shares, strict=True):
            score = share + source_bias if token in source_tokens else share
            if score > best_score:
                best, best_score = token, score
        draft.append(best)
        tokens.append(best)
    return draft


class NgramStoreDrafter(
    Drafter, ModelHubMixin, library_name="specdec_hf", tags=["speculative-decoding", "specdec_hf", "ngram-store"]
):
    """Drafts the most frequent continuations of each row's last tokens in the verifier's own past outputs.

    Build its store from the verifier's outputs ([`~specdec_hf.drafters.ngram_store.NgramStore.from_distilled`] reads
    a `specdec_hf.distillation` run, `NgramStore.from_sequences` any token ids; `python -m
    specdec_hf.drafters.build_ngram_store` does the first for a verifier and sets the source preference from it), save it with `save_pretrained` or `push_to_hub`,
    load it with `from_pretrained` (the `huggingface_hub.ModelHubMixin` methods: a directory or a Hub id). At each
    iteration it drafts, for each row, `k` tokens with [`draft_from_store`]. A row whose last token no stored context
    ends gets fewer drafts (`num_drafts`), none at worst (the loop then steps it as greedy decoding would).

    Args:
        store ([`~specdec_hf.drafters.ngram_store.NgramStore`]): The contexts and their continuations.
        num_draft_tokens (`int` or `"auto"`, *optional*, defaults to `"auto"`): Default k; `"auto"` chooses it as
            decoding runs, up to `max_draft_tokens`.
        max_draft_tokens (`int`, *optional*, defaults to 8): The largest k.
        source_bias (`float`, *optional*, defaults to 0.3): Added to the share of a continuation that occurs in the
            row's source. It compares source ids with target ids: right for a verifier whose source and target share
            one vocabulary (BART, T5, Pegasus, most Marian models); give 0 for any other (the builder does).
        ignored_source_ids (iterable of `int`, *optional*): Source ids never preferred: the special tokens (every
            source ends with EOS, which would otherwise be preferred wherever it may follow; the builder passes the
            tokenizer's).
    """

    verifier_state_layers = None
    max_positions = None

    def __init__(
        self,
        store: NgramStore,
        num_draft_tokens: int | str = AUTO,
        max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS,
        source_bias: float = 0.3,
        ignored_source_ids: Iterable[int] = (),
    ):
        if not isinstance(store, NgramStore):
            raise TypeError(f"`store` must be an NgramStore, got {type(store).__name__}.")
        if not is_positive_int(max_draft_tokens):
            raise ValueError(f"`max_draft_tokens` must be an integer >= 1, got {max_draft_tokens!r}.")
        if num_draft_tokens != AUTO:
            if not is_positive_int(num_draft_tokens):
                raise ValueError(f"`num_draft_tokens` must be an integer >= 1 or {AUTO!r}, got {num_draft_tokens!r}.")
            if num_draft_tokens > max_draft_tokens:
                raise ValueError(
                    f"`num_draft_tokens` ({num_draft_tokens}) exceeds `max_draft_tokens` ({max_draft_tokens}): raise "
                    "`max_draft_tokens` or lower `num_draft_tokens`."
                )
        if isinstance(source_bias, bool) or not isinstance(source_bias, int | float) or not source_bias >= 0:
            raise ValueError(f"`source_bias` must be a number >= 0, got {source_bias!r}.")
        self.store = store
        self.vocab_size = store.vocab_size
        self.num_draft_tokens = num_draft_tokens
        self.max_draft_tokens = max_draft_tokens
        self.source_bias = float(source_bias)
        self.ignored_source_ids = frozenset(int(token) for token in ignored_source_ids)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> NgramStoreDrafter:
        """Load a drafter that `save_pretrained` wrote: a local directory (`~` expanded) or a Hub id; `kwargs` are the
        drafter's settings (overriding the saved ones) and `ModelHubMixin.from_pretrained`'s download arguments
        (`revision`, `token`, `cache_dir`, `local_files_only`, `force_download`)."""
        path = Path(pretrained_model_name_or_path).expanduser()
        name = str(path) if path.exists() else str(pretrained_model_name_or_path)
        return super().from_pretrained(name, **kwargs)

    def settings(self) -> dict:
        """The drafter's settings as `config.json` holds them (JSON: the ignored ids as a sorted list)."""
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "max_draft_tokens": self.max_draft_tokens,
            "source_bias": self.source_bias,
            "ignored_source_ids": sorted(self.ignored_source_ids),
        }

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs):
        """Write the store (`ngram_store.safetensors`, `ngram_store.json`), the drafter's settings (`config.json`,
        from `settings()`) and, where none is there, a model card (`README.md`); `kwargs` are
        `ModelHubMixin.save_pretrained`'s (`push_to_hub`, `repo_id`, ...). `push_to_hub` uploads the same files:
        push to a repository of its own, whose `config.json` it would otherwise replace.

        Raises:
            ValueError: for a directory that holds a model (weights, or a `config.json` of other settings: the
                mixin would replace it), or a store that cannot be saved (`NgramStore.check`), before anything is
                written.
        """
        directory = Path(save_directory)
        config_path = directory / "config.json"
        foreign = config_path.is_file() and not set(json.loads(config_path.read_text(encoding="utf-8"))) <= set(
            _SETTINGS
        )
        weights = [
            path.name
            for pattern in ("*.safetensors", "*.bin", "*.index.json")
            for path in directory.glob(pattern)
            if path.name != NGRAM_STORE_WEIGHTS
        ]
        if foreign or weights:
            raise ValueError(
                f"`save_directory` {str(directory)!r} holds a model ({', '.join(weights) or 'its config.json'}); an "
                "n-gram store writes its own config.json there: save it to a directory of its own."
            )
        self.store.check()
        kwargs["config"] = self.settings()
        return super().save_pretrained(save_directory, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        self.store.save_pretrained(save_directory)

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | Path | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        **model_kwargs,
    ) -> NgramStoreDrafter:
        """`ModelHubMixin.from_pretrained`'s loader: the store, and the settings of `config.json` (which the mixin
        merges into `model_kwargs`) with the caller's overrides."""
        unknown = sorted(set(model_kwargs) - set(_SETTINGS))
        if unknown:
            raise ValueError(
                f"NgramStoreDrafter.from_pretrained got {unknown}: it takes the drafter's settings {list(_SETTINGS)} "
                "and huggingface_hub's download arguments; the store's own (max_ngram_size, ...) are fixed when it is "
                "built: build another with `python -m specdec_hf.drafters.build_ngram_store`."
            )
        hub_kwargs = dict(
            revision=revision,
            cache_dir=cache_dir,
            force_download=force_download,
            local_files_only=local_files_only,
            token=token,
        )
        store = NgramStore.from_pretrained(model_id, **hub_kwargs)
        settings = {name: model_kwargs[name] for name in _SETTINGS if name in model_kwargs}
        return cls(store, **settings)

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states) -> NgramStoreState:
        """Each row's source ids, padding and `ignored_source_ids` left out (none without `input_ids`)."""
        if input_ids is None or self.source_bias == 0:
            return NgramStoreState(None)
        rows = input_ids.tolist()
        if attention_mask is not None:
            masks = attention_mask.tolist()
            rows = [
                [token for token, keep in zip(row, mask, strict=True) if keep]
                for row, mask in zip(rows, masks, strict=True)
            ]
        return NgramStoreState([frozenset(row) - self.ignored_source_ids for row in rows])

    def select_rows(self, state: NgramStoreState, rows: torch.LongTensor) -> NgramStoreState:
        """Keep the rows `rows` of the state."""
        if state.source_tokens is None:
            return state
        return NgramStoreState([state.source_tokens[row] for row in rows.tolist()])

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None) -> DraftProposal:
        """Draft up to `num_draft_tokens` tokens per row from the store (on a GPU this reads each row's last tokens
        on the host, and copies the drafts back in one transfer).

        Returns:
            [`~specdec_hf.drafting.DraftProposal`]: `draft_ids` `(rows, k)` (0 after a row's drafts), no scores (a
            looked-up token is a certain proposal), and `num_drafts` `(rows,)`.
        """
        tails = row_tails(prefix_ids, prefix_lengths, self.store.max_ngram_size)
        rows = []
        for row, tail in enumerate(tails):
            source = () if state.source_tokens is None else state.source_tokens[row]
            draft = draft_from_store(self.store, tail, source, num_draft_tokens, self.source_bias)
            rows.append([*draft, *[0] * (num_draft_tokens - len(draft)), len(draft)])  # the count last
        drafted = torch.tensor(rows, dtype=torch.long).to(prefix_ids.device)
        return DraftProposal(drafted[:, :-1], None, state, num_drafts=drafted[:, -1])
