"""Spec-Drafter model configuration.

The Spec-Drafter is the non-autoregressive drafter of Speculative Decoding (Xia et al., 2023, arXiv 2203.16487): an
encoder-decoder that reads the source and the accepted prefix followed by k mask tokens, and predicts the next k tokens
in parallel (k: `num_draft_tokens`, at most `max_draft_tokens`).
"""

import types
import typing
from typing import Any

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from ..auto_draft_length import AUTO

PREFIX_ATTENTION_TYPES = ("bidirectional", "causal")
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal")
# names of drafter fields before they were unified (0.1.0, never published): refused with the name to use, so that a
# drafter saved with them fails on loading rather than drafting without the weights they describe
_RENAMED_FIELDS = {
    "block_size": "max_draft_tokens",
    "max_block_size": "max_draft_tokens",
    "default_block_size": "num_draft_tokens",
    "prefix_feature_layers": "verifier_state_layers",
}


def _matches(value, annotation) -> bool:
    """Whether `value` is of the field type `annotation` (`int`, `float | int`, `list[int] | None`, ...); a bool is
    no number, an int is a float."""
    if annotation is Any:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, member) for member in typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, (list, tuple)) and all(_matches(element, item) for element in value)
    if origin is dict:
        return isinstance(value, dict)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _describe(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


class SpecDrafterConfig(PretrainedConfig):
    r"""
    This is the configuration class to store the configuration of a [`SpecDrafterModel`]. It defines the drafter's
    architecture; the defaults give a "deep-shallow" drafter (6 encoder layers, 2 decoder layers, width 512) that
    drafts up to 10 tokens per call. [`SpecDrafterModel.from_verifier`] fills it in from a verifier instead.

    Args:
        vocab_size (`int`, *optional*, defaults to 32000):
            Vocabulary size; must equal the verifier's (the drafter shares the verifier's tokenizer).
        max_position_embeddings (`int`, *optional*, defaults to 1024):
            Number of learned decoder positions (prefix plus k masks), and of the own encoder's positions.
        d_model (`int`, *optional*, defaults to 512):
            Width of the encoder and the decoder. When `encoder_config` is set it must equal the nested config's
            `d_model`.
        encoder_layers (`int`, *optional*, defaults to 6):
            Number of layers of the own encoder. Ignored when `encoder_config` is set (the nested config decides) or
            when `use_verifier_encoder=True` (no encoder).
        encoder_attention_heads (`int`, *optional*, defaults to 8):
            Attention heads of each own-encoder layer.
        encoder_ffn_dim (`int`, *optional*, defaults to 2048):
            Feed-forward width of each own-encoder layer.
        encoder_position_embedding_type (`str`, *optional*, defaults to `"learned"`):
            Positions of the own encoder: `"learned"` or `"sinusoidal"`.
        decoder_layers (`int`, *optional*, defaults to 2):
            Number of decoder layers (keep it small: the decoder runs once per drafting iteration).
        decoder_attention_heads (`int`, *optional*, defaults to 8):
            Attention heads of each decoder layer (self- and cross-attention).
        decoder_ffn_dim (`int`, *optional*, defaults to 2048):
            Feed-forward width of each decoder layer.
        activation_function (`str`, *optional*, defaults to `"gelu"`):
            Feed-forward activation, any key of `transformers.activations.ACT2FN`.
        dropout (`float`, *optional*, defaults to 0.1):
            Dropout on embeddings and residual branches (training only).
        attention_dropout (`float`, *optional*, defaults to 0.0):
            Dropout on attention probabilities (training only).
        layer_norm_eps (`float`, *optional*, defaults to 1e-5):
            Epsilon of the drafter's own layer norms.
        scale_embedding (`bool`, *optional*, defaults to `False`):
            Whether token embeddings fed to the decoder (and to the own encoder) are scaled by `sqrt(d_model)`.
        max_draft_tokens (`int`, *optional*, defaults to 10):
            Number of mask slots, each with its own learned query: the most tokens one call can draft (the largest
            k), and the k it is trained with.
        num_draft_tokens (`int` or `str`, *optional*):
            The k `generate()` drafts when given no `num_draft_tokens`, at most `max_draft_tokens`, or `"auto"`: k
            chosen at every iteration from this machine's timings and the drafts' acceptance, 0 included
            (`specdec_hf.generation.draft_length`). A drafter trained with many slots often pays best drafting fewer
            (later drafts are rarely accepted, and each costs verification), and the best k differs between machines
            and batch sizes: `"auto"` finds it. `None` (default) means `max_draft_tokens`.
        prefix_attention (`str`, *optional*, defaults to `"bidirectional"`):
            How the decoder's prefix tokens attend to each other. `"bidirectional"` (the paper): prefix tokens and
            masks attend to each other both ways and the whole prefix is re-read at every call. `"causal"`: prefix
            tokens attend causally, so their keys and values are cached across calls and each call only feeds the
            new tokens; the masks still see the whole prefix and each other.
        use_verifier_encoder (`bool`, *optional*, defaults to `False`):
            If `True` the drafter has no encoder and cross-attends to the verifier's encoder output (projected to
            `d_model` when `verifier_d_model` differs).
        verifier_d_model (`int`, *optional*):
            Width of the verifier's encoder output; used with `use_verifier_encoder=True` (defaults to `d_model`).
        encoder_config (`dict`, *optional*):
            The verifier family's config (`to_diff_dict()`, with `model_type`) describing the encoder: when set, the
            encoder is that family's own encoder module from transformers (e.g. `BartEncoder`, `T5Stack`).
        verifier_name_or_path (`str`, *optional*):
            Name or path of the verifier the drafter was built for (informative).
        verifier_vocab_size (`int`, *optional*):
            Vocabulary size of that verifier (informative; checked against the verifier at decoding time).
        init_std (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialiser of the drafter's own weights.
        pad_token_id (`int`, *optional*, defaults to 1):
            Padding token id.
        bos_token_id (`int`, *optional*, defaults to 0):
            Beginning-of-sequence token id.
        eos_token_id (`int` or `list[int]`, *optional*, defaults to 2):
            End-of-sequence token id(s).
        decoder_start_token_id (`int`, *optional*, defaults to 2):
            The verifier's decoder start token, first token of every prefix.
        tie_word_embeddings (`bool`, *optional*, defaults to `True`):
            Whether the LM head (and a transformers encoder's token embedding) are tied to the shared embedding.
            Must be `False` with `draft_vocab_size` (the head then has its own rows).
        verifier_state_layers (`list[int]`, *optional*):
            Verifier-conditioned drafting (EAGLE, Li et al. 2024, arXiv 2401.15077; EAGLE-3, arXiv 2503.01840): the
            indices into the verifier's decoder `hidden_states` (as returned with `output_hidden_states=True`; 0 is
            the embedding output, -1 the top layer) whose states the drafter reads. Prefix position i adds a
            projection of the concatenated states of position i - 1 to its token embedding, so the last committed
            token (which the verifier has not read yet) still gets the state that predicted it. `[-1]` is EAGLE-1's
            top-layer feature, several indices fuse low, middle and high layers as EAGLE-3 does. Needs
            `prefix_attention="causal"`. `None` (default): the drafter reads tokens only.
        draft_vocab_size (`int`, *optional*):
            Reduced-vocabulary LM head (FR-Spec, Zhao et al. 2025, arXiv 2502.14856): the head scores only this many
            verifier ids (the most frequent target tokens of the training data, stored in the `draft_vocab_ids`
            buffer) and drafts are mapped back to verifier ids. `None` (default): the full vocabulary.

    Example:

    ```python
    >>> from specdec_hf import SpecDrafterConfig, SpecDrafterModel

    >>> # A deep-shallow drafter with 10 mask slots drafting 4 tokens per call by default, with a prefix cache
    >>> configuration = SpecDrafterConfig(
    ...     vocab_size=32000, max_draft_tokens=10, num_draft_tokens=4, prefix_attention="causal"
    ... )

    >>> # Initializing a model (with random weights) from the configuration
    >>> model = SpecDrafterModel(configuration)

    >>> # Accessing the model configuration
    >>> configuration = model.config
    ```"""

    model_type = "spec_drafter"
    attribute_map = {"hidden_size": "d_model"}

    vocab_size: int = 32000
    max_position_embeddings: int = 1024
    d_model: int = 512
    encoder_layers: int = 6
    encoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    encoder_position_embedding_type: str = "learned"
    decoder_layers: int = 2
    decoder_attention_heads: int = 8
    decoder_ffn_dim: int = 2048
    activation_function: str = "gelu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    layer_norm_eps: float = 1e-5
    scale_embedding: bool = False
    max_draft_tokens: int = 10
    num_draft_tokens: int | str | None = None
    prefix_attention: str = "bidirectional"
    use_verifier_encoder: bool = False
    verifier_d_model: int | None = None
    encoder_config: dict[str, Any] | None = None
    verifier_name_or_path: str | None = None
    verifier_vocab_size: int | None = None
    init_std: float = 0.02
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 2
    tie_word_embeddings: bool = True
    verifier_state_layers: list[int] | None = None
    draft_vocab_size: int | None = None

    def __post_init__(self, **kwargs):
        if kwargs.pop("draft_chain_dim", None) is not None:
            raise ValueError(
                "This drafter has a draft chain (`draft_chain_dim`), which specdec_hf no longer has: it cannot be "
                "loaded by this version. Train a drafter without one."
            )
        renamed = sorted(set(kwargs) & set(_RENAMED_FIELDS))
        if renamed:
            raise ValueError(
                "This drafter config uses names of an earlier version of specdec_hf: "
                + ", ".join(f"`{name}` (now `{_RENAMED_FIELDS[name]}`)" for name in renamed)
                + ". Rename them in its config.json (or the `drafter_config` given)."
            )
        # a field of the wrong type (`"max_draft_tokens": "4"` in a hand-edited config.json) is named here, before it
        # meets a comparison or a tensor shape
        for name, annotation in type(self).__annotations__.items():
            value = getattr(self, name, None)
            if not _matches(value, annotation):
                raise ValueError(
                    f"`{name}` must be of type {_describe(annotation)}, got {value!r} ({type(value).__name__}); fix "
                    "it in the drafter's config.json (or the `drafter_config` given)."
                )
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"`activation_function` must be one of transformers' activations ({', '.join(sorted(ACT2FN))}), got "
                f"{self.activation_function!r}."
            )
        if self.verifier_state_layers is not None:
            self.verifier_state_layers = [int(index) for index in self.verifier_state_layers]
            if not self.verifier_state_layers:
                raise ValueError("`verifier_state_layers` must name at least one layer, or be None (tokens only).")
            if self.prefix_attention != "causal":
                raise ValueError(
                    '`verifier_state_layers` needs `prefix_attention="causal"`: a prefix position reads the '
                    "verifier state of the position before it, which only a causal prefix keeps consistent."
                )
        if self.draft_vocab_size is not None:
            if not 1 <= self.draft_vocab_size <= self.vocab_size:
                raise ValueError(
                    f"`draft_vocab_size` must be between 1 and `vocab_size` ({self.vocab_size}), got "
                    f"{self.draft_vocab_size}."
                )
            if self.tie_word_embeddings:
                raise ValueError(
                    "`draft_vocab_size` needs `tie_word_embeddings=False`: a reduced head has its own rows "
                    "(`SpecDrafterModel.from_verifier(..., draft_vocab_ids=...)` sets both)."
                )
        if self.max_draft_tokens < 1:
            raise ValueError(f"`max_draft_tokens` must be at least 1, got {self.max_draft_tokens}.")
        k = self.num_draft_tokens
        if (
            k is not None
            and k != AUTO
            and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.max_draft_tokens)
        ):
            raise ValueError(
                f"`num_draft_tokens` must be between 1 and `max_draft_tokens` ({self.max_draft_tokens}) or {AUTO!r}, "
                f"got {k!r}: it is the k drafted when generate() gets no `num_draft_tokens`."
            )
        if self.prefix_attention not in PREFIX_ATTENTION_TYPES:
            raise ValueError(
                f"`prefix_attention` must be one of {PREFIX_ATTENTION_TYPES}, got {self.prefix_attention!r}."
            )
        if self.encoder_position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"`encoder_position_embedding_type` must be one of {POSITION_EMBEDDING_TYPES}, got "
                f"{self.encoder_position_embedding_type!r}."
            )
        if self.d_model % self.decoder_attention_heads != 0:
            raise ValueError(
                f"`d_model` ({self.d_model}) must be divisible by `decoder_attention_heads` "
                f"({self.decoder_attention_heads})."
            )
        if self.encoder_config is not None:
            if self.use_verifier_encoder:
                raise ValueError(
                    "`encoder_config` and `use_verifier_encoder=True` exclude each other: a drafter either has an "
                    "encoder or reads the verifier's encoder output."
                )
            if "model_type" not in self.encoder_config:
                raise ValueError("`encoder_config` must contain the verifier family's `model_type`.")
            encoder_d_model = self.encoder_config.get("d_model", self.d_model)
            if encoder_d_model != self.d_model:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must equal the width of `encoder_config` ({encoder_d_model}): the "
                    "decoder is as wide as the encoder."
                )
        elif not self.use_verifier_encoder and self.d_model % self.encoder_attention_heads != 0:
            raise ValueError(
                f"`d_model` ({self.d_model}) must be divisible by `encoder_attention_heads` "
                f"({self.encoder_attention_heads})."
            )
        super().__post_init__(**kwargs)


__all__ = ["SpecDrafterConfig"]
