"""The drafting interface: what the speculative decoding loop asks of a drafter.

Speculative Decoding (Xia et al., 2023, arXiv 2203.16487) separates *drafting* (guess the next k tokens) from
*verifying* (score them with the verifier in one forward pass). The loop in :mod:`specdec_hf.generation` talks to a
drafter only through the small contract below, so that the Spec-Drafter model, test oracles and other drafters (an
n-gram lookup, a retrieval drafter, ...) are interchangeable.

A drafter implements three methods and two attributes:

- ``vocab_size``: size of the vocabulary its draft ids and logits index (must equal the verifier's).
- ``block_size``: its default number of drafted tokens per iteration (k).
- ``init_drafting_state(...)``: called once per ``generate()`` call, after the verifier's encoder pass.
- ``propose(state, prefix_ids, prefix_lengths, block_size)``: called once per iteration; returns k draft ids per row.
- ``select_rows(state, rows)``: called when finished rows leave the batch.
- ``max_block_size`` (optional, default ``None``: no limit): the most tokens one ``propose`` call can draft.
- ``verifier_state_layers`` (optional, default ``None``): indices into the verifier's decoder ``hidden_states`` that
  the drafter reads (EAGLE-style drafting). When set, the loop asks the verifier's verification forward for its
  hidden states (no extra pass) and calls ``propose(..., prefix_states=...)`` with those layers' states, concatenated,
  at every committed position but each row's last (which the verifier has not read yet).

The state object is owned by the drafter (an encoder output, a prefix key/value cache, ...); the loop never looks
inside it and never keeps it between ``generate()`` calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DraftProposal", "Drafter", "check_state_layers", "decoder_hidden_state_count", "validate_drafter"]


@dataclass
class DraftProposal:
    """What a drafter returns for one iteration.

    Args:
        draft_ids (`torch.LongTensor` of shape `(batch_size, block_size)`):
            The drafted next tokens of every active row.
        draft_logits (`torch.FloatTensor` of shape `(batch_size, block_size, vocab_size)`, *optional*):
            The drafter's unnormalised scores behind `draft_ids`; sampling uses them as the proposal distribution
            (without them a draft counts as a certain proposal).
        state (`Any`):
            The drafter's state, updated; passed back to the next `propose` call.
        draft_confidence (`torch.FloatTensor` of shape `(batch_size, block_size)`, *optional*):
            The drafter's probability of each draft; confidence-truncated verification (`draft_confidence_threshold`)
            verifies only the leading drafts whose running product stays above a threshold. `None`:
            [`~DraftProposal.confidence`] derives it from `draft_logits` when it is needed.
        draft_vocab_ids (`torch.LongTensor` of shape `(head_size,)`, *optional*):
            For a drafter with a reduced-vocabulary head: the verifier ids that the last dimension of `draft_logits`
            scores (shape `(batch_size, block_size, head_size)`); every other id has probability 0. `None`: the
            last dimension is the whole vocabulary.
    """

    draft_ids: torch.LongTensor
    draft_logits: torch.FloatTensor | None
    state: Any
    draft_confidence: torch.FloatTensor | None = None
    draft_vocab_ids: torch.LongTensor | None = None

    def confidence(self) -> torch.FloatTensor | None:
        """The drafter's probability of each draft: `draft_confidence` when the drafter gave it, else the softmax of
        `draft_logits` at `draft_ids` (0 for an id outside a reduced head); `None` with neither. Derived on demand
        because the softmax over the head would cost every call something (on CPU about a tenth of a small drafter's
        call) while only confidence-truncated verification reads it.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, width)`, width the smaller of `draft_ids`' and `draft_logits`'
            second dimensions (both at least the k of the iteration), or `None`.
        """
        if self.draft_confidence is not None or self.draft_logits is None:
            return self.draft_confidence
        width = min(self.draft_ids.shape[1], self.draft_logits.shape[1])
        logits = self.draft_logits[:, :width].float()
        ids = self.draft_ids[:, :width].to(logits.device).long()
        in_head = None
        if self.draft_vocab_ids is not None:
            # verifier id -> column of the reduced head (-1 where the id is not in it)
            vocab_ids = self.draft_vocab_ids.to(logits.device).long()
            column = torch.full((int(max(ids.max(), vocab_ids.max())) + 1,), -1, dtype=torch.long, device=ids.device)
            column[vocab_ids] = torch.arange(vocab_ids.shape[0], device=ids.device)
            ids = column[ids]
            in_head = ids >= 0
            ids = ids.clamp(min=0)
        log_probs = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        probabilities = log_probs.exp()
        return probabilities if in_head is None else torch.where(in_head, probabilities, 0.0)


class Drafter(ABC):
    """Abstract drafter: subclass it (or provide the same methods) to plug a drafter into speculative decoding."""

    vocab_size: int
    block_size: int
    verifier_state_layers: list[int] | None = None
    max_block_size: int | None = None

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
        block_size: int,
    ) -> DraftProposal:
        """Draft the next `block_size` tokens of every active row.

        Args:
            state: What `init_drafting_state` (or the previous `propose`) returned.
            prefix_ids (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`):
                The committed decoder tokens of each row, starting with the decoder start token, right-padded.
                A row's committed tokens only ever grow between calls.
            prefix_lengths (`torch.LongTensor` of shape `(batch_size,)`): Number of valid tokens per row.
            block_size (`int`): Number of tokens to draft (k); at least 1.

        A drafter with `verifier_state_layers` also receives `prefix_states` (`torch.FloatTensor` of shape
        `(batch_size, max_prefix_length, feature_width)`): the verifier's states at each committed position; the
        entry at a row's last committed position is not yet valid.
        """

    @abstractmethod
    def select_rows(self, state: Any, rows: torch.LongTensor) -> Any:
        """Keep only `rows` (indices into the current batch, in order) of the state; returns the new state."""


_REQUIRED_METHODS = ("init_drafting_state", "propose", "select_rows")


def _is_int(obj: Any, name: str) -> bool:
    value = getattr(obj, name, None)
    return isinstance(value, int) and not isinstance(value, bool)


def validate_drafter(drafter: Any, verifier_vocab_size: int) -> None:
    """Check that `drafter` implements the drafting interface and shares the verifier's vocabulary.

    Raises:
        ValueError: naming the missing method or the mismatching vocabulary size, and the fix.
    """
    missing = [name for name in _REQUIRED_METHODS if not callable(getattr(drafter, name, None))]
    missing += [f"{name} (int attribute)" for name in ("vocab_size", "block_size") if not _is_int(drafter, name)]
    if missing:
        raise ValueError(
            f"`drafter` ({type(drafter).__name__}) does not implement the drafting interface: missing "
            f"{', '.join(missing)}. Pass a `SpecDrafterModel` or a subclass of `specdec_hf.Drafter`."
        )
    if drafter.vocab_size != verifier_vocab_size:
        raise ValueError(
            f"`drafter` vocabulary size ({drafter.vocab_size}) does not match the verifier's ({verifier_vocab_size}). "
            "A drafter must be trained for this verifier's tokenizer: build one with "
            "`SpecDrafterModel.from_verifier(verifier)` and train it with `train_drafter.py`."
        )


def decoder_hidden_state_count(verifier) -> int:
    """How many `decoder_hidden_states` a verifier's forward returns: its decoder layers plus the embedding output.

    Counted on the decoder module itself (`layers`, or T5's `block`), which is what the forward runs.
    """
    decoder = verifier.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        layers = getattr(decoder, "block", None)
    if layers is None:
        raise ValueError(f"cannot tell the decoder layers of {type(verifier).__name__} (no `layers` or `block`)")
    return len(layers) + 1


def check_state_layers(layers: list[int] | None, verifier) -> None:
    """Check that the decoder hidden-state indices a drafter reads (`verifier_state_layers`) exist in `verifier`.

    Raises:
        ValueError: naming the indices, the valid range and the fix.
    """
    if not layers:
        return
    count = decoder_hidden_state_count(verifier)
    wrong = [index for index in layers if not -count <= int(index) < count]
    if wrong:
        raise ValueError(
            f"The drafter reads verifier decoder states {wrong} (`prefix_feature_layers`), but this verifier returns "
            f"{count} (indices {-count} to {count - 1}: 0 is the embedding output, -1 the top layer). Name layers "
            "this verifier has, or use a drafter trained for it."
        )
