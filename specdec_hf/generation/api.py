"""Speculative decoding inside ``generate()``: the `custom_generate` callable and the opt-in on one model instance.

This is the one module that reads transformers' generation internals (the arguments `generate()` passes to a
callable `custom_generate`, its prepared special-token tensors, its cache classes), so a transformers upgrade is a
change here. The loop itself lives in `speculative_loop.py`; the acceptance rule in `specdec_hf.acceptance`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList, PrefixConstrainedLogitsProcessor
from transformers.generation.stopping_criteria import StoppingCriteriaList

from ..acceptance import validate_acceptance_arguments
from ..drafting import validate_drafter
from .outputs import SpeculativeGenerateOutput
from .speculative_loop import SpeculativeLoopConfig, run_speculative_loop

__all__ = ["enable_speculative_decoding", "speculative_generate"]

_SPECULATIVE_ARGUMENTS = ("block_size", "beta", "tau")


def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    drafter=None,
    block_size: int | None = None,
    beta: int = 1,
    tau: float = 0.0,
    inputs_tensor: torch.Tensor | None = None,
    token_streamer=None,
    synced_gpus: bool = False,
    **model_kwargs,
) -> torch.LongTensor | SpeculativeGenerateOutput:
    """Speculative Decoding (Xia et al., 2023, arXiv 2203.16487) as a `generate()` decoding method.

    Use it as ``verifier.generate(**inputs, custom_generate=speculative_generate, drafter=drafter)``:
    `generate()` prepares everything (encoder pass, decoder start tokens, logits processors, stopping criteria,
    lengths) and hands over to this function, which drafts k tokens per iteration with `drafter`, verifies them in
    one decoder forward of `model`, and keeps those that pass the top-β/τ rule.

    Args:
        model (`PreTrainedModel`): The encoder-decoder verifier (passed by `generate()`).
        input_ids (`torch.LongTensor` of shape `(batch_size, prompt_length)`): Decoder prompt (passed by `generate()`).
        logits_processor, stopping_criteria, generation_config: Prepared by `generate()`.
        drafter (`Drafter`): A `SpecDrafterModel` or any object implementing `specdec_hf.Drafter`; required.
        block_size (`int`, *optional*): Drafted tokens per iteration (k); defaults to `drafter.block_size`.
        beta (`int`, *optional*, defaults to 1): Top-β candidate set; 1 gives exactly the greedy output.
        tau (`float`, *optional*, defaults to 0.0): Log-probability tolerance τ; only used when `beta > 1`.
        inputs_tensor (`torch.Tensor`, *optional*): The encoder input (passed by `generate()`).
        token_streamer (`BaseStreamer`, *optional*): A streamer (`TextStreamer`, `TextIteratorStreamer`) that
            receives the tokens as they are accepted, batch size 1. transformers drops `generate(streamer=...)`
            before calling a `custom_generate` callable, so on this route pass it as `token_streamer=`; after
            `enable_speculative_decoding`, plain `streamer=` works.

    Returns:
        `torch.LongTensor` of shape `(batch_size, sequence_length)`, or, with `return_dict_in_generate=True`, a
        `SpeculativeGenerateOutput` (a `GenerateEncoderDecoderOutput` with `speculative_stats`).

    Raises:
        ValueError: for a decoder-only verifier, a missing or mismatching drafter, bad `beta`/`tau`/`block_size`, and
            generation modes not supported with a drafter (beam search, sampling, static cache, ...).
    """
    if not model.config.is_encoder_decoder:
        raise ValueError(
            f"Speculative decoding needs an encoder-decoder verifier; {type(model).__name__} is decoder-only. "
            "Use transformers' assisted generation (`assistant_model=`) for decoder-only models."
        )
    if drafter is None:
        raise ValueError(
            "`drafter` is required for speculative decoding: pass `drafter=SpecDrafterModel.from_pretrained(...)`."
        )
    validate_drafter(drafter, model.config.get_text_config(decoder=True).vocab_size)
    block_size = drafter.block_size if block_size is None else block_size
    validate_acceptance_arguments(beta, tau, block_size)
    if generation_config.do_sample and (beta != 1 or tau != 0):
        raise ValueError(
            f"`beta`/`tau` (got beta={beta}, tau={tau}) relax greedy verification; with `do_sample=True` speculative "
            "sampling is already exact and takes no relaxation: drop `beta`/`tau`, or set `do_sample=False`."
        )
    _check_generation_mode(generation_config, logits_processor, input_ids.shape[0], synced_gpus, model_kwargs)
    if token_streamer is not None and input_ids.shape[0] > 1:
        raise ValueError(
            f"A streamer needs batch size 1 (got {input_ids.shape[0]} rows, `num_return_sequences` included): "
            "generate one sequence at a time, or drop the streamer."
        )

    encoder_outputs = model_kwargs["encoder_outputs"]
    attention_mask = model_kwargs.get("attention_mask")
    cache = _fresh_or_checked_cache(model_kwargs.get("cache"), model)
    source_ids = inputs_tensor if inputs_tensor is not None and not inputs_tensor.is_floating_point() else None
    drafter_state = drafter.init_drafting_state(
        input_ids=source_ids, attention_mask=attention_mask, encoder_hidden_states=encoder_outputs.last_hidden_state
    )

    eos = generation_config._eos_token_tensor
    pad = generation_config._pad_token_tensor
    pad_token_id = int(pad) if pad is not None else (int(eos.flatten()[0]) if eos is not None else 0)
    loop_config = SpeculativeLoopConfig(
        block_size=block_size,
        beta=beta,
        tau=float(tau),
        max_length=generation_config.max_length,
        pad_token_id=pad_token_id,
        eos_token_ids=eos.flatten().to(input_ids.device) if eos is not None else None,
        do_sample=bool(generation_config.do_sample),
        output_scores=bool(generation_config.return_dict_in_generate and generation_config.output_scores),
        output_logits=bool(generation_config.return_dict_in_generate and generation_config.output_logits),
    )
    result = run_speculative_loop(
        model,
        drafter,
        drafter_state,
        input_ids,
        encoder_outputs,
        attention_mask,
        cache,
        logits_processor,
        stopping_criteria,
        loop_config,
        streamer=token_streamer,
    )
    if not generation_config.return_dict_in_generate:
        return result.sequences
    return SpeculativeGenerateOutput(
        sequences=result.sequences,
        scores=result.scores,
        logits=result.logits,
        encoder_attentions=encoder_outputs.get("attentions"),
        encoder_hidden_states=encoder_outputs.get("hidden_states"),
        cache=cache,
        speculative_stats=result.stats,
    )


def _check_generation_mode(
    generation_config: GenerationConfig,
    logits_processor: LogitsProcessorList,
    batch_size: int,
    synced_gpus: bool,
    model_kwargs: dict[str, Any],
) -> None:
    """Reject what the speculative loop does not implement, rather than silently decoding something else."""
    if generation_config.num_beams > 1:
        raise ValueError(
            f"Beam search (`num_beams={generation_config.num_beams}`) is not supported with a `drafter`: "
            "set `num_beams=1`, or drop `drafter` to run plain beam search."
        )
    if generation_config.cache_implementation not in (None, "dynamic"):
        raise ValueError(
            f"`cache_implementation={generation_config.cache_implementation!r}` cannot be cropped after rejected "
            "drafts; speculative decoding needs the default dynamic cache: drop `cache_implementation`."
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError(
            "`output_attentions` / `output_hidden_states` are not supported with a `drafter`: drop them, or generate "
            "without `drafter`."
        )
    if synced_gpus:
        raise ValueError("`synced_gpus=True` is not supported with a `drafter`; run speculative decoding per process.")
    if model_kwargs.get("decoder_attention_mask") is not None:
        raise ValueError(
            "`decoder_attention_mask` is not supported with a `drafter`: pass an unpadded decoder prompt."
        )
    if batch_size > 1 and any(isinstance(p, PrefixConstrainedLogitsProcessor) for p in logits_processor):
        raise ValueError(
            "`prefix_allowed_tokens_fn` reads the batch index, which the per-row verification of a `drafter` "
            "changes: use batch size 1 with `prefix_allowed_tokens_fn`."
        )


def _fresh_or_checked_cache(cache, model) -> EncoderDecoderCache:
    """The verifier's cache: the one `generate()` prepared if it can be cropped, else a new dynamic one."""
    if cache is None:
        decoder_config = model.config.get_text_config(decoder=True)
        return EncoderDecoderCache(DynamicCache(config=decoder_config), DynamicCache(config=decoder_config))
    if not (
        isinstance(cache, EncoderDecoderCache)
        and isinstance(cache.self_attention_cache, DynamicCache)
        and cache.is_croppable
    ):
        raise ValueError(
            f"The verifier cache ({type(cache).__name__}) cannot be cropped after rejected drafts; speculative "
            "decoding needs an `EncoderDecoderCache` of `DynamicCache`s: do not pass `cache=` (or pass such a cache)."
        )
    if cache.get_seq_length() > 0:
        raise ValueError("`cache` must be empty when generating with a `drafter`: do not reuse a filled cache.")
    return cache


def enable_speculative_decoding(model):
    """Make ``model.generate(..., drafter=drafter)`` run speculative decoding, on this instance only.

    Calls without `drafter` go to the model's usual `generate()` unchanged. Nothing is patched at class level:
    other instances of the same class are not affected. Calling it twice is harmless.

    Args:
        model (`PreTrainedModel`): An encoder-decoder model (BART, T5, Marian, mBART, Pegasus, ...).

    Returns:
        The same `model`, for chaining.

    Example:

    ```python
    >>> enable_speculative_decoding(verifier)
    >>> out = verifier.generate(**inputs, drafter=drafter, beta=3, tau=1.0, max_new_tokens=64)
    ```
    """
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            f"Speculative decoding needs an encoder-decoder model; {type(model).__name__} is decoder-only. "
            "Use transformers' assisted generation (`assistant_model=`) for decoder-only models."
        )
    if getattr(model.generate, "speculative_decoding_enabled", False):
        return model
    plain_generate = model.generate

    @functools.wraps(plain_generate)
    def generate(*args, drafter=None, **kwargs):
        if drafter is None:
            given = [name for name in _SPECULATIVE_ARGUMENTS if name in kwargs]
            if given:
                raise ValueError(f"{', '.join(given)} only apply with a `drafter`: pass `drafter=` or drop them.")
            return plain_generate(*args, **kwargs)
        if kwargs.get("custom_generate") is not None:
            raise ValueError("`custom_generate` cannot be combined with `drafter`: pass only one of them.")
        # transformers drops `streamer` before calling a custom_generate callable: hand it over under our own name
        streamer = kwargs.pop("streamer", None)
        if streamer is not None:
            kwargs["token_streamer"] = streamer
        if kwargs.get("assistant_model") is not None:
            raise ValueError("`assistant_model` and `drafter` are two drafting methods: pass only one of them.")
        return plain_generate(*args, custom_generate=speculative_generate, drafter=drafter, **kwargs)

    generate.speculative_decoding_enabled = True
    model.generate = generate
    return model
