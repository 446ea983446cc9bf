"""The drafting contract: what the speculative decoding loop asks of a drafter.

Speculative Decoding (Xia et al., 2023, arXiv 2203.16487) separates *drafting* (guess the next k tokens) from
*verifying* (score them with the verifier in one forward pass). The loop in :mod:`specdec_hf.generation` talks to a
drafter only through the small contract below, so that the Spec-Drafter (through its adapter,
`specdec_hf.generation.SpecDrafterAdapter`), test oracles and other drafters (an n-gram lookup, a retrieval
drafter, ...) are interchangeable.

A drafter has these attributes and methods:

- ``vocab_size``: size of the vocabulary its draft ids and scores index (must equal the verifier's).
- ``num_draft_tokens``: its default number of drafted tokens per iteration (k), or ``"auto"``: chosen per
  iteration as decoding runs (``specdec_hf.generation.draft_length``), up to ``max_draft_tokens``.
- ``max_draft_tokens`` (default ``None``: no limit): the most tokens one ``propose`` call can draft.
- ``max_positions`` (default ``None``: no limit): the longest prefix plus drafted tokens it can place (learned
  positions); the loop drafts fewer tokens near that limit, and none at it (the verifier then steps alone).
- ``verifier_state_layers`` (default ``None``): indices into the verifier's decoder ``hidden_states`` that the
  drafter reads (EAGLE-style drafting). When set, the loop asks the verifier's verification forward for its hidden
  states (no extra pass) and hands ``propose`` those layers' states, concatenated, as ``verifier_states``.
- ``init_drafting_state(input_ids, attention_mask, encoder_hidden_states)``: once per ``generate()`` call, after the
  verifier's encoder pass.
- ``propose(state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states)``: at each iteration that
  verifies drafts; returns k draft ids per row (and, optionally, their scores over the verifier's vocabulary, and how
  many of them per row are worth verifying). Iterations that verify none (``num_draft_tokens="auto"`` choosing 0, a
  length limit) do not call it, so a row's prefix may grow by many tokens between two calls.
- ``select_rows(state, rows)``: when finished rows leave the batch.

The state object is owned by the drafter (an encoder output, a prefix key/value cache, ...); the loop never looks
inside it and never keeps it between ``generate()`` calls. Everything a drafter returns is in the verifier's
vocabulary: a drafter with a smaller head maps its ids and scores back itself.
"""

from __future__ import annotations

import inspect
import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from .auto_draft_length import AUTO

__all__ = ["DraftProposal", "Drafter", "softmax_at", "validate_drafter"]


@dataclass
class DraftProposal:
    """What a drafter returns for one iteration.

    Args:
        draft_ids (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`):
            The drafted next tokens of every active row, verifier ids.
        draft_logits (`torch.FloatTensor` of shape `(batch_size, num_draft_tokens, vocab_size)`, *optional*):
            The drafter's unnormalised scores behind `draft_ids`, over the verifier's vocabulary (`-inf` for ids it
            never drafts); sampling uses them as the proposal distribution (without them a draft counts as a certain
            proposal).
        state (`Any`):
            The drafter's state, updated; passed back to the next `propose` call.
        draft_confidence (`torch.FloatTensor` of shape `(batch_size, num_draft_tokens)`, *optional*):
            The drafter's probability of each draft; confidence-truncated verification (`draft_confidence_threshold`)
            verifies only the leading drafts whose running product stays above a threshold. `None`:
            [`~DraftProposal.confidence`] derives it from `draft_logits` when it is needed.
        num_drafts (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            How many of each row's leading drafts are worth verifying, from 0 to k (a lookup drafter that found no
            match for a row has none); the loop verifies only those, and a row with 0 takes one plain verifier step
            (the token greedy decoding, or sampling, would emit). `None`: all k.
    """

    draft_ids: torch.LongTensor
    draft_logits: torch.FloatTensor | None
    state: Any
    draft_confidence: torch.FloatTensor | None = None
    num_drafts: torch.LongTensor | None = None

    def confidence(self) -> torch.FloatTensor | None:
        """The drafter's probability of each draft: `draft_confidence` when the drafter gave it, else the softmax of
        `draft_logits` at `draft_ids`; `None` with neither. Derived on demand, because only confidence-truncated
        verification reads it and the softmax over the vocabulary would otherwise be paid at every call.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, width)`, width the smaller of `draft_ids`' and `draft_logits`'
            second dimensions (both at least the k of the iteration), or `None`.
        """
        if self.draft_confidence is not None or self.draft_logits is None:
            return self.draft_confidence
        width = min(self.draft_ids.shape[1], self.draft_logits.shape[1])
        logits = self.draft_logits[:, :width]
        return softmax_at(logits, self.draft_ids[:, :width])


def softmax_at(logits: torch.FloatTensor, columns: torch.LongTensor) -> torch.FloatTensor:
    """The softmax of `logits` `(..., num_columns)` at `columns` `(...)`, in float32 on `logits`' device; 0 where a
    column is negative (an id the scores do not cover, e.g. outside a reduced head)."""
    logits = logits.float()
    columns = columns.to(logits.device).long()
    picked = logits.gather(-1, columns.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(columns >= 0, (picked - torch.logsumexp(logits, dim=-1)).exp(), 0.0)


class Drafter(ABC):
    """Abstract drafter: subclass it (or provide the same attributes and methods) to plug a drafter into speculative
    decoding. A [`~specdec_hf.SpecDrafterModel`] passed as `drafter=` is wrapped into
    `specdec_hf.generation.SpecDrafterAdapter`, which implements this contract for it."""

    vocab_size: int
    num_draft_tokens: int | str
    max_draft_tokens: int | None = None
    max_positions: int | None = None
    verifier_state_layers: list[int] | None = None

    @abstractmethod
    def init_drafting_state(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.LongTensor | None,
        encoder_hidden_states: torch.FloatTensor,
    ) -> Any:
        """Prepare per-``generate()`` state.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*):
                The source token ids given to the verifier (`None` when the verifier was given `inputs_embeds`).
            attention_mask (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*):
                1 for source tokens, 0 for padding; `None` means no padding.
            encoder_hidden_states (`torch.FloatTensor` of shape `(batch_size, source_length, verifier_d_model)`):
                The verifier's encoder output, which a drafter may reuse instead of running its own encoder.
        """

    @abstractmethod
    def propose(
        self,
        state: Any,
        prefix_ids: torch.LongTensor,
        prefix_lengths: torch.LongTensor,
        num_draft_tokens: int,
        verifier_states: torch.FloatTensor | None = None,
    ) -> DraftProposal:
        """Draft the next `num_draft_tokens` tokens of every active row.

        Args:
            state: What `init_drafting_state` (or the previous `propose`) returned.
            prefix_ids (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`):
                The committed decoder tokens of each row, starting with the decoder start token, right-padded.
                A row's committed tokens only ever grow between calls.
            prefix_lengths (`torch.LongTensor` of shape `(batch_size,)`): Number of valid tokens per row.
            num_draft_tokens (`int`): Number of tokens to draft (k); at least 1.
            verifier_states (`torch.FloatTensor` of shape `(batch_size, max_prefix_length, feature_width)`,
                *optional*): For a drafter with `verifier_state_layers`: the verifier's decoder states of those
                layers, concatenated, at each committed position; the entry at a row's last committed position is
                not yet valid (the verifier has not read that token). `None` for other drafters, and before the
                verifier has read any token.
        """

    @abstractmethod
    def select_rows(self, state: Any, rows: torch.LongTensor) -> Any:
        """Keep only `rows` (indices into the current batch, in order) of the state; returns the new state."""


_REQUIRED_METHODS = ("init_drafting_state", "propose", "select_rows")


def _as_int(value: Any) -> int | None:
    """`value` as a Python int if it is an integer of any kind (`int`, `numpy.int64`, a 0-dim integer tensor: what
    `operator.index` takes), else `None`; `True`/`False` are not sizes."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _takes_verifier_states(propose) -> bool:
    """Whether `propose` accepts a fifth positional argument (the loop passes `verifier_states` positionally)."""
    try:
        parameters = list(inspect.signature(propose).parameters.values())
    except (TypeError, ValueError):  # a callable without an inspectable signature: let the call itself decide
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        return True
    return sum(parameter.kind in positional for parameter in parameters) >= 5


def validate_drafter(drafter: Any, verifier_vocab_size: int) -> None:
    """Check that `drafter` implements the drafting contract and shares the verifier's vocabulary.

    `vocab_size` and `num_draft_tokens` may be any integer type (`numpy.int64`, a 0-dim integer tensor); the loop
    reads them as Python ints, and `max_positions` too (`None` or at least 2). `num_draft_tokens` may also be
    `"auto"` (k chosen as decoding runs), for a drafter with a `max_draft_tokens` (the largest k it may choose). A
    drafter written against the contract before `verifier_states` (a `propose` with four arguments) is refused with
    the change to make.

    Raises:
        ValueError: naming the missing method or attribute, the mismatching vocabulary size, and the fix.
    """
    name = type(drafter).__name__
    missing = [method for method in _REQUIRED_METHODS if not callable(getattr(drafter, method, None))]
    if missing:
        raise ValueError(
            f"`drafter` ({name}) does not implement the drafting interface: missing {', '.join(missing)}. Pass a "
            "`SpecDrafterModel` or a subclass of `specdec_hf.Drafter`."
        )
    if not _takes_verifier_states(drafter.propose):
        raise ValueError(
            f"`drafter` ({name}) follows an earlier version of the drafting contract: give `propose` a fifth "
            "parameter, `verifier_states=None` (the verifier's hidden states; a drafter without "
            "`verifier_state_layers` always receives None). See `specdec_hf.Drafter`."
        )
    vocab_size = _as_int(getattr(drafter, "vocab_size", None))
    num_draft_tokens = getattr(drafter, "num_draft_tokens", None)
    if vocab_size is None or (num_draft_tokens != AUTO and _as_int(num_draft_tokens) is None):
        raise ValueError(
            f"`drafter` ({name}) does not implement the drafting interface: `vocab_size` and `num_draft_tokens` "
            f"must be integer attributes, `num_draft_tokens` possibly {AUTO!r} (got "
            f"{getattr(drafter, 'vocab_size', None)!r} and {num_draft_tokens!r}). Pass a `SpecDrafterModel` or a "
            "subclass of `specdec_hf.Drafter`."
        )
    if num_draft_tokens == AUTO and _as_int(getattr(drafter, "max_draft_tokens", None)) is None:
        raise ValueError(
            f"`drafter` ({name}) has `num_draft_tokens={AUTO!r}` but no `max_draft_tokens`: a k chosen as decoding "
            "runs needs the largest k it may take. Give the drafter an integer `max_draft_tokens`, or an integer "
            "`num_draft_tokens`."
        )
    positions = getattr(drafter, "max_positions", None)
    limit = None if positions is None else _as_int(positions)
    if positions is not None and (limit is None or limit < 2):
        raise ValueError(
            f"`drafter` ({name}) has `max_positions` {positions!r}: it must be None (no limit) or an integer of at "
            "least 2 (the decoder start token and one drafted token)."
        )
    if vocab_size != verifier_vocab_size:
        raise ValueError(
            f"`drafter` vocabulary size ({vocab_size}) does not match the verifier's ({verifier_vocab_size}). "
            "A drafter must be trained for this verifier's tokenizer: build one with "
            "`SpecDrafterModel.from_verifier(verifier)` and train it with `train_drafter.py`."
        )
