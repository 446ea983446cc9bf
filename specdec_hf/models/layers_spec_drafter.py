"""Building blocks of the Spec-Drafter (Xia et al., 2023, arXiv 2203.16487): pre-LN Transformer layers on
`torch.nn.functional.scaled_dot_product_attention` with explicit boolean masks, and the compact own encoder.

- [`SpecDrafterAttention`]: multi-head attention for self-attention (optionally writing its keys and values into a
  caller-owned cache buffer) and for cross-attention to precomputed keys and values.
- [`SpecDrafterEncoderLayer`], [`SpecDrafterDecoderLayer`]: the layers; [`SpecDrafterEncoder`]: the encoder of a
  drafter built from a plain config (a drafter built from a verifier uses that family's encoder instead).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from .configuration_spec_drafter import SpecDrafterConfig

__all__ = [
    "SpecDrafterAttention",
    "SpecDrafterDecoderLayer",
    "SpecDrafterEncoder",
    "SpecDrafterEncoderLayer",
    "SpecDrafterFeedForward",
    "SpecDrafterSinusoidalPositionalEmbedding",
]


def dropout_in_training(states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout`, not called outside training: there it returns its input, at a cost a drafting call pays at every
    layer."""
    return F.dropout(states, p=p, training=True) if training else states


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
        hidden_states = residual + dropout_in_training(hidden_states, self.dropout, self.training)
        residual = hidden_states
        hidden_states = self.mlp(self.final_layer_norm(hidden_states))
        return residual + dropout_in_training(hidden_states, self.dropout, self.training)


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
        hidden_states = residual + dropout_in_training(hidden_states, self.dropout, self.training)
        residual = hidden_states
        hidden_states = self.encoder_attn(
            self.encoder_attn_layer_norm(hidden_states),
            attention_mask=encoder_attention_mask,
            key_value=cross_key_value,
        )
        hidden_states = residual + dropout_in_training(hidden_states, self.dropout, self.training)
        residual = hidden_states
        hidden_states = self.mlp(self.final_layer_norm(hidden_states))
        return residual + dropout_in_training(hidden_states, self.dropout, self.training)


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
        hidden_states = dropout_in_training(hidden_states, self.dropout, self.training)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask)
        return self.layer_norm(hidden_states)
