"""Drafting with a [`~specdec_hf.SpecDrafterModel`]: its implementation of the drafting contract.

The model (`specdec_hf.models`) is a plain `PreTrainedModel`; what drafting with it needs per `generate()` call lives
here, as transformers keeps its candidate generators apart from the models they run:

- [`SpecDrafterState`]: the cross-attention keys and values of the source, projected once, and the key/value
  buffers of the committed prefix (`prefix_attention="causal"`), grown as rows commit tokens;
- [`SpecDrafterAdapter.propose`]: one decoder pass over the uncached prefix tokens and k mask slots, reading the
  verifier's states where the drafter was trained with them (EAGLE-style);
- [`ReducedHeadProposal`]: a reduced head's drafts mapped back to verifier ids, and its scores over the verifier's
  vocabulary, so that nothing of the head's own vocabulary reaches the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from ..drafting import Drafter, DraftProposal, softmax_at
from ..models import SpecDrafterModel
from ..models.modeling_spec_drafter import expand_encoder_attention_mask, head_rows_of

__all__ = ["ReducedHeadProposal", "SpecDrafterAdapter", "SpecDrafterState", "as_drafter"]

KeyValue = tuple[torch.Tensor, torch.Tensor]


@dataclass
class SpecDrafterState:
    """Per-`generate()` drafting state of a [`SpecDrafterModel`] (owned by the adapter, opaque to the loop).

    Args:
        cross_key_values (`tuple` of `(key, value)` per decoder layer, each of shape
            `(batch_size, num_heads, source_length, head_dim)`):
            The cross-attention keys and values of the encoder output, projected once per `generate()` call.
        encoder_attention_mask (`torch.BoolTensor` of shape `(batch_size, 1, 1, source_length)`, *optional*):
            `True` for source tokens; `None` when the source has no padding.
        prefix_key_values (`tuple` of `(key, value)` per decoder layer, each of shape
            `(batch_size, num_heads, capacity, head_dim)`, *optional*):
            Self-attention key/value buffers of the committed prefix (`prefix_attention="causal"` only). Positions
            `[0, cache_length)` are valid for every row; the rest is scratch space.
        cache_length (`int`):
            Number of cached prefix positions, shared by all rows.
    """

    cross_key_values: tuple[KeyValue, ...]
    encoder_attention_mask: torch.BoolTensor | None = None
    prefix_key_values: tuple[KeyValue, ...] | None = None
    cache_length: int = 0


class ReducedHeadProposal(DraftProposal):
    """The proposal of a drafter whose LM head scores a subset of the verifier's ids (`draft_vocab_ids`).

    `draft_ids` are verifier ids. `draft_logits`, over the verifier's vocabulary with `-inf` outside the head, are
    built from the head's scores when first read: greedy decoding never reads them, so it never pays for them.

    Args:
        draft_ids (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`): Verifier ids.
        head_logits (`torch.FloatTensor` of shape `(batch_size, num_draft_tokens, head_size)`): The head's scores.
        state: The drafter's updated state.
        head_ids (`torch.LongTensor` of shape `(head_size,)`): The verifier id of each head row.
        vocab_size (`int`): The verifier's vocabulary size.
        head_rows (`torch.LongTensor` of shape `(vocab_size,)`, *optional*): The inverse of `head_ids`: the head
            row of each verifier id, -1 outside the head ([`~models.modeling_spec_drafter.head_rows_of`]). Built
            from `head_ids` when first needed if not given; a drafter that proposes many times passes one it made
            once.
    """

    def __init__(
        self,
        draft_ids: torch.LongTensor,
        head_logits: torch.FloatTensor,
        state,
        head_ids: torch.LongTensor,
        vocab_size: int,
        head_rows: torch.LongTensor | None = None,
    ):
        self.draft_ids = draft_ids
        self.head_logits = head_logits
        self.state = state
        self.draft_confidence = None
        self.head_ids = head_ids
        self.vocab_size = vocab_size
        self.head_rows = head_rows
        self._draft_logits = None

    @property
    def draft_logits(self) -> torch.FloatTensor:
        """`(batch_size, num_draft_tokens, vocab_size)` scores over the verifier's vocabulary, `-inf` outside the
        head."""
        if self._draft_logits is None:
            logits = self.head_logits
            full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
            full[..., self.head_ids.to(logits.device)] = logits
            self._draft_logits = full
        return self._draft_logits

    def confidence(self) -> torch.FloatTensor:
        """The softmax of the head's scores at each draft (0 for an id outside the head), computed on the head;
        `draft_confidence` instead where it was set."""
        if self.draft_confidence is not None:
            return self.draft_confidence
        width = min(self.draft_ids.shape[1], self.head_logits.shape[1])
        logits = self.head_logits[:, :width]
        if self.head_rows is None:
            self.head_rows = head_rows_of(self.head_ids, self.vocab_size)
        head_rows = self.head_rows.to(logits.device)
        return softmax_at(logits, head_rows[self.draft_ids[:, :width].to(logits.device)])


class SpecDrafterAdapter(Drafter):
    """Drafts with a [`SpecDrafterModel`] through the drafting contract of :mod:`specdec_hf.drafting`.

    `generate(drafter=model)` wraps the model in one of these per call; build one yourself to call `propose`
    directly (benchmarks, tests). Besides maps derived from the model's head (remade when the head changes), the
    adapter keeps nothing between `generate()` calls: all per-call state is in the [`SpecDrafterState`] it returns.

    Args:
        model ([`SpecDrafterModel`]): The drafter, in eval mode, on its device and dtype.
    """

    def __init__(self, model: SpecDrafterModel):
        config = model.config
        self.model = model
        self.vocab_size = config.vocab_size
        self.max_draft_tokens = config.max_draft_tokens
        self.max_positions = config.max_position_embeddings
        self.num_draft_tokens = config.num_draft_tokens or config.max_draft_tokens
        self.verifier_state_layers = config.verifier_state_layers
        self.causal_prefix = config.prefix_attention == "causal"
        self._head_key = ()  # what the maps below were made from: never equal to a real key
        self._refresh_head_maps()

    def _refresh_head_maps(self) -> None:
        """Keep `head_ids` (the verifier id of each row of a reduced head) and `head_rows` (its inverse, which the
        proposals' confidence reads) those of the model now, so that a long-lived adapter never reads a stale map.
        They are made once, and again when `draft_vocab_ids` is replaced or changed in place (a `load_state_dict`, a
        re-laid vocabulary) or the model moves to another device; for a buffer made under `torch.inference_mode`,
        which has no version counter, at every call. A change through `draft_vocab_ids.data` bypasses the version
        counter and is not seen."""
        model = self.model
        head_ids = model.draft_vocab_ids
        device = model.shared.weight.device
        if head_ids is None:
            key = (device,)
        elif head_ids.is_inference():
            key = object()  # never equal to the last key
        else:
            key = (device, id(head_ids), head_ids.data_ptr(), head_ids._version)
        if key == self._head_key:
            return
        self._head_key = key
        self.head_ids = head_ids
        self.head_rows = None if head_ids is None else head_rows_of(head_ids, self.vocab_size)

    @torch.no_grad()
    def init_drafting_state(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.LongTensor | None,
        encoder_hidden_states: torch.FloatTensor,
    ) -> SpecDrafterState:
        """Encode the source once per `generate()` call and project the cross-attention keys and values.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*):
                Source ids; needed unless `use_verifier_encoder=True`.
            attention_mask (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*):
                1 for source tokens, 0 for padding.
            encoder_hidden_states (`torch.FloatTensor` of shape `(batch_size, source_length, verifier_d_model)`):
                The verifier's encoder output (used with `use_verifier_encoder=True`, ignored otherwise).

        Returns:
            [`SpecDrafterState`]
        """
        model = self.model
        # the verifier's encoder output and the source may live on another device than the drafter
        device = model.shared.weight.device
        input_ids, attention_mask, encoder_hidden_states = (
            None if tensor is None else tensor.to(device)
            for tensor in (input_ids, attention_mask, encoder_hidden_states)
        )
        if model.encoder is None:
            if encoder_hidden_states is None:
                raise ValueError("`use_verifier_encoder=True` needs the verifier's `encoder_hidden_states`.")
            self._check_verifier_width(encoder_hidden_states.shape[-1])
            memory = model.encoder_memory(encoder_hidden_states)
        else:
            memory = model.encode(input_ids, attention_mask)
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # no padding: let attention skip the mask
        return SpecDrafterState(
            cross_key_values=model.decoder.project_encoder_states(memory),
            encoder_attention_mask=expand_encoder_attention_mask(attention_mask),
        )

    def _check_verifier_width(self, width: int) -> None:
        """A drafter reading the verifier's encoder output is built for one width (`config.verifier_d_model`): a
        verifier of another width would fail inside its projection with a shape error naming no model."""
        config = self.model.config
        expected = config.verifier_d_model or config.d_model
        if width != expected:
            raise ValueError(
                f"The drafter reads the verifier's encoder output (`use_verifier_encoder=True`) and was built for a "
                f"verifier of width {expected} (`config.verifier_d_model`), but this verifier's encoder output has "
                f"width {width}: use the drafter with the verifier it was built for, or build one for this verifier "
                "with `SpecDrafterModel.from_verifier(verifier, use_verifier_encoder=True)` and train it."
            )

    @torch.no_grad()
    def propose(
        self,
        state: SpecDrafterState,
        prefix_ids: torch.LongTensor,
        prefix_lengths: torch.LongTensor,
        num_draft_tokens: int,
        verifier_states: torch.FloatTensor | None = None,
    ) -> DraftProposal:
        """Draft the next `num_draft_tokens` tokens of every row in one decoder pass.

        With `prefix_attention="causal"` only the prefix tokens not cached yet are fed (per row, from the shared
        cache length to the row's length, right-padded), and the cache is advanced to the shortest row's length.
        The prefix cache buffers are updated in place: always pass on the returned state.

        Args:
            state ([`SpecDrafterState`]): From `init_drafting_state` or the previous `propose`.
            prefix_ids (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`):
                Committed tokens of each row, starting with the decoder start token, right-padded.
            prefix_lengths (`torch.LongTensor` of shape `(batch_size,)`): Valid tokens per row.
            num_draft_tokens (`int`): Number of tokens to draft (1 to `config.max_draft_tokens`).
            verifier_states (`torch.FloatTensor` of shape `(batch_size, >= max_prefix_length - 1, feature_width)`,
                *optional*): The verifier's states (the `verifier_state_layers`, concatenated) at the committed
                positions; required for a drafter with `verifier_state_layers` once a prefix is longer than the
                start token. A row's last committed token has no state yet, and none is read.

        Returns:
            [`~specdec_hf.drafting.DraftProposal`] (a [`ReducedHeadProposal`] for a reduced head): `draft_ids`
            `(batch_size, num_draft_tokens)`, the argmax of the head, as verifier ids; `draft_logits`
            `(batch_size, num_draft_tokens, vocab_size)` in float32; and the updated state.
        """
        model = self.model
        num_draft_tokens = model.check_num_draft_tokens(num_draft_tokens)
        self._refresh_head_maps()
        device = model.shared.weight.device
        prefix_lengths = prefix_lengths.to(device)
        lengths = prefix_lengths.tolist()
        max_length, min_length = max(lengths), min(lengths)
        model.check_positions(max_length + num_draft_tokens)

        causal = self.causal_prefix
        # prefixes only grow; if a caller breaks that, recompute from scratch rather than read a stale cache
        cache_length = state.cache_length if causal and min_length >= state.cache_length else 0
        num_new = max_length - cache_length
        cache = self._reserve_prefix_cache(state, cache_length + num_new + num_draft_tokens) if causal else None
        previous_states = None
        if model.feature_proj is not None:
            previous_states = self._previous_states(verifier_states, prefix_ids.shape[0], cache_length, max_length)
        if min_length == max_length:  # always at batch size 1: no padding, no key mask, the same slot positions
            prefix_mask, mask_positions = None, range(max_length, max_length + num_draft_tokens)
        else:
            prefix_mask = torch.arange(num_new, device=device) < (prefix_lengths - cache_length)[:, None]
            mask_positions = prefix_lengths[:, None] + torch.arange(num_draft_tokens, device=device)
        hidden_states = model.decoder(
            inputs_embeds=model.embed_prefix(prefix_ids[:, cache_length:max_length].to(device), previous_states),
            prefix_positions=range(cache_length, max_length),
            prefix_mask=prefix_mask,
            mask_positions=mask_positions,
            cross_key_values=state.cross_key_values,
            encoder_attention_mask=state.encoder_attention_mask,
            cache=cache,
            cache_length=cache_length,
        )
        head_logits = model.head_logits(hidden_states).float()
        if causal:
            # positions below the shortest prefix are committed in every row: keep them, the rest is scratch
            state = replace(state, prefix_key_values=cache, cache_length=min_length)
        # argmax in float32: the same ids as in the model's dtype, and faster on CPU than on half-precision logits
        head_argmax = head_logits.argmax(dim=-1)
        if self.head_ids is None:
            return DraftProposal(draft_ids=head_argmax, draft_logits=head_logits, state=state)
        return ReducedHeadProposal(
            self.head_ids[head_argmax], head_logits, state, self.head_ids, self.vocab_size, self.head_rows
        )

    def _previous_states(
        self, verifier_states: torch.FloatTensor | None, batch_size: int, cache_length: int, max_length: int
    ) -> torch.FloatTensor:
        """The verifier's state of each fed position's predecessor: positions `[cache_length, max_length)` read
        `[cache_length - 1, max_length - 1)`, zeros before the first position."""
        feature_proj = self.model.feature_proj
        start = max(cache_length - 1, 0)
        if verifier_states is None:
            if max_length - 1 > start:
                raise ValueError(
                    "This drafter reads the verifier's decoder states: pass `verifier_states` for prefixes longer "
                    "than the start token (the speculative loop does so itself)."
                )
            verifier_states = feature_proj.weight.new_zeros(batch_size, 0, feature_proj.in_features)
        previous_states = verifier_states[:, start : max_length - 1].to(feature_proj.weight.device)
        if cache_length == 0:
            previous_states = F.pad(previous_states, (0, 0, 1, 0))
        return previous_states

    def _reserve_prefix_cache(self, state: SpecDrafterState, needed: int) -> tuple[KeyValue, ...]:
        """Return prefix key/value buffers with room for `needed` positions, keeping the first `cache_length`."""
        if state.prefix_key_values is not None and state.prefix_key_values[0][0].shape[2] >= needed:
            return state.prefix_key_values
        reference = state.cross_key_values[0][0]  # (batch_size, num_heads, source_length, head_dim)
        batch_size, num_heads, _, head_dim = reference.shape
        old_capacity = 0 if state.prefix_key_values is None else state.prefix_key_values[0][0].shape[2]
        capacity = max(needed, 2 * old_capacity, 64)
        kept = state.cache_length if state.prefix_key_values is not None else 0
        buffers = []
        for index in range(len(self.model.decoder.layers)):
            pair = []
            for which in range(2):
                buffer = reference.new_empty(batch_size, num_heads, capacity, head_dim)
                if kept:
                    buffer[:, :, :kept] = state.prefix_key_values[index][which][:, :, :kept]
                pair.append(buffer)
            buffers.append(tuple(pair))
        return tuple(buffers)

    def select_rows(self, state: SpecDrafterState, rows: torch.LongTensor) -> SpecDrafterState:
        """Keep only `rows` (indices into the current batch, in order) of every tensor of the state."""
        rows = rows.to(state.cross_key_values[0][0].device)

        def select(value):
            if isinstance(value, torch.Tensor):
                return value.index_select(0, rows)
            if isinstance(value, tuple):
                return tuple(select(item) for item in value)
            return value

        return replace(state, **{field.name: select(getattr(state, field.name)) for field in fields(state)})


def as_drafter(drafter) -> Drafter:
    """The object the loop drafts with: a [`SpecDrafterModel`] wrapped in a [`SpecDrafterAdapter`], any other
    drafter (a `Drafter` subclass, an adapter already made) as it is."""
    if isinstance(drafter, SpecDrafterModel):
        return SpecDrafterAdapter(drafter)
    return drafter
