"""Building a Spec-Drafter for a verifier of a transformers encoder-decoder family.

A drafter made with [`SpecDrafterModel.from_verifier`] shares the verifier's vocabulary, special tokens and width;
its encoder is the verifier family's own encoder module from transformers (`BartEncoder`, `T5Stack`, ...) holding
the verifier's first layers, and its embedding (and LM head, or the rows of a reduced head) is copied from the
verifier. This module knows the families: which encoder class each uses, where its config keeps the number of encoder
layers, how many decoder hidden states its forward returns, and how to fill in a [`SpecDrafterConfig`] from it.
"""

from __future__ import annotations

import importlib
from dataclasses import fields

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel
from transformers.activations import ACT2FN

from .configuration_spec_drafter import SpecDrafterConfig

__all__ = [
    "ENCODER_CLASSES",
    "build_transformers_encoder",
    "check_verifier_state_layers",
    "copy_verifier_weights",
    "decoder_hidden_state_count",
    "drafter_config_from_verifier",
]

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


def decoder_hidden_state_count(verifier: PreTrainedModel) -> int:
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


def check_verifier_state_layers(layers: list[int] | None, verifier: PreTrainedModel) -> None:
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
            f"The drafter reads verifier decoder states {wrong} (`verifier_state_layers`), but this verifier returns "
            f"{count} (indices {-count} to {count - 1}: 0 is the embedding output, -1 the top layer). Name layers "
            "this verifier has, or use a drafter trained for it."
        )


def _decoder_start_token_id(verifier: PreTrainedModel) -> int | None:
    """The decoder start token as `generate` resolves it: generation config, then model config, then BOS, then PAD."""
    config = verifier.config
    generation_config = getattr(verifier, "generation_config", None)
    candidates = [
        getattr(generation_config, "decoder_start_token_id", None),
        getattr(config, "decoder_start_token_id", None),
        getattr(generation_config, "bos_token_id", None),
        getattr(config, "bos_token_id", None),
        config.pad_token_id,
    ]
    return next((token for token in candidates if token is not None), None)


def _checked_draft_vocab_ids(draft_vocab_ids, vocab_size: int) -> torch.LongTensor | None:
    if draft_vocab_ids is None:
        return None
    draft_vocab_ids = torch.as_tensor(draft_vocab_ids, dtype=torch.long).flatten()
    if draft_vocab_ids.unique().numel() != draft_vocab_ids.numel():
        raise ValueError("`draft_vocab_ids` must be distinct verifier ids.")
    if int(draft_vocab_ids.min()) < 0 or int(draft_vocab_ids.max()) >= vocab_size:
        raise ValueError(f"`draft_vocab_ids` must lie in [0, {vocab_size}) (the vocabulary).")
    return draft_vocab_ids


def drafter_config_from_verifier(
    verifier: PreTrainedModel,
    max_draft_tokens: int = 10,
    draft_vocab_ids: list[int] | torch.Tensor | None = None,
    **overrides,
) -> tuple[SpecDrafterConfig, torch.LongTensor | None]:
    """The [`SpecDrafterConfig`] of a drafter for `verifier`; arguments as in [`SpecDrafterModel.from_verifier`].

    Returns:
        The config and `draft_vocab_ids` as a checked `torch.LongTensor` (`None` for a full head).
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
    check_verifier_state_layers(overrides.get("verifier_state_layers"), verifier)
    unknown = sorted(set(overrides) - {field.name for field in fields(SpecDrafterConfig)})
    if unknown:
        raise ValueError(f"Unknown `SpecDrafterConfig` field(s) in overrides: {unknown}.")

    t5_like = model_type in _T5_LIKE
    activation = verifier_config.dense_act_fn if t5_like else verifier_config.activation_function
    kwargs = {
        "vocab_size": verifier_config.vocab_size,
        "d_model": verifier_config.d_model,
        "decoder_attention_heads": verifier_config.num_heads if t5_like else verifier_config.decoder_attention_heads,
        "decoder_ffn_dim": verifier_config.d_ff if t5_like else verifier_config.decoder_ffn_dim,
        "activation_function": activation if activation in ACT2FN else "gelu",
        "dropout": verifier_config.dropout_rate if t5_like else verifier_config.dropout,
        "max_position_embeddings": getattr(verifier_config, "max_position_embeddings", None) or 1024,
        "scale_embedding": bool(getattr(verifier_config, "scale_embedding", False)),
        "pad_token_id": verifier_config.pad_token_id,
        "bos_token_id": getattr(verifier_config, "bos_token_id", None),
        "eos_token_id": verifier_config.eos_token_id,
        "decoder_start_token_id": _decoder_start_token_id(verifier),
        "verifier_name_or_path": verifier.name_or_path or None,
        "verifier_vocab_size": verifier_config.vocab_size,
        "verifier_d_model": verifier_config.d_model,
        "max_draft_tokens": max_draft_tokens,
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
    draft_vocab_ids = _checked_draft_vocab_ids(draft_vocab_ids, verifier_config.vocab_size)
    if draft_vocab_ids is not None:
        kwargs["draft_vocab_size"] = draft_vocab_ids.numel()
        kwargs["tie_word_embeddings"] = False
    return SpecDrafterConfig(**kwargs), draft_vocab_ids


@torch.no_grad()
def copy_verifier_weights(
    drafter: PreTrainedModel, verifier: PreTrainedModel, draft_vocab_ids: torch.LongTensor | None = None
) -> None:
    """Initialise `drafter` (built from `drafter_config_from_verifier`) from the verifier's weights, in place.

    Copies the embedding (where the widths match), the LM head rows (all, or those of `draft_vocab_ids`) and their
    bias, and the encoder's layers (the first `encoder_layers` of the verifier's).
    """
    verifier_embeddings = verifier.get_input_embeddings().weight
    if verifier_embeddings.shape == drafter.shared.weight.shape:  # not with a narrower verifier-encoder drafter
        drafter.shared.weight.copy_(verifier_embeddings)
    verifier_head = verifier.get_output_embeddings()
    verifier_bias = getattr(verifier, "final_logits_bias", None)
    head_rows = slice(None)
    if draft_vocab_ids is not None:
        drafter.draft_vocab_ids.copy_(draft_vocab_ids)
        head_rows = draft_vocab_ids.to(verifier_head.weight.device)
    if not drafter.config.tie_word_embeddings and verifier_head.weight.shape[1] == drafter.config.d_model:
        drafter.lm_head.weight.copy_(verifier_head.weight[head_rows])
    if verifier_bias is not None and verifier_bias.shape[1] == verifier.config.vocab_size:
        drafter.final_logits_bias.copy_(verifier_bias[:, head_rows])
    if drafter.config.encoder_config is not None:
        _copy_encoder(verifier.get_encoder(), drafter.encoder)


def _copy_encoder(verifier_encoder: nn.Module, drafter_encoder: nn.Module) -> None:
    """Copy the verifier encoder's weights into the drafter's (possibly shallower) encoder of the same family."""
    source = verifier_encoder.state_dict()
    target = drafter_encoder.state_dict()
    missing = sorted(set(target) - set(source))
    if missing:
        raise ValueError(f"The verifier's encoder lacks weights the drafter's encoder needs: {missing[:5]}.")
    drafter_encoder.load_state_dict({name: source[name] for name in target})
