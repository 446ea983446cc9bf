"""The verify forward's prepared causal mask (`specdec_hf.generation.verifier_mask`): the masks transformers would
build (one table reused and grown), the same logits in float32 and bfloat16, where none is prepared, the loop passing
it, and β = 1 still equal to greedy under eager attention."""

from __future__ import annotations

import pytest
import torch
from conftest import build_verifier, make_source_batch
from oracle_drafters import OracleDrafter
from transformers import DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_causal_mask

from specdec_hf import speculative_generate
from specdec_hf.generation.verifier_mask import CausalMaskTable

GREEDY = dict(do_sample=False, num_beams=1)
# (cache length, tokens fed), in the order one table serves them: it starts at 128 positions, grows to 256 for the
# third and to 512 for the fourth, and serves the last from what it has
SHAPES = [(3, 5), (20, 11), (150, 5), (300, 9), (2, 3)]


def _verifier(family: str, implementation: str, dtype: torch.dtype = torch.float32):
    """A tiny verifier of `family` with the attention implementation `implementation` and room for 512 positions."""
    model = build_verifier(family, max_position_embeddings=512).to(dtype)
    model.set_attn_implementation(implementation)
    return model


def _filled_cache(model, batch_size: int, cache_length: int) -> EncoderDecoderCache:
    """A verifier cache holding `cache_length` positions of random keys and values."""
    config = model.get_decoder().config
    heads = config.decoder_attention_heads
    self_attention = DynamicCache(config=config)
    for layer in range(config.decoder_layers):
        keys = torch.randn(batch_size, heads, cache_length, config.d_model // heads)
        self_attention.update(keys, torch.randn_like(keys), layer)
    return EncoderDecoderCache(self_attention, DynamicCache(config=config))


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_one_table_serves_the_masks_transformers_builds(implementation):
    model = _verifier("marian", implementation)
    config = model.get_decoder().config
    table = CausalMaskTable(model)
    assert table.supported
    batch_size, sizes = 3, []
    for cache_length, num_fed in SHAPES:
        cache = _filled_cache(model, batch_size, cache_length)
        expected = create_causal_mask(
            config=config,
            inputs_embeds=torch.zeros(batch_size, num_fed, config.d_model),
            attention_mask=torch.ones(batch_size, cache_length + num_fed),
            cache=cache.self_attention_cache,
        )
        mask = table.mask(batch_size, cache_length, num_fed, torch.device("cpu"))
        assert mask.shape == expected.shape and mask.dtype == expected.dtype
        assert torch.equal(mask, expected)
        sizes.append(table.table.shape[-1])
    assert sizes == [128, 128, 256, 512, 512]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_forward_with_the_mask_gives_the_same_logits(family, implementation, dtype):
    model = _verifier(family, implementation, dtype)
    inputs = make_source_batch(2, pad_token_id=model.config.pad_token_id)
    table = CausalMaskTable(model)
    start = model.generation_config.decoder_start_token_id
    generator = torch.Generator().manual_seed(1)
    prompt = torch.cat([torch.full((2, 1), start), torch.randint(4, 90, (2, 6), generator=generator)], dim=1)
    fed = torch.randint(4, 90, (2, 5), generator=generator)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(**inputs)
        logits = []
        for use_table in (False, True):
            cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
            model(
                decoder_input_ids=prompt,
                encoder_outputs=encoder_outputs,
                attention_mask=inputs["attention_mask"],
                cache=cache,
                use_cache=True,
            )
            mask = table.mask(2, prompt.shape[1], fed.shape[1], fed.device) if use_table else None
            assert (mask is not None) == use_table
            output = model(
                decoder_input_ids=fed,
                decoder_attention_mask=mask,
                encoder_outputs=encoder_outputs,
                attention_mask=inputs["attention_mask"],
                cache=cache,
                use_cache=True,
            )
            logits.append(output.logits)
    assert torch.equal(logits[0], logits[1])


def test_no_mask_where_the_decoder_should_build_its_own():
    model = _verifier("bart", "sdpa")
    table = CausalMaskTable(model)
    cpu = torch.device("cpu")
    assert table.mask(1, 0, 5, cpu) is None  # an empty cache: the decoder may skip the mask
    assert table.mask(1, 7, 1, cpu) is None  # one token: likewise, as in a greedy step
    assert table.mask(1, 1020, 5, cpu) is None  # past the largest table
    assert table.mask(1, 7, 5, cpu) is not None
    flex = _verifier("bart", "sdpa")
    flex.get_decoder().config._attn_implementation = "flex_attention"
    sliding = _verifier("bart", "sdpa")
    sliding.get_decoder().config.sliding_window = 8
    other_family = _verifier("bart", "sdpa")
    other_family.config.model_type = "fsmt"  # a decoder that does not route its mask through create_causal_mask
    for model in (flex, sliding, other_family):
        table = CausalMaskTable(model)
        assert not table.supported and table.mask(1, 7, 5, cpu) is None


def test_eager_masks_are_in_the_verifier_dtype():
    for dtype in (torch.float32, torch.bfloat16):
        mask = CausalMaskTable(_verifier("bart", "eager", dtype)).mask(1, 4, 5, torch.device("cpu"))
        assert mask.dtype == dtype
        assert mask[0, 0, 0, 4].item() == 0 and mask[0, 0, 0, 5].item() == torch.finfo(dtype).min


def _verifier_whose_rows_stop_apart(family: str, inputs) -> torch.nn.Module:
    """A tiny verifier of `family` (the first seed that has one) with an EOS that no row emits in its first three
    steps and the rows first emit at different steps (or never): its rows stop at different iterations."""
    for seed in range(8):
        generated = build_verifier(family, seed=seed).generate(**inputs, **GREEDY, max_new_tokens=20)[:, 1:]
        for token in generated[:, 3:].flatten().tolist():
            steps = set()
            for row in generated:
                hits = (row == token).nonzero()
                steps.add(int(hits[0]) if hits.numel() else generated.shape[1])
            if min(steps) >= 3 and len(steps) > 1:
                return build_verifier(family, seed=seed, eos_token_id=token)
    raise AssertionError(f"no seed gives {family} rows that stop apart")


def test_the_loop_passes_the_mask_after_the_first_forward(family):
    inputs = make_source_batch(3, pad_token_id=build_verifier(family).config.pad_token_id)
    model = _verifier_whose_rows_stop_apart(family, inputs)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    fed = []  # (rows fed, mask) of every verify forward
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(
            (kwargs["decoder_input_ids"].shape[0], kwargs.get("decoder_attention_mask"))
        ),
        with_kwargs=True,
    )
    try:
        output = model.generate(
            **inputs,
            **GREEDY,
            max_new_tokens=20,
            custom_generate=speculative_generate,
            drafter=OracleDrafter(reference, model.config.vocab_size, 2, "half"),
        )
    finally:
        hook.remove()
    assert torch.equal(output, reference)
    # the first forward (empty cache) builds its own; so may the last if it feeds a single token
    assert fed[0][1] is None and len(fed) > 2
    assert all(mask is not None and mask.ndim == 4 and mask.shape[0] == rows for rows, mask in fed[1:-1])
    assert len({rows for rows, _ in fed}) > 1, "rows should finish at different iterations"


@pytest.mark.parametrize("batch_size", [1, 4])
def test_beta_one_equals_greedy_with_eager_attention(family, batch_size):
    model = _verifier(family, "eager")
    inputs = make_source_batch(batch_size, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    for accuracy in ("right", "half"):
        drafter = OracleDrafter(reference, model.config.vocab_size, 4, accuracy)
        output = model.generate(
            **inputs, **GREEDY, max_new_tokens=20, custom_generate=speculative_generate, drafter=drafter
        )
        assert torch.equal(output, reference)
