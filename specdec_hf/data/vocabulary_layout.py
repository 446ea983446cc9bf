"""Re-lays a Marian model's (and its drafter's) vocabulary so that `<pad>` is the last id, as in Marian checkpoints.

Marian checkpoints converted from OPUS-MT (e.g. `Helsinki-NLP/opus-mt-en-de`) put `</s>` at id 0, `<unk>` at id 1 and
`<pad>` last, with an all-zero embedding row for `<pad>` (the decoder starts from it) and `bad_words_ids=[[pad]]` in
their generation config. Runtimes that convert Marian models (CTranslate2's `TransformersConverter`) rely on that
layout. A model trained with `<pad>` at id 0 is moved to it by a permutation: the tokenizer's pieces and the
embedding rows move together, so every text still encodes to the same pieces and decodes to the same string.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer
from transformers import MarianMTModel, PreTrainedTokenizerFast

if TYPE_CHECKING:
    from specdec_hf.models.modeling_spec_drafter import SpecDrafterModel


def pad_last_permutation(vocab_size: int, pad_id: int) -> list[int]:
    """
    The old id of each new id when `pad_id` moves to the end and every later id moves down by one.

    Args:
        vocab_size (`int`): Number of ids.
        pad_id (`int`): The pad id in the old layout.

    Returns:
        `list[int]`: `old_ids[new_id]`, a permutation of `range(vocab_size)` ending with `pad_id`.
    """
    if not 0 <= pad_id < vocab_size:
        raise ValueError(f"pad_id must be in [0, {vocab_size}), got {pad_id}")
    return [i for i in range(vocab_size) if i != pad_id] + [pad_id]


def relayout_tokenizer(tokenizer: PreTrainedTokenizerFast, old_ids: list[int]) -> PreTrainedTokenizerFast:
    """
    Returns a copy of a Unigram or BPE/WordLevel fast tokenizer whose ids are permuted by `old_ids`.

    Only the id of each piece changes: the pieces, their scores, the normaliser, the pre-tokenizer and the decoder are
    kept, so encoding gives the same pieces (mapped to new ids) and decoding the same strings.

    Args:
        tokenizer (`PreTrainedTokenizerFast`): The tokenizer in the old layout.
        old_ids (`list[int]`): `old_ids[new_id]`, e.g. from `pad_last_permutation`.
    """
    if sorted(old_ids) != list(range(len(tokenizer))):
        raise ValueError(f"old_ids must be a permutation of range({len(tokenizer)}), the tokenizer's size")
    new_id = {old: new for new, old in enumerate(old_ids)}
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec["model"]
    if model["type"] == "Unigram":
        model["vocab"] = [model["vocab"][old] for old in old_ids]
        if model.get("unk_id") is not None:
            model["unk_id"] = new_id[model["unk_id"]]
    elif model["type"] in ("BPE", "WordLevel"):
        model["vocab"] = {piece: new_id[old] for piece, old in model["vocab"].items()}
    else:
        raise ValueError(f"re-laying a {model['type']} tokenizer is not supported (Unigram, BPE or WordLevel)")
    for added in spec.get("added_tokens", []):
        added["id"] = new_id[added["id"]]
    spec["added_tokens"] = sorted(spec.get("added_tokens", []), key=lambda added: added["id"])
    processor = spec.get("post_processor") or {}
    for special in processor.get("special_tokens", {}).values():
        special["ids"] = [new_id[old] for old in special["ids"]]
    backend = Tokenizer.from_str(json.dumps(spec))
    relaid = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=tokenizer.pad_token,
        eos_token=tokenizer.eos_token,
        unk_token=tokenizer.unk_token,
    )
    relaid.model_max_length = tokenizer.model_max_length
    return relaid


@torch.no_grad()
def relayout_marian_model(model: MarianMTModel, old_ids: list[int], tokenizer: PreTrainedTokenizerFast) -> None:
    """
    Permutes a `MarianMTModel`'s vocabulary rows in place to the layout of `tokenizer` and zeroes the pad row.

    The shared embedding, the LM head (when not tied to it) and `final_logits_bias` are permuted, so the logits are
    the same up to the permutation, except where `<pad>`'s row matters: it is zeroed, as OPUS-MT's converter assumes,
    and the decoder starts from it, so the model's outputs change and it needs training afterwards. The config's and
    generation config's special ids are taken from `tokenizer`, and the generation config also gets OPUS-MT's
    settings: `bad_words_ids=[[pad]]` and `forced_eos_token_id` = EOS.

    Args:
        model (`MarianMTModel`): A model with shared encoder and decoder vocabularies
            (`share_encoder_decoder_embeddings=True`), its embeddings and LM head tied or not.
        old_ids (`list[int]`): `old_ids[new_id]`.
        tokenizer (`PreTrainedTokenizerFast`): The re-laid tokenizer (from `relayout_tokenizer`).
    """
    if not model.config.share_encoder_decoder_embeddings:
        raise ValueError("relayout_marian_model needs shared encoder/decoder embeddings")
    index = torch.tensor(old_ids, device=model.final_logits_bias.device)
    inputs = [model.model.shared, model.model.encoder.embed_tokens, model.model.decoder.embed_tokens]
    vocabulary_rows = {}  # every distinct weight indexed by token id (tied ones are one tensor), permuted once
    for module in (*inputs, model.get_output_embeddings()):
        vocabulary_rows.setdefault(module.weight.data_ptr(), module.weight)
    for weight in vocabulary_rows.values():
        weight.copy_(weight[index])
    model.final_logits_bias.copy_(model.final_logits_bias[:, index])
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    for embedding in inputs:
        embedding.weight[pad].zero_()
        embedding.padding_idx = pad
    for config in (model.config, model.generation_config):
        config.pad_token_id = pad
        config.eos_token_id = eos
        config.decoder_start_token_id = pad
        config.forced_eos_token_id = eos
    model.generation_config.bad_words_ids = [[pad]]


@torch.no_grad()
def relayout_spec_drafter(drafter: SpecDrafterModel, old_ids: list[int], tokenizer: PreTrainedTokenizerFast) -> None:
    """
    Permutes a `SpecDrafterModel`'s vocabulary in place to the layout of `tokenizer`, so that it can draft for the
    re-laid verifier (e.g. to start a new verifier's drafter from a trained one).

    The input embedding rows and, for a full-vocabulary head, the LM head rows and `final_logits_bias` are permuted;
    a reduced head keeps its rows and has its `draft_vocab_ids` mapped to the new ids. Unlike the verifier, no row is
    zeroed: the drafter's scores for permuted inputs are exactly its old scores, permuted. Every special id of its
    config (and of its own encoder's config, and that encoder's `padding_idx`) follows the permutation.

    Args:
        drafter (`SpecDrafterModel`): A drafter of the old layout.
        old_ids (`list[int]`): `old_ids[new_id]`, e.g. from `pad_last_permutation`.
        tokenizer (`PreTrainedTokenizerFast`): The re-laid tokenizer (from `relayout_tokenizer`): its pad and EOS ids
            must be where the permutation moves the drafter's.
    """
    if sorted(old_ids) != list(range(drafter.config.vocab_size)):
        raise ValueError(
            f"old_ids must be a permutation of range({drafter.config.vocab_size}), the drafter's vocabulary"
        )
    new_ids = {old: new for new, old in enumerate(old_ids)}
    for name in ("pad_token_id", "eos_token_id"):
        moved = new_ids.get(getattr(drafter.config, name))
        if moved != getattr(tokenizer, name):
            raise ValueError(
                f"tokenizer has {name} {getattr(tokenizer, name)}, but the permutation moves the drafter's "
                f"{getattr(drafter.config, name)} to {moved}: pass the re-laid tokenizer (relayout_tokenizer)"
            )
    index = torch.tensor(old_ids, device=drafter.shared.weight.device)
    vocabulary_rows = {drafter.shared.weight.data_ptr(): drafter.shared.weight}
    if drafter.draft_vocab_ids is None:
        vocabulary_rows.setdefault(drafter.lm_head.weight.data_ptr(), drafter.lm_head.weight)
        drafter.final_logits_bias.copy_(drafter.final_logits_bias[:, index])
    else:
        new_id = torch.empty_like(index)
        new_id[index] = torch.arange(len(old_ids), device=index.device)
        drafter.draft_vocab_ids.copy_(new_id[drafter.draft_vocab_ids.to(index.device)])
    for weight in vocabulary_rows.values():
        weight.copy_(weight[index])
    encoder_config = drafter.config.encoder_config or {}  # a nested dict: the family encoder's own config
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id"):
        if isinstance(getattr(drafter.config, name, None), int):
            setattr(drafter.config, name, new_ids[getattr(drafter.config, name)])
        if isinstance(encoder_config.get(name), int):
            encoder_config[name] = new_ids[encoder_config[name]]
    embed_tokens = getattr(drafter.encoder, "embed_tokens", None)
    if embed_tokens is not None and embed_tokens.padding_idx is not None:
        embed_tokens.padding_idx = new_ids[embed_tokens.padding_idx]


__all__ = ["pad_last_permutation", "relayout_marian_model", "relayout_spec_drafter", "relayout_tokenizer"]
