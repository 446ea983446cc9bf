"""Drafting with a `SpecDrafterModel` through `SpecDrafterAdapter`: shapes, agreement with the model's forward,
ragged batches, the causal prefix cache and `select_rows`, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from tiny_drafters import ATOL, NUM_DRAFT_TOKENS, propose_fresh, random_prefixes, tiny_drafter
from torch.overrides import TorchFunctionMode

from specdec_hf import SpecDrafterAdapter, SpecDrafterModel
from specdec_hf.drafting import Drafter, validate_drafter


@pytest.mark.parametrize("prefix_attention", ["bidirectional", "causal"])
def test_propose_shapes_and_argmax(prefix_attention):
    drafter = tiny_drafter(prefix_attention=prefix_attention)
    adapter = SpecDrafterAdapter(drafter)
    assert isinstance(adapter, Drafter)
    assert (adapter.vocab_size, adapter.num_draft_tokens) == (VOCAB_SIZE, NUM_DRAFT_TOKENS)
    validate_drafter(adapter, VOCAB_SIZE)

    source = make_source_batch(3)
    for num_draft_tokens in (1, NUM_DRAFT_TOKENS):
        proposal = propose_fresh(drafter, source, random_prefixes([4, 1, 6], width=9), [4, 1, 6], num_draft_tokens)
        assert proposal.draft_ids.shape == (3, num_draft_tokens)
        assert proposal.draft_logits.shape == (3, num_draft_tokens, VOCAB_SIZE)
        assert torch.equal(proposal.draft_ids, proposal.draft_logits.argmax(dim=-1))


@pytest.mark.parametrize("prefix_attention", ["bidirectional", "causal"])
def test_propose_matches_forward(prefix_attention):
    drafter = tiny_drafter(prefix_attention=prefix_attention)
    source = make_source_batch(3)
    lengths = [5, 2, 3]
    prefix_ids = random_prefixes(lengths)
    proposal = propose_fresh(drafter, source, prefix_ids, lengths)
    output = drafter(**source, decoder_input_ids=prefix_ids, decoder_attention_mask=(prefix_ids != 1).long())
    torch.testing.assert_close(proposal.draft_logits, output.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("prefix_attention", ["bidirectional", "causal"])
@pytest.mark.parametrize("encoder", ["own", "bart"])
@pytest.mark.parametrize("decoder_layers", [1, 2])
def test_ragged_rows_match_single_rows(prefix_attention, encoder, decoder_layers):
    """Each row's proposal in a padded, ragged batch equals its proposal alone: padding does not leak (one layer:
    the last layer's padding-only mask; two: the causal prefix mask of the first layer too)."""
    if encoder == "own":
        drafter = tiny_drafter(prefix_attention=prefix_attention, decoder_layers=decoder_layers)
    else:
        drafter = SpecDrafterModel.from_verifier(
            build_verifier("bart"),
            max_draft_tokens=NUM_DRAFT_TOKENS,
            decoder_layers=decoder_layers,
            prefix_attention=prefix_attention,
        )
    source = make_source_batch(3)
    lengths = [2, 7, 4]
    prefix_ids = random_prefixes(lengths, width=10)  # wider than the longest row
    batched = propose_fresh(drafter, source, prefix_ids, lengths)
    for row, length in enumerate(lengths):
        source_length = int(source["attention_mask"][row].sum())
        single_source = {name: value[row : row + 1, :source_length] for name, value in source.items()}
        single = propose_fresh(drafter, single_source, prefix_ids[row : row + 1, :length], [length])
        torch.testing.assert_close(batched.draft_logits[row : row + 1], single.draft_logits, atol=ATOL, rtol=0)


def test_bidirectional_and_causal_prefix_attention_differ():
    bidirectional = tiny_drafter(prefix_attention="bidirectional")
    causal = tiny_drafter(prefix_attention="causal")
    causal.load_state_dict(bidirectional.state_dict())
    source = make_source_batch(1)
    prefix_ids = random_prefixes([6])
    first = propose_fresh(bidirectional, source, prefix_ids, [6])
    second = propose_fresh(causal, source, prefix_ids, [6])
    assert first.state.prefix_key_values is None and second.state.prefix_key_values is not None
    assert not torch.allclose(first.draft_logits, second.draft_logits)


@pytest.mark.parametrize("decoder_layers", [1, 2])
def test_causal_prefix_cache_matches_recompute_with_select_rows(decoder_layers):
    """Over many calls with growing ragged prefixes (past the cache's first capacity), the cached logits equal a
    fresh recomputation; dropping and reordering rows with `select_rows` keeps that true."""
    drafter = tiny_drafter(prefix_attention="causal", decoder_layers=decoder_layers)
    adapter = SpecDrafterAdapter(drafter)
    source = make_source_batch(4)
    generator = torch.Generator().manual_seed(1)
    full = random_prefixes([200] * 4, seed=3)
    lengths = torch.tensor([1, 3, 2, 1])
    state = adapter.init_drafting_state(source["input_ids"], source["attention_mask"], None)
    rows = torch.arange(4)
    for step in range(30):
        if step == 12:  # rows 1 and 3 finish; keep the others in a new order
            keep = torch.tensor([2, 0])
            state = adapter.select_rows(state, keep)
            rows, lengths = rows[keep], lengths[keep]
        prefix_ids = full[rows, : int(lengths.max()) + 2]
        num_draft_tokens = 1 + step % NUM_DRAFT_TOKENS
        proposal = adapter.propose(state, prefix_ids, lengths, num_draft_tokens)
        current_source = {name: value[rows] for name, value in source.items()}
        reference = propose_fresh(drafter, current_source, prefix_ids, lengths, num_draft_tokens)
        torch.testing.assert_close(proposal.draft_logits, reference.draft_logits, atol=ATOL, rtol=0)
        state = proposal.state
        assert state.cache_length == int(lengths.min())
        lengths = lengths + torch.randint(0, NUM_DRAFT_TOKENS + 2, lengths.shape, generator=generator)
    assert state.cache_length > 64  # the buffers grew beyond their first capacity


def test_causal_propose_feeds_only_uncached_tokens():
    drafter = tiny_drafter(prefix_attention="causal")
    source = make_source_batch(2)
    seen = []
    hook = drafter.decoder.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["inputs_embeds"].shape[1]), with_kwargs=True
    )
    adapter = SpecDrafterAdapter(drafter)
    state = adapter.init_drafting_state(source["input_ids"], source["attention_mask"], None)
    full = random_prefixes([120, 120])
    for length in range(20, 120, 20):
        state = adapter.propose(state, full[:, :length], torch.tensor([length, length - 1]), NUM_DRAFT_TOKENS).state
    hook.remove()
    assert seen[0] == 20 and all(count <= 21 for count in seen[1:])


def test_drafting_errors():
    drafter = tiny_drafter(max_position_embeddings=16)
    source = make_source_batch(1)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        propose_fresh(drafter, source, random_prefixes([3]), [3], num_draft_tokens=NUM_DRAFT_TOKENS + 1)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        propose_fresh(drafter, source, random_prefixes([14]), [14])
    with pytest.raises(ValueError, match="input_ids"):
        SpecDrafterAdapter(drafter).init_drafting_state(None, None, torch.zeros(1, 3, 32))


class _RecordMoves(TorchFunctionMode):
    """Records the tensors that `Tensor.to` is asked to move to a device (by identity)."""

    def __init__(self):
        super().__init__()
        self.moved = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            device = kwargs.get("device", args[1] if len(args) > 1 else None)
            if isinstance(device, (torch.device, str)):
                self.moved.append((id(args[0]), torch.device(device)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("encoder", ["own", "verifier"])
def test_drafting_state_moves_its_inputs_to_the_drafters_device(encoder):
    """The source and the verifier's encoder output follow the drafter to its device. One CPU cannot hold two
    devices: the test checks that each input is moved to the drafter's device (and, with a drafter in another
    dtype than the verifier's encoder output, that the state is built in the drafter's dtype)."""
    verifier = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=NUM_DRAFT_TOKENS, decoder_layers=1, use_verifier_encoder=encoder == "verifier"
    ).to(torch.bfloat16)
    source = make_source_batch(2)
    encoder_states = verifier.get_encoder()(**source)[0]
    inputs = (source["input_ids"], source["attention_mask"], encoder_states)
    with _RecordMoves() as recorder:
        state = SpecDrafterAdapter(drafter).init_drafting_state(*inputs)
    for tensor in inputs:
        assert (id(tensor), drafter.device) in recorder.moved
    assert state.cross_key_values[0][0].dtype == torch.bfloat16
