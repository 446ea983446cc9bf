"""Speculative decoding inside ``generate()``: the `custom_generate` callable and the opt-in on one model instance.

This module reads more of transformers' generation internals than any other: the arguments `generate()` passes to a
callable `custom_generate`, the `streamer` it keeps to itself, its prepared special-token tensors and placeholders, its
criteria and cache classes (docs/DESIGN.md, "Modules", lists every module that does, for a transformers upgrade). The
loop itself lives in `speculative_loop.py`, drafting with a `SpecDrafterModel` in `spec_drafter_adapter.py`, the
acceptance rules in `specdec_hf.acceptance`.
"""

from __future__ import annotations

import inspect
import operator
import sys
import types
import weakref
from typing import Any

import torch
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.logits_process import LogitsProcessorList, SynthIDTextWatermarkLogitsProcessor
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.utils import GenerationMixin
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from transformers.integrations.fsdp import is_fsdp_managed_module
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from ..acceptance import validate_acceptance_arguments
from ..drafting import validate_drafter
from ..models.verifier_conversion import check_verifier_state_layers
from .aligned_rows import needs_aligned_rows, pads_finished_rows
from .draft_length import AUTO, DraftLengthSchedule
from .loop_state import SpeculativeLoopConfig
from .outputs import SpeculativeGenerateOutput
from .spec_drafter_adapter import SpecDrafterAdapter, as_drafter
from .speculative_loop import position_limit_of, run_speculative_loop
from .streamers import check_streamer, ended_once, ending_on_failure
from .wrapping_drafter import WrappingDrafter

__all__ = ["enable_speculative_decoding", "speculative_generate"]

_SPECULATIVE_ARGUMENTS = ("num_draft_tokens", "beta", "tau", "draft_confidence_threshold")


def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    drafter=None,
    num_draft_tokens: int | None = None,
    beta: int = 1,
    tau: float = 0.0,
    draft_confidence_threshold: float | None = None,
    inputs_tensor: torch.Tensor | None = None,
    token_streamer=None,
    stop_strings: str | list[str] | None = None,
    stop_strings_tokenizer=None,
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
        drafter (`Drafter`): A `SpecDrafterModel` (drafted with through `SpecDrafterAdapter`) or any object
            implementing `specdec_hf.Drafter`; required.
        num_draft_tokens (`int` or `"auto"`, *optional*): Drafted tokens per iteration (k); defaults to the drafter's
            `num_draft_tokens` (for a `SpecDrafterModel`, `config.num_draft_tokens`, else `config.max_draft_tokens`;
            the shipped demo drafters say `"auto"`).
            `"auto"` chooses k at every iteration, from 0 (a plain verifier step, no drafter call) to the drafter's
            `max_draft_tokens` (its `num_draft_tokens` when it sets no limit), by what verifying k drafts costs on
            this machine (timed once per process, drafter, verifier and batch width) and how often drafts were accepted so
            far (`specdec_hf.generation.draft_length`). β=1 stays exactly greedy; as k follows the machine's
            timings, seeded sampling and the relaxed rule are not reproducible from run to run with `"auto"`.
        beta (`int`, *optional*, defaults to 1): Top-β candidate set; 1 gives exactly the greedy output.
        tau (`float`, *optional*, defaults to 0.0): Log-probability tolerance τ; only used when `beta > 1`.
        draft_confidence_threshold (`float`, *optional*): Adaptive draft length: verify, per row, only the leading
            drafts whose running product of the drafter's confidence (`DraftProposal.confidence()`) stays at or
            above this value, at least one. Saves verifying drafts that are unlikely to be accepted. The cut depends
            only on the drafter, so β=1 stays identical to greedy and sampling keeps its distribution (with β>1 the
            relaxed rule sees fewer drafts, which changes what it may accept). `None` (default) verifies all k;
            drafters that return neither `draft_confidence` nor `draft_logits` are always verified in full.
        inputs_tensor (`torch.Tensor`, *optional*): The encoder input (passed by `generate()`).
        token_streamer (`BaseStreamer`, *optional*): A streamer (`TextStreamer`, `TextIteratorStreamer`) that
            receives the tokens as they are accepted, batch size 1. `generate(streamer=...)` works too: transformers
            puts the prompt to it and then drops it before calling a `custom_generate` callable, so this method
            takes it from the `generate()` call it runs in (pass one of the two, not both).
        stop_strings (`str` or `list[str]`, *optional*): Stop each row after it writes one of these strings, as
            `generate(stop_strings=...)` does without a drafter; needs `stop_strings_tokenizer`.
        stop_strings_tokenizer (`PreTrainedTokenizerBase`, *optional*): The verifier's tokenizer, for `stop_strings`.
            transformers drops `generate(tokenizer=...)` before calling a `custom_generate` callable, so on this route
            pass it under this name; after `enable_speculative_decoding`, plain `tokenizer=` works.

    Returns:
        `torch.LongTensor` of shape `(batch_size, sequence_length)`, or, with `return_dict_in_generate=True`, a
        `SpeculativeGenerateOutput` (a `GenerateEncoderDecoderOutput` with `speculative_stats`).

    Raises:
        ValueError: for a decoder-only verifier, a missing or mismatching drafter, bad `beta`/`tau`/`num_draft_tokens`,
            and generation modes not supported with a drafter (beam search, contrastive search, assisted generation,
            static cache, ...).
    """
    given_to_generate, token_streamer = ended_once(_streamer_given_to_generate(model), token_streamer)
    with ending_on_failure(given_to_generate, token_streamer):
        for streamer in (given_to_generate, token_streamer):
            if streamer is not None:
                check_streamer(streamer)
        if given_to_generate is not None and token_streamer is not None:
            raise ValueError(
                "Two streamers: `streamer=` and `token_streamer=` were both passed; pass the streamer once, as "
                "`streamer=`."
            )
        # generate() has already put the prompt to a streamer passed to it as `streamer=`
        stream_prompt = given_to_generate is None
        if given_to_generate is not None:
            token_streamer = given_to_generate
        if not model.config.is_encoder_decoder:
            raise ValueError(
                f"Speculative decoding needs an encoder-decoder verifier; {type(model).__name__} is decoder-only. "
                "Use transformers' assisted generation (`assistant_model=`) for decoder-only models."
            )
        if drafter is None:
            raise ValueError(
                "`drafter` is required for speculative decoding: pass `drafter=SpecDrafterModel.from_pretrained(...)`."
            )
        vocab_size = _decoder_vocab_size(model)
        user_drafter = drafter
        drafter = as_drafter(drafter)
        validate_drafter(drafter, vocab_size)
        if num_draft_tokens is None:  # the drafter's default, "auto" or any integer type (a Python int below)
            num_draft_tokens = drafter.num_draft_tokens
            if num_draft_tokens != AUTO:
                num_draft_tokens = operator.index(num_draft_tokens)
        if isinstance(num_draft_tokens, str) and num_draft_tokens != AUTO:
            raise ValueError(
                f"`num_draft_tokens` must be an integer >= 1 (tokens drafted per iteration) or {AUTO!r} (chosen as "
                f"decoding runs), got {num_draft_tokens!r}."
            )
        adaptive = isinstance(num_draft_tokens, str)
        if adaptive:
            num_draft_tokens = _largest_draft_length(drafter)
        _check_speculative_arguments(model, drafter, num_draft_tokens, beta, tau, draft_confidence_threshold)
        if generation_config.do_sample and (beta != 1 or tau != 0):
            raise ValueError(
                f"`beta`/`tau` (got beta={beta}, tau={tau}) relax greedy verification; with `do_sample=True` speculative "
                "sampling is already exact and takes no relaxation: drop `beta`/`tau`, or set `do_sample=False`."
            )
        _check_generation_mode(generation_config, model, model_kwargs)
        _refuse_synthid_watermarking(logits_processor)
        if token_streamer is not None and input_ids.shape[0] > 1:
            raise ValueError(
                f"A streamer needs batch size 1 (got {input_ids.shape[0]} rows, `num_return_sequences` included): "
                "generate one sequence at a time, or drop the streamer."
            )

        encoder_outputs = _as_model_output(model_kwargs["encoder_outputs"])
        attention_mask = model_kwargs.get("attention_mask")
        cache = _fresh_or_checked_cache(model_kwargs.get("cache"), model.config)
        source_ids = _source_ids(inputs_tensor, input_ids.shape[0])
        if source_ids is None:
            _check_drafter_reads_no_source(drafter, inputs_tensor)
        stopping_criteria = _with_stop_strings(stopping_criteria, stop_strings, stop_strings_tokenizer)
        schedule = None
        drafting = True
        if adaptive:
            schedule = DraftLengthSchedule(
                model,
                _acceptance_key(user_drafter),
                num_draft_tokens,
                _rule_key(beta, tau, generation_config),
                input_ids.device,
            )
            drafting = schedule.drafts_this_call(
                input_ids.shape[0], _largest_timed_k(model, drafter, stopping_criteria, input_ids)
            )
            if drafting:
                schedule.start_drafting_call()
            else:
                schedule.start_plain_call()
        # a call without drafting runs the loop with no drafter, every iteration a plain step: unlike transformers' loop
        # it feeds only the rows still decoding once some finish (unless rows are kept aligned)
        loop_drafter, loop_k, drafter_state = None, 0, None
        if drafting:
            loop_drafter, loop_k = drafter, num_draft_tokens
            drafter_state = drafter.init_drafting_state(
                input_ids=source_ids,
                attention_mask=attention_mask,
                encoder_hidden_states=encoder_outputs.last_hidden_state,
            )
        loop_config = _loop_config(
            generation_config,
            logits_processor,
            stopping_criteria,
            input_ids.shape[0],
            vocab_size,
            loop_k,
            beta,
            tau,
            draft_confidence_threshold,
            input_ids.device,
        )
        result = run_speculative_loop(
            model,
            loop_drafter,
            drafter_state,
            input_ids,
            encoder_outputs,
            attention_mask,
            cache,
            logits_processor,
            stopping_criteria,
            loop_config,
            streamer=token_streamer,
            stream_prompt=stream_prompt,
            draft_length_schedule=schedule if drafting else None,
        )
        if schedule is not None:
            steps = result.sequences.shape[1] - input_ids.shape[1]
            if drafting:
                schedule.observe_drafting_call(steps)
            else:
                schedule.observe_plain_call(steps)
        if not generation_config.return_dict_in_generate:
            return result.sequences
        return SpeculativeGenerateOutput(
            sequences=result.sequences,
            scores=result.scores,
            logits=result.logits,
            encoder_attentions=encoder_outputs.get("attentions"),
            encoder_hidden_states=encoder_outputs.get("hidden_states"),
            # the cache holds rejected drafts and only the rows that finished last: not reusable, so not returned
            cache=None,
            speculative_stats=result.stats,
        )


# the body of `GenerationMixin.generate` under its decorators: the frame whose `streamer` argument is looked up
_GENERATE_CODE = inspect.unwrap(GenerationMixin.generate).__code__
# frames searched above speculative_generate for the generate() that calls it (a model's own generate() may wrap it)
_GENERATE_FRAME_SEARCH_DEPTH = 4


def _streamer_given_to_generate(model):
    """The `streamer=` passed to the `generate()` call that runs this method, or None.

    transformers puts the prompt to that streamer and then calls a `custom_generate` callable without it, so a
    `TextIteratorStreamer` would wait forever. No argument carries it here, so it is read from that call's own frame:
    the nearest caller running `GenerationMixin.generate` on `model` (a model class that overrides `generate()`
    reaches it through `super()`).
    """
    frame = sys._getframe(1)
    for _ in range(_GENERATE_FRAME_SEARCH_DEPTH):
        frame = frame.f_back
        if frame is None:
            return None
        if frame.f_code is _GENERATE_CODE and frame.f_locals.get("self") is model:
            # only a callable custom_generate is reached after generate() put the prompt (a Hub repo's name
            # returns before, handing the streamer over itself)
            return frame.f_locals.get("streamer") if callable(frame.f_locals.get("custom_generate")) else None
    return None


# per verifier: its decoder's vocabulary size and what it was read from (`_vocabulary_fields`)
_DECODER_VOCAB_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# where `get_text_config(decoder=True)` looks for a decoder's own config inside a composite one (the names of
# transformers' `PreTrainedConfig.get_text_config`; tests/generation/test_bad_input.py compares the sizes read on
# every family of the suite, none of which nests its decoder's config)
_DECODER_CONFIG_NAMES = ("decoder", "generator", "text_config")


def _decoder_vocab_size(model) -> int:
    """`model.config.get_text_config(decoder=True).vocab_size`, read again only when a field it comes from changed.

    On a flat encoder-decoder config (BART, T5, Marian, ...) `get_text_config` deep-copies the whole config to rename
    its `decoder_*` fields (~0.13 ms: a fraction of a percent of a short call, at every call)."""
    fields = _vocabulary_fields(model.config)
    known = _DECODER_VOCAB_SIZES.get(model)
    if known is None or known[0] != fields:
        known = (fields, model.config.get_text_config(decoder=True).vocab_size)
        _DECODER_VOCAB_SIZES[model] = known
    return known[1]


def _vocabulary_fields(config) -> tuple:
    """What a config's decoder vocabulary size is read from: the config object, its `vocab_size` and
    `decoder_vocab_size`, and any decoder config nested in it with its `vocab_size`."""
    fields = [id(config), getattr(config, "vocab_size", None), getattr(config, "decoder_vocab_size", None)]
    for name in _DECODER_CONFIG_NAMES:
        nested = getattr(config, name, None)
        fields += [id(nested), getattr(nested, "vocab_size", None)]
    return tuple(fields)


def _acceptance_key(drafter):
    """What identifies a drafter across `generate()` calls: wrappers that pass its proposals through (a timer) and
    the per-call adapter of a `SpecDrafterModel` unwrapped to the model."""
    while isinstance(drafter, WrappingDrafter) and drafter.passes_proposals_through:
        drafter = drafter.drafter
    return drafter.model if isinstance(drafter, SpecDrafterAdapter) else drafter


def _rule_key(beta: int, tau: float, generation_config: GenerationConfig) -> tuple:
    """What changes how often drafts are accepted besides the drafter: the relaxed rule, or sampling's settings."""
    if not generation_config.do_sample:
        return ("greedy", beta, float(tau))
    config = generation_config
    return ("sample", config.temperature, config.top_k, config.top_p, config.min_p, config.typical_p)


def _largest_draft_length(drafter) -> int:
    """The largest k a chosen draft length may take: the drafter's `max_draft_tokens` (its mask slots), or its
    `num_draft_tokens` when it sets no limit."""
    limit = getattr(drafter, "max_draft_tokens", None)
    return operator.index(limit if limit is not None else drafter.num_draft_tokens)


def _check_speculative_arguments(
    model, drafter, num_draft_tokens: int, beta: int, tau: float, draft_confidence_threshold: float | None
) -> None:
    """Check k, β, τ and the confidence threshold against their ranges and the drafter's limits."""
    validate_acceptance_arguments(beta, tau, num_draft_tokens)
    check_verifier_state_layers(getattr(drafter, "verifier_state_layers", None), model)
    max_draft_tokens = getattr(drafter, "max_draft_tokens", None)
    if max_draft_tokens is not None and num_draft_tokens > max_draft_tokens:
        why, more = "", ""
        if isinstance(drafter, SpecDrafterAdapter):
            why, more = ": one learned query per drafted position", " or train a drafter with more"
        raise ValueError(
            f"`num_draft_tokens` must be at most the drafter's {max_draft_tokens} (its `max_draft_tokens`{why}), got "
            f"{num_draft_tokens}: lower `num_draft_tokens`{more}."
        )
    if draft_confidence_threshold is not None and (
        isinstance(draft_confidence_threshold, bool)
        or not isinstance(draft_confidence_threshold, (int, float))
        or not 0.0 <= draft_confidence_threshold <= 1.0
    ):
        raise ValueError(
            "`draft_confidence_threshold` must be a probability in [0, 1] (or None to verify every draft), got "
            f"{draft_confidence_threshold!r}."
        )


def _loop_config(
    generation_config: GenerationConfig,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    batch_size: int,
    vocab_size: int,
    num_draft_tokens: int,
    beta: int,
    tau: float,
    draft_confidence_threshold: float | None,
    device: torch.device,
) -> SpeculativeLoopConfig:
    """The loop's settings, from the (checked) arguments and what `generate()` prepared."""
    max_length, eos = _length_and_eos_from_criteria(stopping_criteria, generation_config)
    pad = generation_config._pad_token_tensor
    pad_token_id = int(pad) if pad is not None else (int(eos[0]) if eos is not None else 0)
    return_dict = generation_config.return_dict_in_generate
    output_scores = bool(return_dict and generation_config.output_scores)
    output_logits = bool(return_dict and generation_config.output_logits)
    pad_finished_rows = pads_finished_rows(stopping_criteria)
    return SpeculativeLoopConfig(
        num_draft_tokens=num_draft_tokens,
        beta=beta,
        tau=float(tau),
        max_length=max_length,
        pad_token_id=pad_token_id,
        vocab_size=vocab_size,
        eos_token_ids=None if eos is None else eos.to(device),
        do_sample=bool(generation_config.do_sample),
        output_scores=output_scores,
        output_logits=output_logits,
        confidence_threshold=None if draft_confidence_threshold is None else float(draft_confidence_threshold),
        aligned_rows=needs_aligned_rows(
            logits_processor, stopping_criteria, batch_size, output_scores or output_logits, pad_finished_rows
        ),
        pad_finished_rows=pad_finished_rows,
    )


def _as_model_output(encoder_outputs) -> ModelOutput:
    """`encoder_outputs` with named fields: a plain tuple `(last_hidden_state, hidden_states, attentions)` is taken as
    the verifier's forward takes it."""
    if isinstance(encoder_outputs, (tuple, list)):
        return BaseModelOutput(*encoder_outputs[:3])
    return encoder_outputs


def _check_drafter_reads_no_source(drafter, inputs_tensor: torch.Tensor | None) -> None:
    """A `SpecDrafterModel` with its own encoder reads the source ids: say which input `generate()` got instead."""
    if not isinstance(drafter, SpecDrafterAdapter) or drafter.model.encoder is None:
        return
    if inputs_tensor is not None and inputs_tensor.is_floating_point():
        given, fix = "`inputs_embeds`", "pass `input_ids` instead of `inputs_embeds`"
    else:
        given, fix = (
            "`encoder_outputs` without `input_ids`",
            "pass the source `input_ids` along with `encoder_outputs`",
        )
    raise ValueError(
        f"The drafter runs its own encoder and needs the source `input_ids`, but `generate()` was given {given}: "
        f"{fix}, or use a drafter built with `use_verifier_encoder=True` (it reads the verifier's encoder output)."
    )


def _with_stop_strings(
    stopping_criteria: StoppingCriteriaList, stop_strings: str | list[str] | None, tokenizer
) -> StoppingCriteriaList:
    """The criteria with a `StopStringCriteria` for `stop_strings` added, as `generate()` adds it without a drafter."""
    if stop_strings is None:
        return stopping_criteria
    if tokenizer is None:
        raise ValueError(
            "`stop_strings` need the verifier's tokenizer. With `custom_generate=speculative_generate` pass it as "
            "`stop_strings_tokenizer=tokenizer` (transformers drops `tokenizer=` before calling a `custom_generate` "
            "callable); after `enable_speculative_decoding(verifier)`, `generate(..., drafter=drafter, "
            "stop_strings=[...], tokenizer=tokenizer)` works; or pass `stopping_criteria=[StopStringCriteria("
            "tokenizer, [...])]`."
        )
    return StoppingCriteriaList([*stopping_criteria, StopStringCriteria(tokenizer, stop_strings)])


def _source_ids(inputs_tensor: torch.Tensor | None, batch_size: int) -> torch.LongTensor | None:
    """The source ids for the drafter, aligned with the (possibly expanded) batch; `None` when there are none."""
    if inputs_tensor is None or inputs_tensor.is_floating_point():
        return None  # `inputs_embeds`
    if bool((inputs_tensor == -100).all()):
        return None  # generate()'s placeholder when the caller passed `encoder_outputs`
    if inputs_tensor.shape[0] != batch_size:
        # generate() expands the encoder output and mask for `num_return_sequences`, not `inputs_tensor`
        inputs_tensor = inputs_tensor.repeat_interleave(batch_size // inputs_tensor.shape[0], dim=0)
    return inputs_tensor


def _largest_timed_k(model, drafter, stopping_criteria: StoppingCriteriaList, input_ids: torch.LongTensor) -> int:
    """The largest k an iteration of this call can take where the schedule times it: from the second iteration on
    (the first also projects the source, and while a cost table is calibrated it takes a plain step), after at least
    one token was committed, within the length limit and the learned positions (`_iteration_k`)."""
    prompt_length = input_ids.shape[1]
    largest = _max_length_from_criteria(stopping_criteria) - (prompt_length + 1) - 1
    position_limit = position_limit_of(model, drafter)
    if position_limit is not None:
        largest = min(largest, position_limit - (prompt_length + 1))
    return largest


def _max_length_from_criteria(stopping_criteria: StoppingCriteriaList) -> int:
    """The max length the criteria enforce (a user's criteria replace generate()'s defaults)."""
    lengths = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
    if not lengths:
        raise ValueError("Speculative decoding needs a length limit: pass `max_new_tokens` or `max_length`.")
    return min(lengths)


def _length_and_eos_from_criteria(
    stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig
) -> tuple[int, torch.LongTensor | None]:
    """The max length and EOS ids the criteria enforce (a user's criteria replace generate()'s defaults)."""
    max_length = _max_length_from_criteria(stopping_criteria)
    eos_lists = [c.eos_token_id.flatten() for c in stopping_criteria if isinstance(c, EosTokenCriteria)]
    eos = torch.cat(eos_lists).unique() if eos_lists else None
    return max_length, eos


def _beam_search_refusal(num_beams: int, config_num_beams: int | None) -> str:
    """Why `generate(drafter=..., num_beams>1)` is refused, and the two settings to use instead.

    Args:
        num_beams (`int`): The beams asked for in this call (after generate() merged its arguments into the config).
        config_num_beams (`int`, *optional*): The verifier's own `generation_config.num_beams`; when it is the
            same, the message says that the checkpoint's config asked for beam search.
    """
    origin = " (the verifier's own generation_config asks for it)" if config_num_beams == num_beams else ""
    return (
        f"Beam search (`num_beams={num_beams}`{origin}) does not run with a `drafter`. Pass `num_beams=1` and "
        "choose: `beta=1` (the default) gives exactly greedy decoding's output, faster. The setting meant for "
        "beam-search quality is the relaxed rule (`beta=5, tau=3, num_draft_tokens=8`) with a drafter distilled from "
        "the verifier's beam outputs (`python -m specdec_hf.distillation --num_beams 5 ...`); on the project's demo "
        "pair it was measured below greedy's BLEU (the README's 'Which setting for which goal'). For beam quality "
        "today, drop `drafter` and run plain beam search."
    )


def _check_generation_mode(generation_config: GenerationConfig, model, model_kwargs: dict[str, Any]) -> None:
    """Reject what the speculative loop does not implement, rather than silently decoding something else."""
    if generation_config.num_beams > 1:
        raise ValueError(_beam_search_refusal(generation_config.num_beams, model.generation_config.num_beams))
    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        raise ValueError(
            f"The generation mode {mode.value!r} (from e.g. `penalty_alpha`, `prompt_lookup_num_tokens`, "
            "`dola_layers`) cannot run with a `drafter`, which does greedy decoding or sampling: drop those options "
            "or drop `drafter`."
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
    # transformers does not hand `synced_gpus` to a custom_generate callable: detect the setting it would imply
    if (is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model)) and torch.distributed.is_initialized():
        if torch.distributed.get_world_size() > 1:
            raise ValueError(
                "Speculative decoding does not synchronise ranks (DeepSpeed ZeRO-3 / FSDP): generate on each rank "
                "with an unsharded model."
            )
    if model_kwargs.get("decoder_attention_mask") is not None:
        raise ValueError(
            "`decoder_attention_mask` is not supported with a `drafter`: pass an unpadded decoder prompt."
        )


def _refuse_synthid_watermarking(logits_processor: LogitsProcessorList) -> None:
    """SynthID watermarking's processor keeps a state that takes each call for the next step of the whole batch; the
    loop scores several positions per row, discards the rejected ones and drops rows as they finish."""
    if any(isinstance(processor, SynthIDTextWatermarkLogitsProcessor) for processor in logits_processor):
        raise ValueError(
            "SynthID watermarking (`watermarking_config=SynthIDTextWatermarkingConfig(...)`, or its processor in "
            "`logits_processor`) keeps a state that advances by one token per call, which speculative decoding cannot "
            "give it (it scores several positions per verifier pass and discards the rejected ones): generate "
            "without `drafter` to watermark, or drop the watermarking."
        )


def _fresh_or_checked_cache(cache, config) -> EncoderDecoderCache:
    """The verifier's cache: the one `generate()` prepared if it can be cropped, else a new dynamic one (for the
    decoder of the model whose `config` is given)."""
    if cache is None:
        decoder_config = config.get_text_config(decoder=True)
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
    if getattr(model.generate, "__func__", None) is _generate_with_optional_drafter:
        return model
    # a bound method (not a closure over the old one) so that copies of the model call their own generate()
    model.generate = types.MethodType(_generate_with_optional_drafter, model)
    return model


def _generate_with_optional_drafter(self, *args, drafter=None, **kwargs):
    """`generate()` of a model after `enable_speculative_decoding`: speculative with `drafter`, plain without."""
    plain_generate = type(self).generate
    if drafter is None:
        given = [name for name in _SPECULATIVE_ARGUMENTS if name in kwargs]
        if given:
            with ending_on_failure(*ended_once(kwargs.get("streamer"))):
                raise ValueError(f"{', '.join(given)} only apply with a `drafter`: pass `drafter=` or drop them.")
        return plain_generate(self, *args, **kwargs)
    # transformers drops `streamer` before calling a custom_generate callable (and never ends it when generate()
    # fails): it travels as our `token_streamer`, ended here if the call fails before speculative_generate does
    streamer, token_streamer = ended_once(kwargs.pop("streamer", None), kwargs.pop("token_streamer", None))
    with ending_on_failure(streamer, token_streamer):
        if streamer is not None and token_streamer is not None:
            raise ValueError("`streamer=` and `token_streamer=` were both passed: pass it once, as `streamer=`.")
        custom_generate = kwargs.pop("custom_generate", None)
        if custom_generate is not None and custom_generate is not speculative_generate:
            raise ValueError(
                "`drafter` runs speculative decoding, which is itself a `custom_generate` method: pass "
                "`custom_generate=speculative_generate` or none, not another method."
            )
        if kwargs.get("assistant_model") is not None:
            raise ValueError("`assistant_model` and `drafter` are two drafting methods: pass only one of them.")
        # transformers drops `tokenizer` too: handed over under our own name
        tokenizer = kwargs.pop("tokenizer", None)
        if tokenizer is not None:
            if kwargs.get("stop_strings_tokenizer") is not None:
                raise ValueError(
                    "`tokenizer=` and `stop_strings_tokenizer=` were both passed: pass it once, as `tokenizer=`."
                )
            kwargs["stop_strings_tokenizer"] = tokenizer
        return plain_generate(
            self,
            *args,
            custom_generate=speculative_generate,
            drafter=drafter,
            token_streamer=streamer if streamer is not None else token_streamer,
            **kwargs,
        )
