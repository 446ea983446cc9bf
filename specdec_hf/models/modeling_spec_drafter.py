"""PyTorch Spec-Drafter model.

The Spec-Drafter of Speculative Decoding (Xia et al., 2023, arXiv 2203.16487; official fairseq code:
github.com/hemingkx/SpecDec) is a small non-autoregressive encoder-decoder that shares the verifier's vocabulary. Its
decoder reads the accepted prefix followed by k mask tokens and predicts the next k tokens in one forward pass; each
mask slot has its own learned query so that the k predictions differ.

This module builds it from the blocks of :mod:`.layers_spec_drafter` (attention, encoder and decoder layers, the
compact own encoder) to heads:

- the encoder is one of three: the compact [`SpecDrafterEncoder`] of a drafter built from a plain config; the
  verifier family's own encoder module from transformers (`BartEncoder`, `T5Stack`, ...; built by
  :mod:`.verifier_conversion`, initialised from the verifier's weights by [`SpecDrafterModel.from_verifier`]); or
  none (`use_verifier_encoder=True`: the decoder reads the verifier's encoder output).
- [`SpecDrafterDecoder`]: the drafting decoder, which can write the committed prefix's keys and values into
  caller-owned buffers (`prefix_attention="causal"`).
- [`SpecDrafterModel`]: the `PreTrainedModel`: embeddings, encoder, decoder, LM head (full or reduced), the training
  forward with its loss. Decoding with it goes through `specdec_hf.generation`, whose drafting adapter owns the
  per-`generate()` state (cross-attention keys and values, prefix key/value buffers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from ..model_files import load_pretrained
from .configuration_spec_drafter import SpecDrafterConfig
from .layers_spec_drafter import (
    SpecDrafterDecoderLayer,
    SpecDrafterEncoder,
    SpecDrafterSinusoidalPositionalEmbedding,
    dropout_in_training,
)
from .split_attention import every_split_attention_mask
from .verifier_conversion import build_transformers_encoder, copy_verifier_weights, drafter_config_from_verifier


@dataclass
class SpecDrafterOutput(ModelOutput):
    """
    Output of [`SpecDrafterModel.forward`].

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` is given):
            Cross-entropy of the k drafted positions against `labels` (positions labelled -100 ignored).
        logits (`torch.FloatTensor` of shape `(batch_size, num_draft_tokens, vocab_size)`):
            Scores of the k mask slots; slot j predicts the token at position `prefix_length + j`.
        encoder_last_hidden_state (`torch.FloatTensor` of shape `(batch_size, source_length, hidden_size)`):
            The encoder output the decoder attended to (the verifier's, unprojected, with `use_verifier_encoder`);
            pass it back as `encoder_hidden_states` to skip the encoder.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    encoder_last_hidden_state: torch.FloatTensor | None = None


def expand_encoder_attention_mask(attention_mask: torch.Tensor | None) -> torch.BoolTensor | None:
    """`(batch_size, source_length)` source mask, 1 for tokens -> `(batch_size, 1, 1, source_length)`, `True` for
    tokens, the shape attention broadcasts over heads and queries; `None` stays `None` (no padding)."""
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


def head_rows_of(head_ids: torch.LongTensor, vocab_size: int) -> torch.LongTensor:
    """The inverse of a reduced head's ids: `out[head_ids[i]] = i` for each head row `i`, -1 for the other verifier
    ids; `head_ids` must be distinct and below `vocab_size`."""
    head_rows = torch.full((vocab_size,), -1, dtype=torch.long, device=head_ids.device)
    head_rows[head_ids] = torch.arange(head_ids.shape[0], device=head_ids.device)
    return head_rows


class SpecDrafterDecoder(nn.Module):
    """The drafting decoder: [prefix tokens + k mask slots] -> hidden states of the k mask slots.

    Each mask slot j of a row with prefix length L sits at position L + j; its input is the shared mask embedding plus
    the learned query of draft position j plus the learned position L + j. With `prefix_attention="bidirectional"`
    every position attends to every valid position; with `"causal"` prefix tokens attend only to earlier prefix
    tokens (so their keys and values can be cached), while the masks attend to the whole prefix and to each other.

    Args:
        config ([`SpecDrafterConfig`]): Uses `decoder_*`, `max_draft_tokens`, `max_position_embeddings`,
            `prefix_attention`.
    """

    def __init__(self, config: SpecDrafterConfig):
        super().__init__()
        self.dropout = config.dropout
        self.causal_prefix = config.prefix_attention == "causal"
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.mask_embedding = nn.Parameter(torch.empty(config.d_model))
        self.block_query_embeddings = nn.Embedding(config.max_draft_tokens, config.d_model)
        self.layers = nn.ModuleList([SpecDrafterDecoderLayer(config) for _ in range(config.decoder_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def project_encoder_states(
        self, encoder_hidden_states: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Cross-attention keys and values of every layer, each `(batch_size, num_heads, source_length, head_dim)`."""
        return tuple(layer.encoder_attn.project_key_value(encoder_hidden_states) for layer in self.layers)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        prefix_positions: torch.LongTensor | range,
        prefix_mask: torch.BoolTensor,
        mask_positions: torch.LongTensor | range,
        cross_key_values: tuple[tuple[torch.Tensor, torch.Tensor], ...],
        encoder_attention_mask: torch.BoolTensor | None = None,
        cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None,
        cache_length: int = 0,
        glance_embeds: torch.Tensor | None = None,
        glance_mask: torch.BoolTensor | None = None,
    ) -> torch.Tensor:
        """
        Args:
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, num_new, d_model)`):
                Embedded prefix tokens not in the cache (the whole prefix without a cache), right-padded.
            prefix_positions (`torch.LongTensor` of shape `(num_new,)` or `(batch_size, num_new)`, or `range`):
                Their positions; a `range` of `num_new` positions is shared by every row.
            prefix_mask (`torch.BoolTensor` of shape `(batch_size, num_new)`, *optional*): `True` for real tokens;
                `None` when no row has padding (the attention then needs no key mask).
            mask_positions (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`, or `range`):
                Positions of the mask slots (`prefix_length + j`); a `range` of `num_draft_tokens` positions is shared
                by every row (their prefixes are of one length).
            cross_key_values (`tuple`): From [`~SpecDrafterDecoder.project_encoder_states`].
            encoder_attention_mask (`torch.BoolTensor` of shape `(batch_size, 1, 1, source_length)`, *optional*):
                `True` for source tokens.
            cache (`tuple` of `(key, value)` buffers per layer, *optional*):
                Prefix key/value buffers of shape `(batch_size, num_heads, capacity, head_dim)` with
                `capacity >= cache_length + num_new + num_draft_tokens` (causal prefix attention only).
            cache_length (`int`): Number of valid cached prefix positions (shared by all rows).
            glance_embeds (`torch.FloatTensor` of shape `(batch_size, num_draft_tokens, d_model)`, *optional*):
                Embedded target tokens revealed to some mask slots (glancing training, GLAT).
            glance_mask (`torch.BoolTensor` of shape `(batch_size, num_draft_tokens)`, *optional*):
                `True` where a slot reads `glance_embeds` instead of the mask embedding.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, num_draft_tokens, d_model)`: final hidden states of the mask slots.
        """
        batch_size, num_new, _ = inputs_embeds.shape
        num_draft_tokens = len(mask_positions) if isinstance(mask_positions, range) else mask_positions.shape[1]
        device = inputs_embeds.device

        prefix_inputs = inputs_embeds + self._position_embeddings(prefix_positions)
        slot_inputs = self.mask_embedding.expand(batch_size, num_draft_tokens, -1)
        if glance_mask is not None:
            slot_inputs = torch.where(glance_mask.unsqueeze(-1), glance_embeds, slot_inputs)
        mask_states = (
            slot_inputs + self.block_query_embeddings.weight[:num_draft_tokens]
        ) + self._position_embeddings(mask_positions)
        hidden_states = torch.cat([prefix_inputs, mask_states], dim=1)
        hidden_states = dropout_in_training(hidden_states, self.dropout, self.training)

        # Self-attention mask, True = may attend: keys are [cache | new prefix tokens | masks].
        key_mask = None
        if prefix_mask is not None:
            key_mask = torch.cat([prefix_mask, prefix_mask.new_ones(batch_size, num_draft_tokens)], dim=1)
            if cache_length > 0:
                key_mask = torch.cat([key_mask.new_ones(batch_size, cache_length), key_mask], dim=1)
            key_mask = key_mask[:, None, None, :]  # (batch_size, 1, 1, key_length)
        attention_mask = key_mask
        # the mask slots see every real key, so the last layer (its queries are the slots only) needs the padding
        # mask alone; the causal prefix mask matters to earlier layers only (a one-layer drafter at batch 1 builds
        # no mask at all, and its attention runs unmasked)
        if self.causal_prefix and len(self.layers) > 1:
            query_index = torch.arange(num_new + num_draft_tokens, device=device)[:, None]
            key_index = torch.arange(cache_length + num_new + num_draft_tokens, device=device)[None, :]
            allowed = (key_index <= cache_length + query_index) | (query_index >= num_new)
            # (batch_size or 1, 1, num_queries, key_length)
            attention_mask = allowed[None, None] if key_mask is None else key_mask & allowed
        return self._run_layers(
            hidden_states,
            attention_mask,
            key_mask,
            cross_key_values,
            encoder_attention_mask,
            num_draft_tokens,
            cache,
            cache_length,
        )

    def _position_embeddings(self, positions: torch.LongTensor | range) -> torch.Tensor:
        """The learned embeddings of `positions`; of a `range` of following positions within the table, a slice of
        it (a drafting call's: no index tensor to build and look up, which costs about what a small layer's call
        does), unless the embedding is not a plain `nn.Embedding` run as it is (a subclass or wrapper, forward hooks
        of its own, `max_norm`): then, as of a tensor, through the module. (Global module hooks are not consulted:
        the slice is what the module's forward would return.)"""
        if isinstance(positions, range):
            table = self.embed_positions
            if (
                type(table) is nn.Embedding
                and positions.step == 1
                and 0 <= positions.start <= positions.stop <= table.num_embeddings
                and table.max_norm is None
                and not (table._forward_hooks or table._forward_pre_hooks or "forward" in table.__dict__)
            ):
                return table.weight[positions.start : positions.stop]
            positions = torch.arange(positions.start, positions.stop, positions.step, device=table.weight.device)
        return self.embed_positions(positions)

    def forward_every_split(
        self,
        inputs_embeds: torch.Tensor,
        prefix_mask: torch.BoolTensor,
        split_lengths: torch.LongTensor,
        num_draft_tokens: int,
        cross_key_values: tuple[tuple[torch.Tensor, torch.Tensor], ...],
        encoder_attention_mask: torch.BoolTensor | None = None,
        glance_embeds: torch.Tensor | None = None,
        glance_mask: torch.BoolTensor | None = None,
    ) -> torch.Tensor:
        """Draft after every split point of whole sequences in one pass (causal prefix attention only).

        The sequence's positions are shared by all splits; split s adds k mask slots at positions `L_s .. L_s + k - 1`
        that see prefix positions `< L_s` and each other (:func:`~.split_attention.every_split_attention_mask`), so
        each split's slots get the states a separate call with that prefix would give.

        Args:
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, length, d_model)`): Embedded sequences.
            prefix_mask (`torch.BoolTensor` of shape `(batch_size, length)`): `True` for real tokens.
            split_lengths (`torch.LongTensor` of shape `(num_splits,)`): Prefix length of each split, shared by rows.
            num_draft_tokens (`int`): k.
            cross_key_values, encoder_attention_mask: As in [`~SpecDrafterDecoder.forward`].
            glance_embeds (`torch.FloatTensor` of shape `(batch_size, num_splits * num_draft_tokens, d_model)`, *optional*),
            glance_mask (`torch.BoolTensor` of shape `(batch_size, num_splits * num_draft_tokens)`, *optional*):
                Glancing inputs of the slots, split-major.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, num_splits * num_draft_tokens, d_model)`, split-major.
        """
        if not self.causal_prefix:
            raise ValueError(
                'Training on every split point needs `prefix_attention="causal"` (a bidirectional prefix differs '
                "per split); use one random split per sequence instead."
            )
        batch_size, length, _ = inputs_embeds.shape
        device = inputs_embeds.device
        num_slots = split_lengths.shape[0] * num_draft_tokens
        prefix_inputs = inputs_embeds + self.embed_positions(torch.arange(length, device=device))
        slot_inputs = self.mask_embedding.expand(batch_size, num_slots, -1)
        if glance_mask is not None:
            slot_inputs = torch.where(glance_mask.unsqueeze(-1), glance_embeds, slot_inputs)
        slot_index = torch.arange(num_draft_tokens, device=device).repeat(split_lengths.shape[0])
        slot_positions = split_lengths.repeat_interleave(num_draft_tokens) + slot_index
        slot_states = slot_inputs + self.block_query_embeddings(slot_index) + self.embed_positions(slot_positions)
        hidden_states = torch.cat([prefix_inputs, slot_states], dim=1)
        hidden_states = dropout_in_training(hidden_states, self.dropout, self.training)
        attention_mask = every_split_attention_mask(prefix_mask, split_lengths, num_draft_tokens)
        return self._run_layers(
            hidden_states,
            attention_mask,
            attention_mask[:, :, -num_slots:],
            cross_key_values,
            encoder_attention_mask,
            num_slots,
        )

    def _run_layers(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.BoolTensor | None,
        last_mask: torch.BoolTensor | None,
        cross_key_values: tuple[tuple[torch.Tensor, torch.Tensor], ...],
        encoder_attention_mask: torch.BoolTensor | None,
        num_outputs: int,
        cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None,
        cache_length: int = 0,
    ) -> torch.Tensor:
        """The decoder layers; returns the normed states of the last `num_outputs` positions (the mask slots).

        `attention_mask` is the mask of every layer but the last; `last_mask` the last layer's, whose queries are
        the mask slots only (`None`: no mask).
        """
        last_index = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            is_last = index == last_index
            hidden_states = layer(
                hidden_states,
                attention_mask=last_mask if is_last else attention_mask,
                cross_key_value=cross_key_values[index],
                encoder_attention_mask=encoder_attention_mask,
                cache=None if cache is None else cache[index],
                cache_length=cache_length,
                # the last layer only needs the mask slots' outputs (their keys/values still see every position)
                num_queries=num_outputs if is_last else None,
            )
        return self.layer_norm(hidden_states)


class SpecDrafterPreTrainedModel(PreTrainedModel):
    config: SpecDrafterConfig
    config_class = SpecDrafterConfig
    base_model_prefix = "spec_drafter"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _no_split_modules = ["SpecDrafterEncoderLayer", "SpecDrafterDecoderLayer"]
    _keys_to_ignore_on_load_missing = ["final_logits_bias"]

    def _init_weights(self, module: nn.Module):
        if isinstance(module, SpecDrafterSinusoidalPositionalEmbedding):
            init.copy_(module.weight, module.create_weight())
        else:
            super()._init_weights(module)
        if isinstance(module, SpecDrafterDecoder):
            init.normal_(module.mask_embedding, mean=0.0, std=self.config.init_std)
        elif isinstance(module, SpecDrafterModel):
            init.zeros_(module.final_logits_bias)


def _check_layers_match(name, model, loading_info: dict) -> None:
    """Refuse a drafter whose config asks for other layers than its weights hold: transformers would initialise the
    missing ones at random (or drop the extra ones) with only a logged report. Other missing weights keep
    transformers' behaviour (initialised, reported)."""
    missing, unexpected = loading_info.get("missing_keys", []), loading_info.get("unexpected_keys", [])
    if not missing and not unexpected:
        return
    config, missing_set = model.config, set(missing)
    names = list(model.state_dict())
    problems = []
    for stack in ("encoder", "decoder"):
        field_name = f"{stack}_layers"
        configured = getattr(config, field_name, None)
        held = {int(key.split(".")[2]) for key in unexpected if key.startswith(f"{stack}.layers.")}
        # layers of which no weight was loaded (a parameter added inside a layer is another matter)
        lacking = {
            index
            for index in {int(key.split(".")[2]) for key in missing if key.startswith(f"{stack}.layers.")}
            if all(key in missing_set for key in names if key.startswith(f"{stack}.layers.{index}."))
        }
        if configured is None:
            continue
        if held and max(held) + 1 > configured:
            problems.append(f"`{field_name}` is {configured} in config.json but the weights hold {max(held) + 1}")
        elif lacking and min(lacking) < configured and max(lacking) == configured - 1:
            problems.append(f"`{field_name}` is {configured} in config.json but the weights hold {min(lacking)}")
    if not problems:
        return
    raise ValueError(
        f"{name}: its config.json disagrees with its weights ({'; '.join(problems)}): restore the field to what the "
        "weights were saved with."
    )


class SpecDrafterModel(SpecDrafterPreTrainedModel):
    """The Spec-Drafter: an encoder-decoder that drafts k tokens in parallel for a verifier.

    [`~SpecDrafterModel.forward`] trains it (prefix + labels of the next k tokens). To decode, pass it as
    `drafter=` to a verifier's `generate()` (see `specdec_hf.generation`), which drafts with it through
    `specdec_hf.generation.SpecDrafterAdapter`. The encoder is, depending on the config: the compact
    [`SpecDrafterEncoder`]; the verifier family's transformers encoder (`encoder_config`, see
    [`~SpecDrafterModel.from_verifier`]); or none (`use_verifier_encoder=True`).

    Args:
        config ([`SpecDrafterConfig`]): Model configuration.
    """

    _tied_weights_keys = {"lm_head.weight": "shared.weight"}

    def __init__(self, config: SpecDrafterConfig):
        super().__init__(config)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.shared = nn.Embedding(config.vocab_size, config.d_model)

        self.encoder_proj = None
        if config.use_verifier_encoder:
            self.encoder = None
            verifier_d_model = config.verifier_d_model or config.d_model
            if verifier_d_model != config.d_model:
                self.encoder_proj = nn.Linear(verifier_d_model, config.d_model)
        elif config.encoder_config is not None:
            self.encoder = build_transformers_encoder(config.encoder_config)
            # the transformers encoder embeds the source itself, with the shared embedding
            self._tied_weights_keys = {**self._tied_weights_keys, "encoder.embed_tokens.weight": "shared.weight"}
        else:
            self.encoder = SpecDrafterEncoder(config)

        # projection of the verifier's states (the `verifier_state_layers`, concatenated) added to prefix embeddings
        self.feature_proj = None
        if config.verifier_state_layers is not None:
            feature_width = len(config.verifier_state_layers) * (config.verifier_d_model or config.d_model)
            self.feature_proj = nn.Linear(feature_width, config.d_model)

        self.decoder = SpecDrafterDecoder(config)
        head_size = config.draft_vocab_size or config.vocab_size
        self.lm_head = nn.Linear(config.d_model, head_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, head_size))
        if config.draft_vocab_size is not None:
            # verifier id of each head row; set by from_verifier(draft_vocab_ids=...) or loaded with the weights
            self.register_buffer("draft_vocab_ids", torch.arange(config.draft_vocab_size))
        else:
            self.draft_vocab_ids = None

        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding):
        self.shared = value
        if self.config.encoder_config is not None:
            self.encoder.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear):
        self.lm_head = new_embeddings

    def _embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        return self.shared(input_ids) * self.embed_scale

    def embed_prefix(self, input_ids: torch.LongTensor, previous_states: torch.Tensor | None) -> torch.Tensor:
        """Token embeddings of prefix positions, plus the projected verifier state of each position's predecessor.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, length)`): Prefix tokens.
            previous_states (`torch.FloatTensor` of shape `(batch_size, length, feature_width)`, *optional*):
                For each position, the verifier's (concatenated) states at the position before it; zeros before the
                first position. Required when the drafter reads verifier states.
        """
        embeds = self._embed(input_ids)
        if self.feature_proj is None:
            return embeds
        if previous_states is None:
            raise ValueError(
                f"This drafter reads the verifier's decoder states (`verifier_state_layers="
                f"{self.config.verifier_state_layers}`): pass `verifier_states`; the speculative loop does so itself."
            )
        return embeds + self.feature_proj(previous_states.to(embeds.dtype))

    @staticmethod
    def _shift_states(states: torch.Tensor) -> torch.Tensor:
        """`(batch, length, width)` states at each position -> states at the position before (zeros first)."""
        return F.pad(states, (0, 0, 1, 0))[:, : states.shape[1]]

    def to_draft_vocab(self, token_ids: torch.LongTensor) -> torch.LongTensor:
        """Map verifier ids (and -100) to rows of the LM head; ids outside a reduced vocabulary become -100."""
        if self.draft_vocab_ids is None:
            return token_ids
        rows = head_rows_of(self.draft_vocab_ids.to(token_ids.device), self.config.vocab_size)[token_ids.clamp(min=0)]
        return torch.where((token_ids >= 0) & (rows >= 0), rows, -100)

    def from_draft_vocab(self, head_index: torch.LongTensor) -> torch.LongTensor:
        """Map rows of the LM head (e.g. an argmax) back to verifier ids."""
        if self.draft_vocab_ids is None:
            return head_index
        return self.draft_vocab_ids[head_index]

    def check_num_draft_tokens(self, num_draft_tokens: int | None) -> int:
        """`num_draft_tokens` checked against the mask slots; `None` means every slot (`config.max_draft_tokens`)."""
        limit = self.config.max_draft_tokens
        num_draft_tokens = limit if num_draft_tokens is None else int(num_draft_tokens)
        if not 1 <= num_draft_tokens <= limit:
            raise ValueError(
                f"`num_draft_tokens` must be between 1 and the drafter's `config.max_draft_tokens` ({limit}), got "
                f"{num_draft_tokens}: the drafter has one learned query per mask slot."
            )
        return num_draft_tokens

    def check_positions(self, length: int) -> None:
        """Raise if a prefix plus its mask slots span more than the learned positions."""
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"Prefix plus mask slots span {length} positions, more than the drafter's "
                f"`max_position_embeddings` ({self.config.max_position_embeddings}). Lower `max_new_tokens` or "
                "`num_draft_tokens`."
            )

    def encode(
        self, input_ids: torch.LongTensor | None, attention_mask: torch.Tensor | None = None
    ) -> torch.FloatTensor:
        """Run the drafter's own encoder.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`): Source token ids.
            attention_mask (`torch.Tensor` of shape `(batch_size, source_length)`, *optional*): 1 for tokens.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, source_length, d_model)`.
        """
        if self.encoder is None:
            raise ValueError(
                "This drafter has no encoder (`use_verifier_encoder=True`): pass the verifier's "
                "`encoder_hidden_states` instead of `input_ids`."
            )
        if input_ids is None:
            raise ValueError(
                "This drafter runs its own encoder and needs the source `input_ids` (it cannot read "
                "`inputs_embeds`); give the verifier `input_ids`, or build the drafter with "
                "`use_verifier_encoder=True`."
            )
        if self.config.encoder_config is not None:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.encoder(self._embed(input_ids), attention_mask)

    def encoder_memory(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        """What the decoder cross-attends to: the encoder states, projected to `d_model` where widths differ."""
        encoder_hidden_states = encoder_hidden_states.to(self.shared.weight.dtype)
        if self.encoder_proj is not None:
            return self.encoder_proj(encoder_hidden_states)
        return encoder_hidden_states

    def head_logits(self, hidden_states: torch.Tensor) -> torch.FloatTensor:
        """LM head scores `(..., head_size)`: over `draft_vocab_ids` for a reduced head, else the vocabulary."""
        # through the module, not F.linear on its weight: its hooks, a bias or a prepacked kernel apply
        return self.lm_head(hidden_states) + self.final_logits_bias

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        num_draft_tokens: int | None = None,
        labels: torch.LongTensor | None = None,
        label_smoothing: float = 0.0,
        glance_ids: torch.LongTensor | None = None,
        split_lengths: torch.LongTensor | None = None,
        verifier_states: torch.FloatTensor | None = None,
    ) -> SpecDrafterOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*):
                Source token ids (not needed when `encoder_hidden_states` is given).
            attention_mask (`torch.Tensor` of shape `(batch_size, source_length)`, *optional*):
                1 for source tokens, 0 for padding.
            encoder_hidden_states (`torch.FloatTensor` of shape `(batch_size, source_length, hidden_size)`, *optional*):
                With `use_verifier_encoder=True`, the verifier's encoder output (required). Otherwise an output of
                this drafter's encoder from an earlier call (e.g. `encoder_last_hidden_state`), which skips the
                encoder.
            decoder_input_ids (`torch.LongTensor` of shape `(batch_size, prefix_length)`):
                The accepted prefix of each row, starting with the decoder start token, right-padded.
            decoder_attention_mask (`torch.Tensor` of shape `(batch_size, prefix_length)`, *optional*):
                1 for prefix tokens, 0 for padding (right padding only). `None` means no padding.
            num_draft_tokens (`int`, *optional*): Number of mask slots k (defaults to `config.max_draft_tokens`).
            labels (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`, *optional*):
                The next k tokens after each prefix; -100 marks ignored positions (e.g. past EOS).
            label_smoothing (`float`, *optional*, defaults to 0.0): Label smoothing of the cross-entropy.
            glance_ids (`torch.LongTensor` of shape `(batch_size, num_draft_tokens)`, *optional*):
                Glancing training (GLAT, as in the paper's §3.1): target tokens revealed to their mask slots; -100
                keeps a slot masked. `(batch_size, num_splits, num_draft_tokens)` with `split_lengths`.
            split_lengths (`torch.LongTensor` of shape `(num_splits,)`, *optional*):
                Train on many split points at once (`prefix_attention="causal"`): `decoder_input_ids` are then whole
                sequences and the drafter drafts k tokens after each prefix length in `split_lengths` (shared by the
                rows), in one pass; `labels` and `logits` gain a `num_splits` dimension.
            verifier_states (`torch.FloatTensor` of shape `(batch_size, prefix_length, feature_width)`, *optional*):
                For a drafter with `verifier_state_layers`: the verifier's decoder states (those layers,
                concatenated) at each position of `decoder_input_ids`, teacher-forced. Position i reads those of
                position i - 1.

        Returns:
            [`SpecDrafterOutput`]: `logits` of shape `(batch_size, num_draft_tokens, head_size)` (or `(batch_size,
            num_splits, num_draft_tokens, head_size)` with `split_lengths`), where `head_size` is `draft_vocab_size`
            for a reduced head (map rows back with `from_draft_vocab`) and `vocab_size` otherwise. `labels` are
            verifier ids either way.
        """
        if decoder_input_ids is None:
            raise ValueError(
                "`decoder_input_ids` (the accepted prefix, starting with the decoder start token) is required."
            )
        num_draft_tokens = self.check_num_draft_tokens(num_draft_tokens)
        batch_size, prefix_length = decoder_input_ids.shape
        self.check_positions(prefix_length + num_draft_tokens)
        previous_states = None if verifier_states is None else self._shift_states(verifier_states)

        if encoder_hidden_states is None:
            encoder_hidden_states = self.encode(input_ids, attention_mask)
        elif self.encoder is not None and encoder_hidden_states.shape[-1] != self.config.d_model:
            raise ValueError(
                f"`encoder_hidden_states` must have width {self.config.d_model} (this drafter's encoder output)."
            )
        memory = self.encoder_memory(encoder_hidden_states)

        device = decoder_input_ids.device
        if decoder_attention_mask is None:
            prefix_mask = torch.ones(batch_size, prefix_length, dtype=torch.bool, device=device)
            prefix_lengths = torch.full((batch_size,), prefix_length, device=device)
        else:
            prefix_mask = decoder_attention_mask.bool()
            prefix_lengths = prefix_mask.sum(dim=1)
        glance_embeds = None if glance_ids is None else self._embed(glance_ids.clamp(min=0))
        common = dict(
            inputs_embeds=self.embed_prefix(decoder_input_ids, previous_states),
            prefix_mask=prefix_mask,
            cross_key_values=self.decoder.project_encoder_states(memory),
            encoder_attention_mask=expand_encoder_attention_mask(attention_mask),
        )
        if split_lengths is None:
            hidden_states = self.decoder(
                **common,
                prefix_positions=torch.arange(prefix_length, device=device),
                mask_positions=prefix_lengths[:, None] + torch.arange(num_draft_tokens, device=device),
                glance_embeds=glance_embeds,
                glance_mask=None if glance_ids is None else glance_ids >= 0,
            )
        else:
            split_lengths = split_lengths.to(device)
            if int(split_lengths.min()) < 1 or int(split_lengths.max()) > prefix_length:
                raise ValueError(f"`split_lengths` must lie in [1, {prefix_length}] (the sequence length).")
            hidden_states = self.decoder.forward_every_split(
                **common,
                split_lengths=split_lengths,
                num_draft_tokens=num_draft_tokens,
                glance_embeds=None if glance_ids is None else glance_embeds.flatten(1, 2),
                glance_mask=None if glance_ids is None else (glance_ids >= 0).flatten(1, 2),
            ).unflatten(1, (split_lengths.shape[0], num_draft_tokens))
        logits = self.head_logits(hidden_states)

        loss = None
        if labels is not None:
            head_labels = self.to_draft_vocab(labels.reshape(-1).to(logits.device))
            # a sum over the counted targets, not F.cross_entropy's mean: a batch whose targets all lie outside a
            # reduced head gives 0 (nothing to learn), not NaN
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                head_labels,
                ignore_index=-100,
                label_smoothing=label_smoothing,
                reduction="sum",
            ) / (head_labels != -100).sum().clamp(min=1)
        return SpecDrafterOutput(loss=loss, logits=logits, encoder_last_hidden_state=encoder_hidden_states)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs) -> SpecDrafterModel:
        """`PreTrainedModel.from_pretrained`, with clear errors for a directory that does not exist (transformers
        reports it as a Hub problem, "We couldn't connect to 'https://huggingface.co'" offline) and for a truncated
        weight file (safetensors names no file): see `specdec_hf.model_files.load_pretrained`."""
        load = super().from_pretrained
        if pretrained_model_name_or_path is None:  # weights passed as `state_dict=` with a `config=`
            return load(None, *model_args, **kwargs)
        wants_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = load_pretrained(
                lambda name, **options: load(name, *model_args, **options),
                pretrained_model_name_or_path,
                "pretrained_model_name_or_path",
                output_loading_info=True,
                **kwargs,
            )
        except RuntimeError as err:
            if "ignore_mismatched_sizes" not in str(err):
                raise
            raise ValueError(
                f"{pretrained_model_name_or_path}: its config.json disagrees with its weights, whose shapes differ "
                "(the report above lists them): a field such as `d_model`, `encoder_ffn_dim`, `decoder_ffn_dim`, "
                "`vocab_size` or `draft_vocab_size` was changed after saving; restore it to the saved weights' size."
            ) from None
        if not kwargs.get("ignore_mismatched_sizes"):
            _check_layers_match(pretrained_model_name_or_path, model, info)
        return (model, info) if wants_info else model

    @classmethod
    def from_verifier(
        cls,
        verifier: PreTrainedModel,
        max_draft_tokens: int = 10,
        draft_vocab_ids: list[int] | torch.Tensor | None = None,
        **overrides,
    ) -> SpecDrafterModel:
        """Build a drafter for `verifier`, initialised from the verifier's encoder and embeddings.

        The drafter gets the verifier's vocabulary, special token ids and width; its encoder is the verifier family's
        encoder module with the verifier's weights (its first `encoder_layers` layers if overridden), its shared
        embedding (decoder input and tied LM head) is the verifier's, and its decoder is new (see
        :mod:`.verifier_conversion`).

        Args:
            verifier (`PreTrainedModel`): A BART, mBART, Marian, Pegasus, T5 or mT5 encoder-decoder model.
            max_draft_tokens (`int`, *optional*, defaults to 10): Number of mask slots: the most tokens one call
                drafts (k), and the k it is trained with.
            draft_vocab_ids (`list[int]` or `torch.LongTensor`, *optional*): A reduced-vocabulary LM head over these
                verifier ids (distinct; e.g. the most frequent target tokens of the training data, see
                `specdec_hf.training.frequent_token_ids`), its rows initialised from the verifier's output embedding.
            overrides: Any [`SpecDrafterConfig`] field, e.g. `decoder_layers=1`, `encoder_layers=3`,
                `prefix_attention="causal"`, `use_verifier_encoder=True` (no encoder: nothing of the encoder is
                built or copied; the drafter reads the verifier's encoder output), `verifier_state_layers=[-1]`,
                `num_draft_tokens=4`.

        Returns:
            [`SpecDrafterModel`] on the verifier's device and dtype, in eval mode.

        Raises:
            ValueError: for a decoder-only or unsupported verifier, an unknown override, or more encoder layers than
                the verifier has.
        """
        config, draft_vocab_ids = drafter_config_from_verifier(
            verifier, max_draft_tokens, draft_vocab_ids, **overrides
        )
        parameter = next(verifier.parameters())
        drafter = cls(config).to(device=parameter.device, dtype=parameter.dtype)
        copy_verifier_weights(drafter, verifier, draft_vocab_ids)
        return drafter.eval()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """The tied weights: a transformers encoder always embeds with `shared`; the LM head only with
        `tie_word_embeddings` (a reduced head has rows of its own)."""
        tied = super().get_expanded_tied_weights_keys(all_submodels=all_submodels)
        if self.config.encoder_config is not None and not self.config.tie_word_embeddings:
            tied = {**tied, "encoder.embed_tokens.weight": "shared.weight"}
        return tied


__all__ = [
    "SpecDrafterModel",
    "SpecDrafterOutput",
    "SpecDrafterPreTrainedModel",
    "expand_encoder_attention_mask",
    "head_rows_of",
]
