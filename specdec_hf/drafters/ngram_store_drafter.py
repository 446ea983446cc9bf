"""A drafter that looks its drafts up in an n-gram store of the verifier's own outputs: no model call per iteration.

A trained Spec-Drafter costs a forward of its own at every iteration; where the verifier is small that call is a large
part of the iteration, and where its outputs are formulaic (package synopses, headlines, boilerplate) what followed a
context in the verifier's past outputs is a draft nearly as good. [`NgramStoreDrafter`] chains, for each row, the
most frequent continuation of its last tokens in an [`~specdec_hf.drafters.ngram_store.NgramStore`] (retrieval-based
drafting, after REST, He et al., 2023, arXiv 2311.08252), preferring by `source_bias` a continuation that occurs in the
row's source: a summary or a translation names what its source names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers.utils import PushToHubMixin

from ..auto_draft_length import AUTO
from ..drafting import Drafter, DraftProposal
from .ngram_store import NgramStore

__all__ = ["NgramStoreDrafter", "NgramStoreState"]

# the largest k where k is chosen as decoding runs (the default): the source copy's
_DEFAULT_MAX_DRAFT_TOKENS = 8


@dataclass
class NgramStoreState:
    """Per-`generate()` state: each row's source ids (special ids left out), which `source_bias` prefers; `None`
    without source ids (`inputs_embeds`)."""

    source_tokens: list[frozenset[int]] | None


class NgramStoreDrafter(Drafter, PushToHubMixin):
    """Drafts the most frequent continuations of each row's last tokens in the verifier's own past outputs.

    Build it from the verifier's outputs ([`~NgramStoreDrafter.from_distilled`] reads a `specdec_hf.distillation` run,
    [`~NgramStoreDrafter.from_sequences`] any token ids), save it with `save_pretrained`, load it with
    `from_pretrained`. At each iteration it drafts, for each row, `k` tokens one after the other: the continuation of
    the longest stored context ending the row's tokens, with the largest share of that context's occurrences plus
    `source_bias` where the row's source holds it. A row whose last token no stored context ends gets fewer drafts
    (`num_drafts`), none at worst (the loop then steps it as greedy decoding would).

    Args:
        store ([`~specdec_hf.drafters.ngram_store.NgramStore`]): The contexts and their continuations.
        num_draft_tokens (`int` or `"auto"`, *optional*, defaults to `"auto"`): Default k; `"auto"` chooses it as
            decoding runs, up to `max_draft_tokens`.
        max_draft_tokens (`int`, *optional*, defaults to 8): The largest k.
        source_bias (`float`, *optional*, defaults to 0.3): Added to the share of a continuation that occurs in the
            row's source. It compares source ids with target ids: use it only for a verifier whose source and target
            share one vocabulary, and 0 otherwise.
        ignored_source_ids (iterable of `int`, *optional*): Source ids never preferred (the special tokens: every
            source ends with EOS, which would otherwise be preferred wherever it may follow).
    """

    verifier_state_layers = None
    max_positions = None

    def __init__(
        self,
        store: NgramStore,
        num_draft_tokens: int | str = AUTO,
        max_draft_tokens: int = _DEFAULT_MAX_DRAFT_TOKENS,
        source_bias: float = 0.3,
        ignored_source_ids=(),
    ):
        if not isinstance(store, NgramStore):
            raise TypeError(f"`store` must be an NgramStore, got {type(store).__name__}.")
        if not isinstance(max_draft_tokens, int) or isinstance(max_draft_tokens, bool) or max_draft_tokens < 1:
            raise ValueError(f"`max_draft_tokens` must be an integer >= 1, got {max_draft_tokens!r}.")
        if num_draft_tokens != AUTO:
            if not isinstance(num_draft_tokens, int) or isinstance(num_draft_tokens, bool) or num_draft_tokens < 1:
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
    def from_sequences(
        cls,
        sequences,
        vocab_size: int,
        max_ngram_size: int = 2,
        max_continuations: int = 4,
        min_count: int = 2,
        **kwargs,
    ) -> NgramStoreDrafter:
        """A drafter whose store counts `sequences` (the verifier's outputs, token ids); `kwargs` are the drafter's
        (`num_draft_tokens`, `source_bias`, ...). See [`~specdec_hf.drafters.ngram_store.NgramStore.from_sequences`]."""
        store = NgramStore.from_sequences(sequences, vocab_size, max_ngram_size, max_continuations, min_count)
        return cls(store, **kwargs)

    @classmethod
    def from_distilled(
        cls, path: str | os.PathLike, vocab_size: int, store_kwargs: dict | None = None, **kwargs
    ) -> NgramStoreDrafter:
        """A drafter whose store counts the verifier outputs (`target_ids`) of a finished `specdec_hf.distillation`
        run in `path`; `store_kwargs` go to `from_sequences` (`max_ngram_size`, ...), `kwargs` to the drafter."""
        from ..distillation import load_distilled_dataset  # datasets is imported only where a dataset is read

        dataset = load_distilled_dataset(path, vocab_size).select_columns(["target_ids"])
        sequences = (ids for batch in dataset.iter(batch_size=10_000) for ids in batch["target_ids"])
        return cls.from_sequences(sequences, vocab_size, **(store_kwargs or {}), **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> None:
        """Write the store and the drafter's settings to `save_directory` (`ngram_store.safetensors`,
        `ngram_store.json`); other keyword arguments (those `push_to_hub` passes) are ignored."""
        settings = {
            "drafter_type": "ngram_store",
            "num_draft_tokens": self.num_draft_tokens,
            "max_draft_tokens": self.max_draft_tokens,
            "source_bias": self.source_bias,
            "ignored_source_ids": sorted(self.ignored_source_ids),
        }
        self.store.save_pretrained(save_directory, extra_config=settings)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, hub_kwargs: dict | None = None, **kwargs):
        """Load a drafter that `save_pretrained` wrote, from a local directory or a Hub repository; `kwargs`
        override its saved settings (`num_draft_tokens`, `source_bias`, ...), `hub_kwargs` go to
        `transformers.utils.cached_file` (`revision`, `token`, `local_files_only`)."""
        hub_kwargs = hub_kwargs or {}
        config = NgramStore.load_config(name_or_path, **hub_kwargs)
        saved = {
            name: config[name]
            for name in ("num_draft_tokens", "max_draft_tokens", "source_bias", "ignored_source_ids")
            if name in config
        }
        return cls(NgramStore.from_pretrained(name_or_path, **hub_kwargs), **{**saved, **kwargs})

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
        on the host).

        Returns:
            [`~specdec_hf.drafting.DraftProposal`]: `draft_ids` `(rows, k)` (0 after a row's drafts), no scores (a
            looked-up token is a certain proposal), and `num_drafts` `(rows,)`.
        """
        longest = self.store.max_ngram_size
        lengths = prefix_lengths.tolist()
        # each row's last tokens, read in one transfer of the columns they span
        start = max(min(lengths) - longest, 0)
        window = prefix_ids[:, start : max(lengths)].tolist()
        drafts = []
        for row, length in enumerate(lengths):
            tail = window[row][max(length - longest, 0) - start : length - start]
            source = () if state.source_tokens is None else state.source_tokens[row]
            drafts.append(self._draft_row(tail, source, num_draft_tokens))
        draft_ids = torch.tensor([draft + [0] * (num_draft_tokens - len(draft)) for draft in drafts], dtype=torch.long)
        num_drafts = torch.tensor([len(draft) for draft in drafts], dtype=torch.long)
        device = prefix_ids.device
        return DraftProposal(draft_ids.to(device), None, state, num_drafts=num_drafts.to(device))

    def _draft_row(self, tail: list[int], source: frozenset[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` drafts after `tail`, each chosen from the continuations of the longest stored context
        ending the tokens so far (the first of the best, so the more frequent one on a tie)."""
        tokens = list(tail)
        draft = []
        for _ in range(num_tokens):
            found = self.store.lookup(tokens)
            if found is None:
                break
            ids, shares = found
            best, best_score = ids[0], -1.0
            for token, share in zip(ids, shares, strict=True):
                score = share + self.source_bias if token in source else share
                if score > best_score:
                    best, best_score = token, score
            draft.append(best)
            tokens.append(best)
        return draft
