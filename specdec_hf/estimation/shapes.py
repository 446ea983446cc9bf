"""The verifier shapes the estimator measures: built-in shapes of well-known checkpoints, or any config.json.

Only a verifier's *shape* sets what speculative decoding costs on a machine (its width, depth, vocabulary and
attention layout); its weights only set how often the drafter is right, which the estimator takes as an acceptance
profile. So a shape is measured with random weights, and no checkpoint has to be downloaded: the dimensions of a few
well-known checkpoints are written here (read from their published `config.json`), and any other verifier is read
from its own `config.json` (a local directory, or a Hub id when the Hub is reachable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

__all__ = ["BUILTIN_SHAPES", "load_verifier_config"]

_MARIAN_OPUS_MT = {
    "model_type": "marian",
    "d_model": 512,
    "encoder_layers": 6,
    "decoder_layers": 6,
    "encoder_attention_heads": 8,
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048,
    "vocab_size": 58101,
    "decoder_vocab_size": 58101,
    "max_position_embeddings": 512,
    "activation_function": "swish",
    "scale_embedding": True,
    "static_position_embeddings": True,
    "share_encoder_decoder_embeddings": True,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "decoder_start_token_id": 58100,
    # the generation config of OPUS-MT checkpoints bans <pad>, the decoder start token
    "bad_words_ids": [[58100]],
}


def _t5(d_model: int, d_ff: int, num_heads: int, num_layers: int) -> dict[str, Any]:
    return {
        "model_type": "t5",
        "d_model": d_model,
        "d_ff": d_ff,
        "d_kv": 64,
        "num_heads": num_heads,
        "num_layers": num_layers,
        "num_decoder_layers": num_layers,
        "vocab_size": 32128,
        "feed_forward_proj": "relu",
        "relative_attention_num_buckets": 32,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }


def _bart(d_model: int, layers: int, heads: int) -> dict[str, Any]:
    return {
        "model_type": "bart",
        "d_model": d_model,
        "encoder_layers": layers,
        "decoder_layers": layers,
        "encoder_attention_heads": heads,
        "decoder_attention_heads": heads,
        "encoder_ffn_dim": 4 * d_model,
        "decoder_ffn_dim": 4 * d_model,
        "vocab_size": 50265,
        "max_position_embeddings": 1024,
        "activation_function": "gelu",
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "decoder_start_token_id": 2,
    }


# name -> config fields; the figures of each checkpoint's published config.json
BUILTIN_SHAPES: dict[str, dict[str, Any]] = {
    "opus-mt-en-de": _MARIAN_OPUS_MT,
    "t5-small": _t5(d_model=512, d_ff=2048, num_heads=8, num_layers=6),
    "t5-base": _t5(d_model=768, d_ff=3072, num_heads=12, num_layers=12),
    "bart-base": _bart(d_model=768, layers=6, heads=12),
    "bart-large": _bart(d_model=1024, layers=12, heads=16),
    "pegasus-large": {
        "model_type": "pegasus",
        "d_model": 1024,
        "encoder_layers": 16,
        "decoder_layers": 16,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
        "vocab_size": 96103,
        "max_position_embeddings": 1024,
        "activation_function": "relu",
        "scale_embedding": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    },
}


def load_verifier_config(name_or_path: str) -> PretrainedConfig:
    """
    The config of the verifier to measure: a built-in shape's name, a local directory or a Hub id.

    Only `config.json` is read (no weights). Generation settings that the checkpoint's generation config would
    carry and that change what the loop does (`bad_words_ids` of OPUS-MT models) are kept on the returned config
    under `generation_overrides`.

    Args:
        name_or_path (`str`): One of `BUILTIN_SHAPES`, a directory holding `config.json`, or a Hub repository id.

    Raises:
        ValueError: for an unknown name that is neither a directory nor loadable, or a config that is not an
            encoder-decoder model.
    """
    if name_or_path in BUILTIN_SHAPES:
        fields = dict(BUILTIN_SHAPES[name_or_path])
        bad_words_ids = fields.pop("bad_words_ids", None)
        config = AutoConfig.for_model(**fields)
        config.name_or_path = name_or_path
        config.generation_overrides = {"bad_words_ids": bad_words_ids} if bad_words_ids else {}
    else:
        path = Path(name_or_path)
        if path.exists() and not (path / "config.json").is_file():
            raise ValueError(f"--verifier {name_or_path}: the directory has no config.json.")
        try:
            config = AutoConfig.from_pretrained(name_or_path)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"--verifier {name_or_path!r} is not a built-in shape ({', '.join(BUILTIN_SHAPES)}), a directory "
                f"with a config.json, nor a Hub id that could be read ({type(error).__name__}: {error})."
            ) from None
        config.generation_overrides = _generation_overrides(path)
    if not getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"--verifier {name_or_path}: model_type {config.model_type!r} is not an encoder-decoder model; "
            "speculative decoding with a Spec-Drafter accelerates seq2seq verifiers (BART, T5, Marian, mBART, Pegasus)."
        )
    return config


def _generation_overrides(path: Path) -> dict[str, Any]:
    """`bad_words_ids` from a local directory's generation_config.json (the loop treats bans specially)."""
    file = path / "generation_config.json"
    if not file.is_file():
        return {}
    bad_words_ids = json.loads(file.read_text(encoding="utf-8")).get("bad_words_ids")
    return {"bad_words_ids": bad_words_ids} if bad_words_ids else {}
