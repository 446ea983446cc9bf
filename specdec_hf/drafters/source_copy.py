"""A drafter that copies from the source: no training, for tasks whose outputs reuse spans of their input.

Summaries, edits and many translations of names and numbers copy their source. Input-guided aggressive decoding (Ge
et al., 2022, arXiv 2205.10350) drafted such outputs by copying the input; transformers' prompt lookup
(`prompt_lookup_num_tokens`) matches n-grams of the decoder's own tokens, which on an encoder-decoder model never see
the source. [`SourceCopyDrafter`] matches the last generated tokens of each row in that row's *source ids* (the
encoder input) and proposes what follows there. Where no n-gram matches, it proposes nothing (`num_drafts` 0: the
loop steps that row as greedy decoding would), or asks a `fallback` drafter (a trained Spec-Drafter) for that row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ..auto_draft_length import AUTO
from ..drafting import Drafter, DraftProposal, validate_drafter
from ..generation.spec_drafter_adapter import as_drafter
from .lookup_common import DEFAULT_MAX_DRAFT_TOKENS, is_positive_int, row_tails

__all__ = [
    "CopyOrFallbackProposal",
    "SourceCopyDrafter",
    "SourceCopyState",
    "SourceNgramIndex",
    "find_source_continuations",
    "shares_vocabulary",
]


@dataclass
class SourceCopyState:
    """Per-`generate()` state: the source ids (`-1` at padding, which never matches), the fallback's state, and, for a
    source on the CPU, each row's index of its n-grams (`SourceNgramIndex`)."""

    source_ids: torch.LongTensor
    fallback_state: Any = None
    ngram_indexes: list[SourceNgramIndex] | None = None


class SourceNgramIndex:
    """One source row's n-grams, each mapped to the position after its first occurrence that has a token after it:
    what `find_source_continuations` searches for at every iteration, looked up in a dictionary built once per
    `generate()` call (on the CPU a handful of small tensor operations per n-gram size cost more than the lookup).

    Args:
        source_ids (`list[int]`): The row's source ids, `-1` at padding (never part of an n-gram).
        min_ngram_size, max_ngram_size (`int`): The n-gram sizes indexed.
    """

    def __init__(self, source_ids: list[int], min_ngram_size: int, max_ngram_size: int):
        self.source_ids = source_ids
        self.sizes = range(max_ngram_size, min_ngram_size - 1, -1)
        length = len(source_ids)
        padded = -1 in source_ids
        self.starts: dict[tuple[int, ...], int] = {}  # n-gram -> where its continuation starts
        for size in self.sizes:  # n-grams of different sizes never share a key
            # the windows with a token after them, built in C (zip, to the shortest shifted slice: the last window
            # starts at length - size - 1); written last to first, so the first occurrence of an n-gram is kept
            shifted = (source_ids[offset : length - 1] for offset in range(size))
            windows = list(enumerate(zip(*shifted, strict=False)))
            starts = {gram: start + size for start, gram in reversed(windows)}
            if padded:
                starts = {gram: start for gram, start in starts.items() if -1 not in gram}
            self.starts.update(starts)

    def continuation(self, prefix: list[int], num_tokens: int) -> list[int]:
        """The up to `num_tokens` source tokens after the longest indexed n-gram that ends `prefix` (empty without
        one), stopping at the source's end or its padding."""
        for size in self.sizes:
            if len(prefix) < size:
                continue
            start = self.starts.get(tuple(prefix[len(prefix) - size :]))
            if start is not None:
                tokens = self.source_ids[start : start + num_tokens]
                return tokens[: tokens.index(-1)] if -1 in tokens else tokens
        return []


def find_source_continuations(
    source_ids: torch.LongTensor,
    prefix_ids: torch.LongTensor,
    prefix_lengths: torch.LongTensor,
    num_tokens: int,
    max_ngram_size: int,
    min_ngram_size: int = 1,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """For each row, the `num_tokens` source tokens after the first occurrence of the row's last n prefix tokens,
    with n the longest that occurs, from `max_ngram_size` down to `min_ngram_size`.

    Args:
        source_ids (`torch.LongTensor` of shape `(rows, source_length)`): Source ids, `-1` where padded.
        prefix_ids (`torch.LongTensor` of shape `(rows, prefix_length)`): Committed tokens, right-padded.
        prefix_lengths (`torch.LongTensor` of shape `(rows,)`): Valid tokens per row.

    Returns:
        `continuations` `(rows, num_tokens)` (0 where there is none) and `counts` `(rows,)`: how many leading
        continuation tokens each row has (0 without a match, fewer than `num_tokens` near the source's end).
    """
    rows, source_length = source_ids.shape
    device = source_ids.device
    start = torch.full((rows,), -1, dtype=torch.long, device=device)  # where the continuation begins
    for size in range(max_ngram_size, min_ngram_size - 1, -1):
        if size >= source_length:
            continue
        # the row's last `size` tokens; rows with fewer committed tokens cannot match at this size
        offsets = prefix_lengths.unsqueeze(1) - size + torch.arange(size, device=device)
        suffix = prefix_ids.gather(1, offsets.clamp(min=0))
        windows = source_ids.unfold(1, size, 1)[:, : source_length - size]  # windows with a token after them
        hits = (windows == suffix.unsqueeze(1)).all(dim=2) & (prefix_lengths >= size).unsqueeze(1)
        found = hits.any(dim=1) & (start < 0)
        first = hits.float().argmax(dim=1)  # the first occurrence
        start = torch.where(found, first + size, start)
    positions = start.unsqueeze(1) + torch.arange(num_tokens, device=device)
    continuations = source_ids.gather(1, positions.clamp(0, source_length - 1))
    valid = (start >= 0).unsqueeze(1) & (positions < source_length) & (continuations >= 0)
    counts = valid.long().cumprod(dim=1).sum(dim=1)
    return torch.where(valid, continuations, 0), counts


class SourceCopyDrafter(Drafter):
    """Drafts by copying from the source: the tokens that follow, in the row's source ids, the longest n-gram of its
    last generated tokens found there.

    The verifier's source and target must share one vocabulary (BART, T5, Pegasus, mBART and Marian models with a
    shared vocabulary do): build it with [`~SourceCopyDrafter.from_verifier`], which checks that.

    Args:
        vocab_size (`int`): The verifier's vocabulary size.
        num_draft_tokens (`int` or `"auto"`, *optional*): Default k (tokens copied per iteration): the fallback's
            (`"auto"` when it says so), or `"auto"` without one, which chooses k up to 8 (its `max_draft_tokens` is
            then 8, which also bounds a k given to `generate()`). A fixed k drafts even where copies rarely pay.
        max_ngram_size (`int`, *optional*, defaults to 3): The longest n-gram of the prefix matched in the source.
        min_ngram_size (`int`, *optional*, defaults to 1): The shortest.
        fallback (`Drafter` or `SpecDrafterModel`, *optional*): Drafts the rows the source does not continue (a
            trained drafter of this verifier); without it those rows verify no drafts.
        cpu_index (`bool`, *optional*, defaults to `True`): For a source on the CPU, look continuations up in each
            row's n-gram index (`SourceNgramIndex`, built once per `generate()` call; the host reads the prefix's
            last tokens at every iteration, free on a CPU); `False` runs the search other devices run, on the
            device, also on the CPU. Both propose the same drafts.
    """

    def __init__(
        self,
        vocab_size: int,
        num_draft_tokens: int | str | None = None,
        max_ngram_size: int = 3,
        min_ngram_size: int = 1,
        fallback=None,
        cpu_index: bool = True,
    ):
        fallback = None if fallback is None else as_drafter(fallback)
        if num_draft_tokens is None:
            num_draft_tokens = AUTO if fallback is None else fallback.num_draft_tokens
            num_draft_tokens = num_draft_tokens if num_draft_tokens == AUTO else int(num_draft_tokens)
        if num_draft_tokens != AUTO and not is_positive_int(num_draft_tokens):
            raise ValueError(f"`num_draft_tokens` must be an integer >= 1 or {AUTO!r}, got {num_draft_tokens!r}.")
        for name, value in (("max_ngram_size", max_ngram_size), ("min_ngram_size", min_ngram_size)):
            if not is_positive_int(value):
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
        if min_ngram_size > max_ngram_size:
            raise ValueError(
                f"`min_ngram_size` ({min_ngram_size}) must be at most `max_ngram_size` ({max_ngram_size})."
            )
        self.vocab_size = vocab_size
        self.cpu_index = cpu_index
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size
        self.fallback = fallback
        if self.fallback is not None:
            validate_drafter(self.fallback, vocab_size)
        self.num_draft_tokens = num_draft_tokens
        # the limits of the contract are the fallback's (the copy itself has none; a k chosen as decoding runs needs
        # one, the default k's)
        self.max_draft_tokens = getattr(fallback, "max_draft_tokens", None)
        if self.max_draft_tokens is None and num_draft_tokens == AUTO:
            self.max_draft_tokens = DEFAULT_MAX_DRAFT_TOKENS
        self.max_positions = getattr(fallback, "max_positions", None)
        self.verifier_state_layers = getattr(fallback, "verifier_state_layers", None)
        if self.max_draft_tokens is not None and num_draft_tokens != AUTO and num_draft_tokens > self.max_draft_tokens:
            raise ValueError(
                f"`num_draft_tokens` ({num_draft_tokens}) exceeds the fallback drafter's `max_draft_tokens` "
                f"({self.max_draft_tokens}): lower it to at most {self.max_draft_tokens}."
            )

    @classmethod
    def from_verifier(cls, verifier, **kwargs) -> SourceCopyDrafter:
        """A source-copy drafter for `verifier`, whose encoder and decoder must read one shared vocabulary.

        Raises:
            ValueError: for a verifier that is not encoder-decoder, or whose encoder and decoder embed different
                vocabularies (copied source ids would mean other tokens in the target).
        """
        if not getattr(verifier.config, "is_encoder_decoder", False):
            raise ValueError(
                f"SourceCopyDrafter copies from an encoder's input; {type(verifier).__name__} is decoder-only: use "
                "transformers' prompt lookup (`prompt_lookup_num_tokens`) instead."
            )
        if not shares_vocabulary(verifier):
            raise ValueError(
                f"SourceCopyDrafter needs a verifier whose source and target share one vocabulary, but "
                f"{type(verifier).__name__}'s encoder and decoder have separate embeddings "
                "(`share_encoder_decoder_embeddings=False`): source ids would mean other target tokens. Use a "
                "trained drafter (`SpecDrafterModel`) for this verifier."
            )
        vocab_size = verifier.config.get_text_config(decoder=True).vocab_size
        return cls(vocab_size, **kwargs)

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states) -> SourceCopyState:
        """Keep the source ids (padding as -1); start the fallback's state.

        Raises:
            ValueError: when `generate()` was given no source ids (`inputs_embeds` or `encoder_outputs` alone).
        """
        if input_ids is None:
            raise ValueError(
                "SourceCopyDrafter copies from the source ids, but `generate()` was given none (`inputs_embeds`, or "
                "`encoder_outputs` without `input_ids`): pass the source `input_ids`."
            )
        source_ids = input_ids.long()
        if attention_mask is not None:
            source_ids = source_ids.masked_fill(attention_mask.to(source_ids.device) == 0, -1)
        fallback_state = None
        if self.fallback is not None:
            fallback_state = self.fallback.init_drafting_state(input_ids, attention_mask, encoder_hidden_states)
        indexes = None
        if self.cpu_index and source_ids.device.type == "cpu":  # elsewhere no host read per iteration
            indexes = [SourceNgramIndex(row, self.min_ngram_size, self.max_ngram_size) for row in source_ids.tolist()]
        return SourceCopyState(source_ids, fallback_state, indexes)

    def select_rows(self, state: SourceCopyState, rows: torch.LongTensor) -> SourceCopyState:
        """Keep the rows `rows` of the source ids and of the fallback's state."""
        fallback_state = state.fallback_state
        if self.fallback is not None:
            fallback_state = self.fallback.select_rows(fallback_state, rows)
        indexes = state.ngram_indexes
        if indexes is not None:
            indexes = [indexes[row] for row in rows.tolist()]
        source_ids = state.source_ids.index_select(0, rows.to(state.source_ids.device))
        return SourceCopyState(source_ids, fallback_state, indexes)

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None) -> DraftProposal:
        """Copy the source's continuation of each row's last n-gram; ask the fallback for rows without one (only when
        some row has none).

        Returns:
            [`~specdec_hf.drafting.DraftProposal`]: `draft_ids` `(rows, k)`, no scores (a copied token is a certain
            proposal), and `num_drafts` `(rows,)`: the copied tokens per row; where the fallback ran, a
            [`CopyOrFallbackProposal`], whose rows the fallback drafted carry its scores, confidence and `num_drafts`
            (k when it states none).
        """
        device = state.source_ids.device
        if state.ngram_indexes is not None:
            copied, counts = _look_up_continuations(state.ngram_indexes, prefix_ids, prefix_lengths, num_draft_tokens)
        else:
            copied, counts = find_source_continuations(
                state.source_ids,
                prefix_ids.to(device),
                prefix_lengths.to(device),
                num_draft_tokens,
                self.max_ngram_size,
                self.min_ngram_size,
            )
        unmatched = counts == 0
        if self.fallback is None or not bool(unmatched.any()):  # the host read only where a fallback may run
            return DraftProposal(draft_ids=copied, draft_logits=None, state=state, num_drafts=counts)
        # the fallback sees every row (its prefix cache advances with all of them) and drafts where the copy has none
        proposal = self.fallback.propose(
            state.fallback_state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states
        )
        fallback_counts = torch.full_like(counts, num_draft_tokens)
        if proposal.num_drafts is not None:
            fallback_counts = proposal.num_drafts.to(device)
        draft_ids = torch.where(unmatched.unsqueeze(1), proposal.draft_ids[:, :num_draft_tokens].to(device), copied)
        num_drafts = torch.where(unmatched, fallback_counts, counts)
        return CopyOrFallbackProposal(
            draft_ids, replace(state, fallback_state=proposal.state), num_drafts, unmatched, proposal
        )


def _look_up_continuations(
    indexes: list[SourceNgramIndex], prefix_ids: torch.LongTensor, prefix_lengths: torch.LongTensor, num_tokens: int
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """`find_source_continuations`' result, from each row's `SourceNgramIndex` (on the CPU)."""
    longest = indexes[0].sizes.start  # every row's index has the drafter's sizes
    tails = row_tails(prefix_ids, prefix_lengths, longest)
    found = [index.continuation(tail, num_tokens) for index, tail in zip(indexes, tails, strict=True)]
    continuations = torch.tensor([tokens + [0] * (num_tokens - len(tokens)) for tokens in found], dtype=torch.long)
    counts = torch.tensor([len(tokens) for tokens in found], dtype=torch.long)
    return continuations, counts


class CopyOrFallbackProposal(DraftProposal):
    """A proposal whose rows are copies (certain: probability 1 at the copied id) or the fallback's drafts (its own
    scores and confidence), so that sampling and confidence-truncated verification judge each row by what proposed
    it. The scores and the confidence are built when first read: greedy decoding never reads them. It is not a
    dataclass of its own (`dataclasses.replace` does not apply).

    Args:
        draft_ids (`torch.LongTensor` of shape `(rows, k)`): The copied or the fallback's drafts of each row.
        state ([`SourceCopyState`]): The updated state.
        num_drafts (`torch.LongTensor` of shape `(rows,)`): Drafts worth verifying per row.
        from_fallback (`torch.BoolTensor` of shape `(rows,)`): The rows the fallback drafted.
        fallback_proposal ([`~specdec_hf.drafting.DraftProposal`]): The fallback's proposal for every row.
    """

    def __init__(self, draft_ids, state, num_drafts, from_fallback, fallback_proposal: DraftProposal):
        self.draft_ids = draft_ids
        self.state = state
        self.num_drafts = num_drafts
        self.draft_confidence = None
        self.from_fallback = from_fallback
        self.fallback_proposal = fallback_proposal
        self._draft_logits = None

    def __repr__(self) -> str:  # the dataclass repr would build the lazy scores
        return f"{type(self).__name__}(draft_ids={self.draft_ids!r}, num_drafts={self.num_drafts!r})"

    @property
    def draft_logits(self) -> torch.FloatTensor | None:
        """`(rows, k, vocab_size)`: the fallback's scores on its rows, 0 at the copied id and `-inf` elsewhere on the
        others; `None` when the fallback gives no scores (every draft then counts as certain)."""
        if self._draft_logits is None:
            fallback_logits = self.fallback_proposal.draft_logits
            if fallback_logits is None:
                return None
            width = self.draft_ids.shape[1]
            logits = fallback_logits[:, :width].to(self.draft_ids.device, torch.float32)
            # the fallback's rows index nothing (their ids are checked by the loop after this is built); no boolean
            # indexing, which would read the mask on the host
            ids = self.draft_ids.clamp(min=0).masked_fill(self.from_fallback[:, None], 0)
            certain = torch.full_like(logits, float("-inf")).scatter_(-1, ids.unsqueeze(-1), 0.0)
            self._draft_logits = torch.where(self.from_fallback[:, None, None], logits, certain)
        return self._draft_logits

    def confidence(self) -> torch.FloatTensor:
        """`(rows, k)`: 1 for a copied draft, the fallback's confidence on its rows (1 where it states none);
        `draft_confidence` instead where it was set."""
        if self.draft_confidence is not None:
            return self.draft_confidence
        confidence = torch.ones(self.draft_ids.shape, device=self.draft_ids.device)
        fallback = self.fallback_proposal.confidence()
        if fallback is not None:
            width = confidence.shape[1]
            if fallback.shape[1] < width:
                raise ValueError(
                    f"The fallback drafter's confidence has {fallback.shape[1]} drafts per row, fewer than the {width} "
                    "it proposed: its `draft_confidence` (or `draft_logits`) must cover every draft."
                )
            fallback = fallback[:, :width].float().to(confidence.device)
            confidence = torch.where(self.from_fallback[:, None], fallback, confidence)
        return confidence


def shares_vocabulary(verifier) -> bool:
    """Whether source ids mean the same tokens as target ids: the encoder and the decoder embed with one matrix, or
    with matrices of one shape in a model whose config does not say they are separate
    (`share_encoder_decoder_embeddings=False`)."""
    encoder, decoder = verifier.get_encoder(), verifier.get_decoder()
    encoder_embeddings = getattr(encoder, "embed_tokens", None)
    decoder_embeddings = getattr(decoder, "embed_tokens", None)
    if encoder_embeddings is None or decoder_embeddings is None:
        return bool(getattr(verifier.config, "share_encoder_decoder_embeddings", True))
    if encoder_embeddings.weight is decoder_embeddings.weight:
        return True
    return encoder_embeddings.weight.shape == decoder_embeddings.weight.shape and bool(
        getattr(verifier.config, "share_encoder_decoder_embeddings", True)
    )
