"""PyTorch Spec-Drafter model.

The Spec-Drafter of Speculative Decoding (Xia et al., 2023, arXiv 2203.16487; official fairseq code:
github.com/hemingkx/SpecDec) is a small non-autoregressive encoder-decoder that shares the verifier's vocabulary. Its
decoder reads the accepted prefix followed by k mask tokens and predicts the next k tokens in one forward pass; each
mask slot has its own learned query so that the k predictions differ.

This module builds it from blocks to heads:

- [`SpecDrafterAttention`], [`SpecDrafterEncoderLayer`], [`SpecDrafterDecoderLayer`]: pre-LN Transformer blocks on
  `torch.nn.functional.scaled_dot_product_attention` with explicit boolean masks.
- [`SpecDrafterEncoder`]: the compact own encoder of a drafter built from a plain config. A drafter built with
  [`SpecDrafterModel.from_verifier`] instead uses the verifier family's own encoder module from transformers
  (`BartEncoder`, `T5Stack`, ...), initialised from the verifier's weights, or no encoder at all
  (`use_verifier_encoder=True`).
- [`SpecDrafterDecoder`]: the drafting decoder, with an optional key/value cache over the committed prefix
  (`prefix_attention="causal"`).
- [`SpecDrafterModel`]: the `PreTrainedModel`, which also implements the drafting interface of
  :mod:`specdec_hf.drafting` used by the speculative decoding loop.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from ..drafting import Drafter, DraftProposal, check_state_layers
from .configuration_spec_drafter import SpecDrafterConfig
from .split_attention import every_split_attention_mask

# Verifier families whose encoder a drafter can reuse: model_type -> (module, encoder class) in transformers.
# The classes are imported lazily, when a drafter of that family is built.
ENCODER_CLASSES = {
    "bart": ("transformers.models.bart.modeling_bart", "BartEncoder"),
    "mbart": ("transformers.models.mbart.modeling_mbart", "MBartEncoder"),
    "marian": ("transformers.models.marian.modeling_marian", "MarianEncoder"),
    "pegasus": ("transformers.models.pegasus.modeling_pegasus", "PegasusEncoder"),
    "t5": ("transformers.models.t5.modeling_t5", "T5Stack"),
    "mt5": ("transformers.models.t5.modeling_t5", "T5Stack"),
}
# Config key holding the number of encoder layers, where it is not `encoder_layers`.
_ENCODER_LAYERS_KEY = {"t5": "num_layers", "mt5": "num_layers"}
_T5_LIKE = ("t5", "mt5")


def build_transformers_encoder(encoder_config: dict) -> PreTrainedModel:
    """Build the encoder module of a transformers model family from that family's config dict.

    Args:
        encoder_config (`dict`): A config dict with a `model_type` key among `ENCODER_CLASSES`.

    Returns:
        `PreTrainedModel`: e.g. a `BartEncoder`, or a non-decoder `T5Stack` for T5/mT5, randomly initialised.
    """
    config_kwargs = dict(encoder_config)
    model_type = config_kwargs.pop("model_type")
    if model_type not in ENCODER_CLASSES:
        raise ValueError(
            f"Unsupported encoder family {model_type!r} in `encoder_config`; supported: {sorted(ENCODER_CLASSES)}."
        )
    config = AutoConfig.for_model(model_type, **config_kwargs)
    if model_type in _T5_LIKE:
        config.is_decoder = False
        config.use_cache = False
        config.is_encoder_decoder = False
    module_name, class_name = ENCODER_CLASSES[model_type]
    encoder_class = getattr(importlib.import_module(module_name), class_name)
    return encoder_class(config)


@dataclass
class SpecDrafterOutput(ModelOutput):
    """
    Output of [`SpecDrafterModel.forward`].

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` is given):
            Cross-entropy of the k drafted positions against `labels` (positions labelled -100 ignored).
        logits (`torch.FloatTensor` of shape `(batch_size, block_size, vocab_size)`):
            Scores of the k mask slots; slot j predicts the token at position `prefix_length + j`.
        encoder_last_hidden_state (`torch.FloatTensor` of shape `(batch_size, source_length, hidden_size)`):
            The encoder output the decoder attended to (the verifier's, unprojected, with `use_verifier_encoder`);
            pass it back as `encoder_hidden_states` to skip the encoder.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    encoder_last_hidden_state: torch.FloatTensor | None = None


@dataclass
class SpecDrafterState:
    """Per-`generate()` drafting state of a [`SpecDrafterModel`] (owned by the drafter, opaque to the loop).

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

    cross_key_values: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    encoder_attention_mask: torch.BoolTensor | None = None
    prefix_key_values: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    cache_length: int = 0


class SpecDrafterSinusoidalPositionalEmbedding(nn.Embedding):
    """Fixed sinusoidal positions (sin features in the first half, cos in the second), as in Marian."""

    def __init__(self, num_positions: int, embedding_dim: int):
        super().__init__(num_positions, embedding_dim, _freeze=True)

    def create_weight(self) -> torch.Tensor:
        num_positions, dim = self.weight.shape
        positions = torch.arange(num_positions, dtype=torch.float64)[:, None]
        inv_freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = positions * inv_freq[None, :]
        out = torch.empty(num_positions, dim, dtype=torch.float64)
        half = (dim + 1) // 2
        out[:, :half] = torch.sin(angles)
        out[:, half:] = torch.cos(angles[:, : dim - half])
        return out.to(self.weight.dtype)


class SpecDrafterAttention(nn.Module):
    """Multi-head attention on `scaled_dot_product_attention`, for self-attention (optionally writing its keys and
    values into a cache buffer) and for cross-attention to precomputed keys and values."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        batch_size, length, _ = states.shape
        return states.view(batch_size, length, self.num_heads, self.head_dim).transpose(1, 2)

    def project_key_value(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(batch_size, length, embed_dim)` -> key and value, each `(batch_size, num_heads, length, head_dim)`."""
        return self._split_heads(self.k_proj(states)), self._split_heads(self.v_proj(states))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.BoolTensor | None = None,
        key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache_length: int = 0,
        num_queries: int | None = None,
    ) -> torch.Tensor:
        """
        Args:
            hidden_states (`torch.FloatTensor` of shape `(batch_size, length, embed_dim)`): The (normed) inputs.
            attention_mask (`torch.BoolTensor` broadcastable to `(batch_size, num_heads, num_queries, key_length)`):
                `True` where a query may attend to a key.
            key_value (`tuple(torch.FloatTensor)`, *optional*):
                Precomputed keys and values (cross-attention); `None` for self-attention over `hidden_states`.
            cache (`tuple(torch.FloatTensor)`, *optional*):
                Self-attention key/value buffers of shape `(batch_size, num_heads, capacity, head_dim)`; the new keys
                and values are written at `[cache_length, cache_length + length)` and attention runs over
                `[0, cache_length + length)`.
            cache_length (`int`): Number of valid cached positions.
            num_queries (`int`, *optional*): Only compute the outputs of the last `num_queries` positions.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, num_queries or length, embed_dim)`.
        """
        if key_value is None:
            key, value = self.project_key_value(hidden_states)
            if cache is not None:
                end = cache_length + hidden_states.shape[1]
                key_cache, value_cache = cache
                key_cache[:, :, cache_length:end] = key
                value_cache[:, :, cache_length:end] = value
                key, value = key_cache[:, :, :end], value_cache[:, :, :end]
        else:
            key, value = key_value
        if num_queries is not None:
            hidden_states = hidden_states[:, -num_queries:]
        query = self._split_heads(self.q_proj(hidden_states))
        attn_output = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=self.dropout if self.training else 0.0
        )
        batch_size, _, num_out, _ = attn_output.shape
        attn_output = attn_output.transpose(1, 2).reshape(batch_size, num_out, self.embed_dim)
        return self.out_proj(attn_output)


class SpecDrafterFeedForward(nn.Module):
    def __init__(self, config: SpecDrafterConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))


class SpecDrafterEncoderLayer(nn.Module):
    """Pre-LN encoder layer: self-attention and feed-forward."""

    def __init__(self, config: SpecDrafterConfig):
        super().__init__()
        self.dropout = config.dropout
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.self_attn = SpecDrafterAttention(config.d_model, config.encoder_attention_heads, config.attention_dropout)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = SpecDrafterFeedForward(config, config.encoder_ffn_dim)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.BoolTensor | None) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(self.self_attn_layer_norm(hidden_states), attention_mask=attention_mask)
        hidden_states = residual + F.dropout(hidden_states, p=self.dropout, training=self.training)
        residual = hidden_states
        hidden_states = self.mlp(self.final_layer_norm(hidden_states))
        return residual + F.dropout(hidden_states, p=self.dropout, training=self.training)


class SpecDrafterDecoderLayer(nn.Module):
    """Pre-LN decoder layer: self-attention over [prefix + masks], cross-attention to the source, feed-forward."""

    def __init__(self, config: SpecDrafterConfig):
        super().__init__()
        self.dropout = config.dropout
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.self_attn = SpecDrafterAttention(config.d_model, config.decoder_attention_heads, config.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = SpecDrafterAttention(
            config.d_model, config.decoder_attention_heads, config.attention_dropout
        )
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = SpecDrafterFeedForward(config, config.decoder_ffn_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.BoolTensor | None,
        cross_key_value: tuple[torch.Tensor, torch.Tensor],
        encoder_attention_mask: torch.BoolTensor | None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache_length: int = 0,
        num_queries: int | None = None,
    ) -> torch.Tensor:
        """See [`SpecDrafterAttention.forward`]; returns `(batch_size, num_queries or length, d_model)`."""
        residual = hidden_states if num_queries is None else hidden_states[:, -num_queries:]
        hidden_states = self.self_attn(
            self.self_attn_layer_norm(hidden_states),
            attention_mask=attention_mask,
            cache=cache,
            cache_length=cache_length,
            num_queries=num_queries,
        )
        hidden_states = residual + F.dropout(hidden_states, p=self.dropout, training=self.training)
        residual = hidden_states
        hidden_states = self.encoder_attn(
            self.encoder_attn_layer_norm(hidden_states),
            attention_mask=encoder_attention_mask,
            key_value=cross_key_value,
        )
        hidden_states = residual + F.dropout(hidden_states, p=self.dropout, training=self.training)
        residual = hidden_states
        hidden_states = self.mlp(self.final_layer_norm(hidden_states))
        return residual + F.dropout(hidden_states, p=self.dropout, training=self.training)


class SpecDrafterEncoder(nn.Module):
    """Compact pre-LN Transformer encoder of a drafter built from a plain config (token embedding held by the model).

    Args:
        config ([`SpecDrafterConfig`]): Uses `encoder_layers`, `encoder_attention_heads`, `encoder_ffn_dim` and
            `encoder_position_embedding_type`.
    """

    def __init__(self, config: SpecDrafterConfig):
        super().__init__()
        self.dropout = config.dropout
        if config.encoder_position_embedding_type == "sinusoidal":
            self.embed_positions = SpecDrafterSinusoidalPositionalEmbedding(
                config.max_position_embeddings, config.d_model
            )
        else:
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList([SpecDrafterEncoderLayer(config) for _ in range(config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        Args:
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, source_length, d_model)`): Token embeddings.
            attention_mask (`torch.Tensor` of shape `(batch_size, source_length)`, *optional*): 1 for tokens, 0 for
                padding.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, source_length, d_model)`.
        """
        positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
        hidden_states = inputs_embeds + self.embed_positions(positions)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask)
        return self.layer_norm(hidden_states)


class SpecDrafterDecoder(nn.Module):
    """The drafting decoder: [prefix tokens + k mask slots] -> hidden states of the k mask slots.

    Each mask slot j of a row with prefix length L sits at position L + j; its input is the shared mask embedding plus
    the learned query of block position j plus the learned position L + j. With `prefix_attention="bidirectional"`
    every position attends to every valid position; with `"causal"` prefix tokens attend only to earlier prefix
    tokens (so their keys and values can be cached), while the masks attend to the whole prefix and to each other.

    Args:
        config ([`SpecDrafterConfig`]): Uses `decoder_*`, `block_size`, `max_position_embeddings`,
            `prefix_attention`.
    """

    def __init__(self, config: SpecDrafterConfig):
        super().__init__()
        self.dropout = config.dropout
        self.causal_prefix = config.prefix_attention == "causal"
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.mask_embedding = nn.Parameter(torch.empty(config.d_model))
        self.block_query_embeddings = nn.Embedding(config.block_size, config.d_model)
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
        prefix_positions: torch.LongTensor,
        prefix_mask: torch.BoolTensor,
        mask_positions: torch.LongTensor,
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
            prefix_positions (`torch.LongTensor` of shape `(num_new,)` or `(batch_size, num_new)`):
                Their positions.
            prefix_mask (`torch.BoolTensor` of shape `(batch_size, num_new)`, *optional*): `True` for real tokens;
                `None` when no row has padding (the attention then needs no key mask).
            mask_positions (`torch.LongTensor` of shape `(batch_size, block_size)`):
                Positions of the mask slots (`prefix_length + j`).
            cross_key_values (`tuple`): From [`~SpecDrafterDecoder.project_encoder_states`].
            encoder_attention_mask (`torch.BoolTensor` of shape `(batch_size, 1, 1, source_length)`, *optional*):
                `True` for source tokens.
            cache (`tuple` of `(key, value)` buffers per layer, *optional*):
                Prefix key/value buffers of shape `(batch_size, num_heads, capacity, head_dim)` with
                `capacity >= cache_length + num_new + block_size` (causal prefix attention only).
            cache_length (`int`): Number of valid cached prefix positions (shared by all rows).
            glance_embeds (`torch.FloatTensor` of shape `(batch_size, block_size, d_model)`, *optional*):
                Embedded target tokens revealed to some mask slots (glancing training, GLAT).
            glance_mask (`torch.BoolTensor` of shape `(batch_size, block_size)`, *optional*):
                `True` where a slot reads `glance_embeds` instead of the mask embedding.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, block_size, d_model)`: final hidden states of the mask slots.
        """
        batch_size, num_new, _ = inputs_embeds.shape
        block_size = mask_positions.shape[1]
        device = inputs_embeds.device

        prefix_states = inputs_embeds + self.embed_positions(prefix_positions)
        slot_inputs = self.mask_embedding.expand(batch_size, block_size, -1)
        if glance_mask is not None:
            slot_inputs = torch.where(glance_mask.unsqueeze(-1), glance_embeds, slot_inputs)
        mask_states = (slot_inputs + self.block_query_embeddings.weight[:block_size]) + self.embed_positions(
            mask_positions
        )
        hidden_states = torch.cat([prefix_states, mask_states], dim=1)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)

        # Self-attention mask, True = may attend: keys are [cache | new prefix tokens | masks].
        key_mask = None
        if prefix_mask is not None:
            key_mask = torch.cat([prefix_mask, prefix_mask.new_ones(batch_size, block_size)], dim=1)
            if cache_length > 0:
                key_mask = torch.cat([key_mask.new_ones(batch_size, cache_length), key_mask], dim=1)
            key_mask = key_mask[:, None, None, :]  # (batch_size, 1, 1, key_length)
        attention_mask = key_mask
        # the mask slots see every real key, so the last layer (its queries are the slots only) needs the padding
        # mask alone; the causal prefix mask matters to earlier layers only (a one-layer drafter at batch 1 builds
        # no mask at all, and its attention runs unmasked)
        if self.causal_prefix and len(self.layers) > 1:
            query_index = torch.arange(num_new + block_size, device=device)[:, None]
            key_index = torch.arange(cache_length + num_new + block_size, device=device)[None, :]
            allowed = (key_index <= cache_length + query_index) | (query_index >= num_new)
            # (batch_size or 1, 1, num_queries, key_length)
            attention_mask = allowed[None, None] if key_mask is None else key_mask & allowed
        return self._run_layers(
            hidden_states,
            attention_mask,
            key_mask,
            cross_key_values,
            encoder_attention_mask,
            block_size,
            cache,
            cache_length,
        )

    def forward_every_split(
        self,
        inputs_embeds: torch.Tensor,
        prefix_mask: torch.BoolTensor,
        split_lengths: torch.LongTensor,
        block_size: int,
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
            block_size (`int`): k.
            cross_key_values, encoder_attention_mask: As in [`~SpecDrafterDecoder.forward`].
            glance_embeds (`torch.FloatTensor` of shape `(batch_size, num_splits * block_size, d_model)`, *optional*),
            glance_mask (`torch.BoolTensor` of shape `(batch_size, num_splits * block_size)`, *optional*):
                Glancing inputs of the slots, split-major.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, num_splits * block_size, d_model)`, split-major.
        """
        if not self.causal_prefix:
            raise ValueError(
                "Training on every split point needs `prefix_attention=\"causal\"` (a bidirectional prefix differs "
                "per split); use one random split per sequence instead."
            )
        batch_size, length, _ = inputs_embeds.shape
        device = inputs_embeds.device
        num_slots = split_lengths.shape[0] * block_size
        prefix_states = inputs_embeds + self.embed_positions(torch.arange(length, device=device))
        slot_inputs = self.mask_embedding.expand(batch_size, num_slots, -1)
        if glance_mask is not None:
            slot_inputs = torch.where(glance_mask.unsqueeze(-1), glance_embeds, slot_inputs)
        block_index = torch.arange(block_size, device=device).repeat(split_lengths.shape[0])
        slot_positions = split_lengths.repeat_interleave(block_size) + block_index
        slot_states = slot_inputs + self.block_query_embeddings(block_index) + self.embed_positions(slot_positions)
        hidden_states = torch.cat([prefix_states, slot_states], dim=1)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        attention_mask = every_split_attention_mask(prefix_mask, split_lengths, block_size)
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


class SpecDrafterModel(SpecDrafterPreTrainedModel, Drafter):
    """The Spec-Drafter: an encoder-decoder that drafts `block_size` tokens in parallel for a verifier.

    Use [`~SpecDrafterModel.forward`] for training (prefix + labels of the next k tokens) and the drafting interface
    (`init_drafting_state`, `propose`, `select_rows`; see :mod:`specdec_hf.drafting`) for decoding. The encoder is,
    depending on the config: the compact [`SpecDrafterEncoder`]; the verifier family's transformers encoder
    (`encoder_config`, see [`~SpecDrafterModel.from_verifier`]); or none (`use_verifier_encoder=True`).

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

        self.feature_proj = None
        if config.prefix_feature_layers is not None:
            feature_width = len(config.prefix_feature_layers) * (config.verifier_d_model or config.d_model)
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

    # ----------------------------------------------------------------------------------------------------------
    # Embeddings and building blocks
    # ----------------------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary of the drafted ids and logits (the verifier's)."""
        return self.config.vocab_size

    @property
    def max_block_size(self) -> int:
        """The most tokens one `propose` call drafts: one learned query per block position."""
        return self.config.block_size

    @property
    def verifier_state_layers(self) -> list[int] | None:
        """Indices of the verifier's decoder `hidden_states` this drafter reads per prefix position (`None`: none).

        The speculative loop hands them to `propose` as `prefix_states` (see :mod:`specdec_hf.drafting`)."""
        return self.config.prefix_feature_layers

    @property
    def block_size(self) -> int:
        """The k `generate()` drafts when given no `block_size`: `config.default_block_size`, else
        `config.block_size`. `propose` accepts any `1 <= k <= max_block_size`; `forward` (training) defaults to
        every slot, `config.block_size`."""
        default = self.config.default_block_size
        return self.config.block_size if default is None else default

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

    def _embed_prefix(self, input_ids: torch.LongTensor, previous_states: torch.Tensor | None) -> torch.Tensor:
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
                f"This drafter reads the verifier's decoder states (`prefix_feature_layers="
                f"{self.config.prefix_feature_layers}`): pass `verifier_states` (training) or `prefix_states` "
                "(drafting); the speculative loop does so itself."
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
        index = torch.full((self.config.vocab_size,), -100, dtype=torch.long, device=token_ids.device)
        index[self.draft_vocab_ids.to(token_ids.device)] = torch.arange(
            self.draft_vocab_ids.shape[0], device=token_ids.device
        )
        return torch.where(token_ids >= 0, index[token_ids.clamp(min=0)], -100)

    def from_draft_vocab(self, head_index: torch.LongTensor) -> torch.LongTensor:
        """Map rows of the LM head (e.g. an argmax) back to verifier ids."""
        if self.draft_vocab_ids is None:
            return head_index
        return self.draft_vocab_ids[head_index]

    def _check_block_size(self, block_size: int | None) -> int:
        block_size = self.config.block_size if block_size is None else int(block_size)
        if not 1 <= block_size <= self.config.block_size:
            raise ValueError(
                f"`block_size` must be between 1 and the drafter's `config.block_size` ({self.config.block_size}), "
                f"got {block_size}: the drafter has one learned query per mask slot."
            )
        return block_size

    def _check_positions(self, length: int) -> None:
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"Prefix plus mask slots span {length} positions, more than the drafter's "
                f"`max_position_embeddings` ({self.config.max_position_embeddings}). Lower `max_new_tokens` or "
                "`block_size`."
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

    def _memory(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        """What the decoder cross-attends to: the encoder states, projected to `d_model` where widths differ."""
        encoder_hidden_states = encoder_hidden_states.to(self.shared.weight.dtype)
        if self.encoder_proj is not None:
            return self.encoder_proj(encoder_hidden_states)
        return encoder_hidden_states

    @staticmethod
    def _encoder_attention_mask(attention_mask: torch.Tensor | None) -> torch.BoolTensor | None:
        return None if attention_mask is None else attention_mask.bool()[:, None, None, :]

    def _logits(self, hidden_states: torch.Tensor) -> torch.FloatTensor:
        # through the module, not F.linear on its weight: its hooks, a bias or a prepacked kernel apply
        return self.lm_head(hidden_states) + self.final_logits_bias

    # ----------------------------------------------------------------------------------------------------------
    # Training forward
    # ----------------------------------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        block_size: int | None = None,
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
            block_size (`int`, *optional*): Number of mask slots k (defaults to `config.block_size`).
            labels (`torch.LongTensor` of shape `(batch_size, block_size)`, *optional*):
                The next k tokens after each prefix; -100 marks ignored positions (e.g. past EOS).
            label_smoothing (`float`, *optional*, defaults to 0.0): Label smoothing of the cross-entropy.
            glance_ids (`torch.LongTensor` of shape `(batch_size, block_size)`, *optional*):
                Glancing training (GLAT, as in the paper's §3.1): target tokens revealed to their mask slots; -100
                keeps a slot masked. `(batch_size, num_splits, block_size)` with `split_lengths`.
            split_lengths (`torch.LongTensor` of shape `(num_splits,)`, *optional*):
                Train on many split points at once (`prefix_attention="causal"`): `decoder_input_ids` are then whole
                sequences and the drafter drafts k tokens after each prefix length in `split_lengths` (shared by the
                rows), in one pass; `labels` and `logits` gain a `num_splits` dimension.
            verifier_states (`torch.FloatTensor` of shape `(batch_size, prefix_length, feature_width)`, *optional*):
                For a drafter with `prefix_feature_layers`: the verifier's decoder states (those layers,
                concatenated) at each position of `decoder_input_ids`, teacher-forced. Position i reads those of
                position i - 1.

        Returns:
            [`SpecDrafterOutput`]: `logits` of shape `(batch_size, block_size, head_size)` (or `(batch_size,
            num_splits, block_size, head_size)` with `split_lengths`), where `head_size` is `draft_vocab_size` for a
            reduced head (map rows back with `from_draft_vocab`) and `vocab_size` otherwise. `labels` are verifier
            ids either way.
        """
        if decoder_input_ids is None:
            raise ValueError(
                "`decoder_input_ids` (the accepted prefix, starting with the decoder start token) is required."
            )
        block_size = self._check_block_size(block_size)
        batch_size, prefix_length = decoder_input_ids.shape
        self._check_positions(prefix_length + block_size)
        previous_states = None if verifier_states is None else self._shift_states(verifier_states)

        if encoder_hidden_states is None:
            encoder_hidden_states = self.encode(input_ids, attention_mask)
        elif self.encoder is not None and encoder_hidden_states.shape[-1] != self.config.d_model:
            raise ValueError(
                f"`encoder_hidden_states` must have width {self.config.d_model} (this drafter's encoder output)."
            )
        memory = self._memory(encoder_hidden_states)

        device = decoder_input_ids.device
        if decoder_attention_mask is None:
            prefix_mask = torch.ones(batch_size, prefix_length, dtype=torch.bool, device=device)
            prefix_lengths = torch.full((batch_size,), prefix_length, device=device)
        else:
            prefix_mask = decoder_attention_mask.bool()
            prefix_lengths = prefix_mask.sum(dim=1)
        glance_embeds = None if glance_ids is None else self._embed(glance_ids.clamp(min=0))
        common = dict(
            inputs_embeds=self._embed_prefix(decoder_input_ids, previous_states),
            prefix_mask=prefix_mask,
            cross_key_values=self.decoder.project_encoder_states(memory),
            encoder_attention_mask=self._encoder_attention_mask(attention_mask),
        )
        if split_lengths is None:
            hidden_states = self.decoder(
                **common,
                prefix_positions=torch.arange(prefix_length, device=device),
                mask_positions=prefix_lengths[:, None] + torch.arange(block_size, device=device),
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
                block_size=block_size,
                glance_embeds=None if glance_ids is None else glance_embeds.flatten(1, 2),
                glance_mask=None if glance_ids is None else (glance_ids >= 0).flatten(1, 2),
            ).unflatten(1, (split_lengths.shape[0], block_size))
        logits = self._logits(hidden_states)

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

    # ----------------------------------------------------------------------------------------------------------
    # Drafting interface (specdec_hf.drafting.Drafter)
    # ----------------------------------------------------------------------------------------------------------

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
        if self.encoder is None:
            if encoder_hidden_states is None:
                raise ValueError("`use_verifier_encoder=True` needs the verifier's `encoder_hidden_states`.")
            memory = self._memory(encoder_hidden_states)
        else:
            memory = self.encode(input_ids, attention_mask)
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # no padding: let attention skip the mask
        return SpecDrafterState(
            cross_key_values=self.decoder.project_encoder_states(memory),
            encoder_attention_mask=self._encoder_attention_mask(attention_mask),
        )

    @torch.no_grad()
    def propose(
        self,
        state: SpecDrafterState,
        prefix_ids: torch.LongTensor,
        prefix_lengths: torch.LongTensor,
        block_size: int,
        prefix_states: torch.FloatTensor | None = None,
    ) -> DraftProposal:
        """Draft the next `block_size` tokens of every row in one decoder pass.

        With `prefix_attention="causal"` only the prefix tokens not cached yet are fed (per row, from the shared
        cache length to the row's length, right-padded), and the cache is advanced to the shortest row's length.
        The prefix cache buffers are updated in place: always pass on the returned state.

        Args:
            state ([`SpecDrafterState`]): From `init_drafting_state` or the previous `propose`.
            prefix_ids (`torch.LongTensor` of shape `(batch_size, max_prefix_length)`):
                Committed tokens of each row, starting with the decoder start token, right-padded.
            prefix_lengths (`torch.LongTensor` of shape `(batch_size,)`): Valid tokens per row.
            block_size (`int`): Number of tokens to draft (1 to `config.block_size`).
            prefix_states (`torch.FloatTensor` of shape `(batch_size, >= max_prefix_length - 1, feature_width)`,
                *optional*): The verifier's states (the `verifier_state_layers`, concatenated) at the committed
                positions; required for a drafter with `prefix_feature_layers`. A row's last committed token has no
                state yet, and none is read.

        Returns:
            [`~specdec_hf.drafting.DraftProposal`]: `draft_ids` `(batch_size, block_size)` (argmax of
            `draft_logits`), `draft_logits` `(batch_size, block_size, head_size)` in float32 (over the ids of
            `draft_vocab_ids` for a reduced head; `DraftProposal.confidence()` turns them into the drafter's probability
            of each draft) and the updated state.
        """
        block_size = self._check_block_size(block_size)
        device = self.shared.weight.device
        prefix_lengths = prefix_lengths.to(device)
        lengths = prefix_lengths.tolist()
        max_length, min_length = max(lengths), min(lengths)
        self._check_positions(max_length + block_size)

        causal = self.config.prefix_attention == "causal"
        # prefixes only grow; if a caller breaks that, recompute from scratch rather than read a stale cache
        cache_length = state.cache_length if causal and min_length >= state.cache_length else 0
        num_new = max_length - cache_length
        offsets = torch.arange(num_new, device=device)
        cache = self._reserve_prefix_cache(state, cache_length + num_new + block_size) if causal else None

        previous_states = None
        if self.feature_proj is not None:
            # position p reads the state of p - 1: positions [cache_length, max_length) read [cache_length - 1, ...)
            start = max(cache_length - 1, 0)
            if prefix_states is None:
                if max_length - 1 > start:
                    raise ValueError(
                        "This drafter reads the verifier's decoder states: pass `prefix_states` for prefixes longer "
                        "than the start token (the speculative loop does so itself)."
                    )
                prefix_states = self.feature_proj.weight.new_zeros(prefix_ids.shape[0], 0, self.feature_proj.in_features)
            previous_states = prefix_states[:, start : max_length - 1].to(device)
            if cache_length == 0:
                previous_states = F.pad(previous_states, (0, 0, 1, 0))
        hidden_states = self.decoder(
            inputs_embeds=self._embed_prefix(prefix_ids[:, cache_length:max_length].to(device), previous_states),
            prefix_positions=cache_length + offsets,
            # equal lengths (always at batch size 1): no padding, no key mask to build
            prefix_mask=None if min_length == max_length else offsets < (prefix_lengths - cache_length)[:, None],
            mask_positions=prefix_lengths[:, None] + torch.arange(block_size, device=device),
            cross_key_values=state.cross_key_values,
            encoder_attention_mask=state.encoder_attention_mask,
            cache=cache,
            cache_length=cache_length,
        )
        head_logits = self._logits(hidden_states).float()
        if causal:
            # positions below the shortest prefix are committed in every row: keep them, the rest is scratch
            state = replace(state, prefix_key_values=cache, cache_length=min_length)
        # argmax in float32: the same ids, and several times faster on CPU than on half-precision logits; the
        # confidence is left to `DraftProposal.confidence()`, computed only when truncation asks for it
        return DraftProposal(
            draft_ids=self.from_draft_vocab(head_logits.argmax(dim=-1)),
            draft_logits=head_logits,
            state=state,
            draft_vocab_ids=self.draft_vocab_ids,
        )

    def _reserve_prefix_cache(
        self, state: SpecDrafterState, needed: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Return prefix key/value buffers with room for `needed` positions, keeping the first `cache_length`."""
        if state.prefix_key_values is not None and state.prefix_key_values[0][0].shape[2] >= needed:
            return state.prefix_key_values
        reference = state.cross_key_values[0][0]  # (batch_size, num_heads, source_length, head_dim)
        batch_size, num_heads, _, head_dim = reference.shape
        old_capacity = 0 if state.prefix_key_values is None else state.prefix_key_values[0][0].shape[2]
        capacity = max(needed, 2 * old_capacity, 64)
        kept = state.cache_length if state.prefix_key_values is not None else 0
        buffers = []
        for index in range(len(self.decoder.layers)):
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

    # ----------------------------------------------------------------------------------------------------------
    # Construction from a verifier
    # ----------------------------------------------------------------------------------------------------------

    @classmethod
    def from_verifier(
        cls,
        verifier: PreTrainedModel,
        block_size: int = 10,
        draft_vocab_ids: list[int] | torch.Tensor | None = None,
        **overrides,
    ) -> SpecDrafterModel:
        """Build a drafter for `verifier`, initialised from the verifier's encoder and embeddings.

        The drafter gets the verifier's vocabulary, special token ids and width; its encoder is the verifier family's
        encoder module with the verifier's weights (its first `encoder_layers` layers if overridden), its shared
        embedding (decoder input and tied LM head) is the verifier's, and its decoder is new.

        Args:
            verifier (`PreTrainedModel`): A BART, mBART, Marian, Pegasus, T5 or mT5 encoder-decoder model.
            block_size (`int`, *optional*, defaults to 10): Number of tokens drafted per call (k).
            draft_vocab_ids (`list[int]` or `torch.LongTensor`, *optional*): A reduced-vocabulary LM head over these
                verifier ids (distinct; e.g. the most frequent target tokens of the training data, see
                `specdec_hf.training.frequent_token_ids` over `token_counts`), its rows initialised from the verifier's output embedding.
            overrides: Any [`SpecDrafterConfig`] field, e.g. `decoder_layers=1`, `encoder_layers=3`,
                `prefix_attention="causal"`, `use_verifier_encoder=True` (no encoder: nothing of the encoder is
                built or copied; the drafter reads the verifier's encoder output).

        Returns:
            [`SpecDrafterModel`] on the verifier's device and dtype, in eval mode.

        Raises:
            ValueError: for a decoder-only or unsupported verifier, an unknown override, or more encoder layers than
                the verifier has.
        """
        verifier_config = verifier.config
        model_type = getattr(verifier_config, "model_type", None)
        if not getattr(verifier_config, "is_encoder_decoder", False):
            raise ValueError(
                f"`verifier` ({type(verifier).__name__}, model_type {model_type!r}) is not an encoder-decoder model. "
                "Speculative Decoding with a Spec-Drafter accelerates encoder-decoder (seq2seq) verifiers such as "
                "BART, T5, Marian, mBART or Pegasus."
            )
        if model_type not in ENCODER_CLASSES:
            raise ValueError(
                f"Unsupported verifier family {model_type!r}: `from_verifier` supports {sorted(ENCODER_CLASSES)}. "
                "Build a `SpecDrafterConfig` by hand for other models."
            )
        check_state_layers(overrides.get("prefix_feature_layers"), verifier)
        field_names = {field.name for field in fields(SpecDrafterConfig)}
        unknown = sorted(set(overrides) - field_names)
        if unknown:
            raise ValueError(f"Unknown `SpecDrafterConfig` field(s) in overrides: {unknown}.")

        t5_like = model_type in _T5_LIKE
        d_model = verifier_config.d_model
        # the decoder start token as `generate` resolves it: generation config, then model config, then BOS
        generation_config = getattr(verifier, "generation_config", None)
        candidates = [
            getattr(generation_config, "decoder_start_token_id", None),
            getattr(verifier_config, "decoder_start_token_id", None),
            getattr(generation_config, "bos_token_id", None),
            getattr(verifier_config, "bos_token_id", None),
            verifier_config.pad_token_id,
        ]
        decoder_start_token_id = next((token for token in candidates if token is not None), None)
        activation = verifier_config.dense_act_fn if t5_like else verifier_config.activation_function
        kwargs = {
            "vocab_size": verifier_config.vocab_size,
            "d_model": d_model,
            "decoder_attention_heads": verifier_config.num_heads
            if t5_like
            else verifier_config.decoder_attention_heads,
            "decoder_ffn_dim": verifier_config.d_ff if t5_like else verifier_config.decoder_ffn_dim,
            "activation_function": activation if activation in ACT2FN else "gelu",
            "dropout": verifier_config.dropout_rate if t5_like else verifier_config.dropout,
            "max_position_embeddings": getattr(verifier_config, "max_position_embeddings", None) or 1024,
            "scale_embedding": bool(getattr(verifier_config, "scale_embedding", False)),
            "pad_token_id": verifier_config.pad_token_id,
            "bos_token_id": getattr(verifier_config, "bos_token_id", None),
            "eos_token_id": verifier_config.eos_token_id,
            "decoder_start_token_id": decoder_start_token_id,
            "verifier_name_or_path": verifier.name_or_path or None,
            "verifier_vocab_size": verifier_config.vocab_size,
            "verifier_d_model": d_model,
            "block_size": block_size,
        }
        layers_key = _ENCODER_LAYERS_KEY.get(model_type, "encoder_layers")
        verifier_encoder_layers = getattr(verifier_config, layers_key)
        use_verifier_encoder = overrides.get("use_verifier_encoder", False)
        if use_verifier_encoder and "encoder_layers" in overrides:
            raise ValueError(
                "`encoder_layers` does nothing with `use_verifier_encoder=True` (the drafter has no encoder and reads "
                "the verifier's encoder output): drop one of the two."
            )
        encoder_layers = overrides.pop("encoder_layers", verifier_encoder_layers)
        if not use_verifier_encoder:
            if not 1 <= encoder_layers <= verifier_encoder_layers:
                raise ValueError(
                    f"`encoder_layers` must be between 1 and the verifier's {verifier_encoder_layers}, got "
                    f"{encoder_layers}: the drafter's encoder copies the verifier's first layers."
                )
            encoder_config = verifier_config.to_diff_dict()
            encoder_config["model_type"] = model_type
            encoder_config[layers_key] = encoder_layers
            for key in ("architectures", "transformers_version", "_name_or_path", "id2label", "label2id"):
                encoder_config.pop(key, None)
            kwargs["encoder_config"] = encoder_config
            kwargs["encoder_layers"] = encoder_layers
        kwargs.update(overrides)
        if draft_vocab_ids is not None:
            draft_vocab_ids = torch.as_tensor(draft_vocab_ids, dtype=torch.long).flatten()
            if draft_vocab_ids.unique().numel() != draft_vocab_ids.numel():
                raise ValueError("`draft_vocab_ids` must be distinct verifier ids.")
            if int(draft_vocab_ids.min()) < 0 or int(draft_vocab_ids.max()) >= verifier_config.vocab_size:
                raise ValueError(f"`draft_vocab_ids` must lie in [0, {verifier_config.vocab_size}) (the vocabulary).")
            kwargs["draft_vocab_size"] = draft_vocab_ids.numel()
            kwargs["tie_word_embeddings"] = False

        parameter = next(verifier.parameters())
        drafter = cls(SpecDrafterConfig(**kwargs)).to(device=parameter.device, dtype=parameter.dtype)
        with torch.no_grad():
            verifier_embeddings = verifier.get_input_embeddings().weight
            if (
                verifier_embeddings.shape == drafter.shared.weight.shape
            ):  # not with a narrower verifier-encoder drafter
                drafter.shared.weight.copy_(verifier_embeddings)
            verifier_head = verifier.get_output_embeddings()
            verifier_bias = getattr(verifier, "final_logits_bias", None)
            head_rows = slice(None)
            if draft_vocab_ids is not None:
                drafter.draft_vocab_ids.copy_(draft_vocab_ids)
                head_rows = draft_vocab_ids.to(verifier_head.weight.device)
            if not drafter.config.tie_word_embeddings and verifier_head.weight.shape[1] == drafter.config.d_model:
                drafter.lm_head.weight.copy_(verifier_head.weight[head_rows])
            if verifier_bias is not None and verifier_bias.shape[1] == verifier_config.vocab_size:
                drafter.final_logits_bias.copy_(verifier_bias[:, head_rows])
            if drafter.config.encoder_config is not None:
                drafter._load_verifier_encoder(verifier.get_encoder())
        return drafter.eval()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """The tied weights: a transformers encoder always embeds with `shared`; the LM head only with
        `tie_word_embeddings` (a reduced head has rows of its own)."""
        tied = super().get_expanded_tied_weights_keys(all_submodels=all_submodels)
        if self.config.encoder_config is not None and not self.config.tie_word_embeddings:
            tied = {**tied, "encoder.embed_tokens.weight": "shared.weight"}
        return tied

    def _load_verifier_encoder(self, verifier_encoder: nn.Module) -> None:
        """Copy the verifier encoder's weights into this drafter's (possibly shallower) encoder."""
        source = verifier_encoder.state_dict()
        target = self.encoder.state_dict()
        missing = sorted(set(target) - set(source))
        if missing:
            raise ValueError(f"The verifier's encoder lacks weights the drafter's encoder needs: {missing[:5]}.")
        self.encoder.load_state_dict({name: source[name] for name in target})


__all__ = [
    "SpecDrafterModel",
    "SpecDrafterOutput",
    "SpecDrafterPreTrainedModel",
    "SpecDrafterState",
]
