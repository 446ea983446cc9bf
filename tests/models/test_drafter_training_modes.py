"""The drafter's every-split forward, verifier-state features and reduced-vocabulary head."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from tiny_drafters import tiny_config as base_tiny_config

from specdec_hf import SpecDrafterAdapter
from specdec_hf.acceptance import draft_distribution
from specdec_hf.models import SpecDrafterConfig, SpecDrafterModel

ATOL = 1e-5


def tiny_config(**overrides) -> SpecDrafterConfig:
    return base_tiny_config(**{"encoder_layers": 1, "prefix_attention": "causal", "verifier_d_model": 32, **overrides})


def tiny_drafter(**overrides) -> SpecDrafterModel:
    torch.manual_seed(0)
    return SpecDrafterModel(tiny_config(**overrides)).eval()


VARIANTS = {
    "tokens": {},
    "features": dict(verifier_state_layers=[0, -1]),
    "reduced_head": dict(draft_vocab_size=20, tie_word_embeddings=False),
    "features_reduced_head": dict(verifier_state_layers=[-1], draft_vocab_size=20, tie_word_embeddings=False),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_split_forward_equals_one_forward_per_split(variant):
    """One pass over all split points gives each split the logits of a separate call with that prefix."""
    drafter = tiny_drafter(**VARIANTS[variant])
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([9, 6, 4])
    targets = torch.randint(3, VOCAB_SIZE, (3, 9), generator=generator)
    mask = torch.arange(9)[None] < lengths[:, None]
    source = make_source_batch(3)
    width = 32 * len(drafter.config.verifier_state_layers or [])
    states = torch.randn(3, 9, width, generator=generator) if width else None
    splits = torch.arange(1, 9)
    every = drafter(
        **source,
        decoder_input_ids=targets,
        decoder_attention_mask=mask.long(),
        split_lengths=splits,
        verifier_states=states,
    ).logits
    assert every.shape == (3, 8, 4, drafter.config.draft_vocab_size or VOCAB_SIZE)
    for index, length in enumerate(splits.tolist()):
        rows = lengths >= length
        single = drafter(
            input_ids=source["input_ids"][rows],
            attention_mask=source["attention_mask"][rows],
            decoder_input_ids=targets[rows, :length],
            verifier_states=None if states is None else states[rows, :length],
        ).logits
        torch.testing.assert_close(every[rows, index], single, atol=ATOL, rtol=0)


def test_every_split_needs_a_causal_prefix():
    drafter = tiny_drafter(prefix_attention="bidirectional")
    with pytest.raises(ValueError, match="causal"):
        drafter(**make_source_batch(1), decoder_input_ids=torch.tensor([[2, 5, 6]]), split_lengths=torch.tensor([1]))


def test_feature_drafter_reads_the_previous_positions_state():
    """Position i reads the state of i - 1: the state at the last position changes nothing."""
    drafter = tiny_drafter(verifier_state_layers=[-1])
    source = make_source_batch(1)
    prefix = torch.tensor([[2, 7, 9, 11]])
    states = torch.randn(1, 4, 32)
    changed = states.clone()
    changed[:, -1] = 100.0
    first = drafter(**source, decoder_input_ids=prefix, verifier_states=states).logits
    torch.testing.assert_close(drafter(**source, decoder_input_ids=prefix, verifier_states=changed).logits, first)
    changed[:, -2] = 100.0
    assert not torch.allclose(drafter(**source, decoder_input_ids=prefix, verifier_states=changed).logits, first)
    with pytest.raises(ValueError, match="verifier_states"):
        drafter(**source, decoder_input_ids=prefix)


def test_propose_with_states_matches_forward_and_cache():
    """Drafting with a prefix cache reads each new position's predecessor state, as the training forward does."""
    drafter = tiny_drafter(verifier_state_layers=[-1])
    source = make_source_batch(2)
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, VOCAB_SIZE, (2, 8), generator=generator)
    prefix[:, 0] = 2
    states = torch.randn(2, 8, 32, generator=generator)
    adapter = SpecDrafterAdapter(drafter)
    state = adapter.init_drafting_state(source["input_ids"], source["attention_mask"], None)
    for length in (1, 3, 4, 8):  # the cache grows call by call
        lengths = torch.tensor([length, length])
        proposal = adapter.propose(state, prefix[:, :length], lengths, 4, states[:, :length])
        state = proposal.state
        expected = drafter(**source, decoder_input_ids=prefix[:, :length], verifier_states=states[:, :length])
        torch.testing.assert_close(proposal.draft_logits, expected.logits, atol=ATOL, rtol=0)


def test_reduced_head_proposes_only_its_ids_and_round_trips(tmp_path):
    verifier = build_verifier("bart")
    kept = torch.tensor([2, 5, 17, 40, 41, 60, 98])
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=4, draft_vocab_ids=kept, decoder_layers=1, prefix_attention="causal"
    )
    assert drafter.lm_head.weight.shape == (7, 32) and drafter.config.draft_vocab_size == 7
    torch.testing.assert_close(drafter.lm_head.weight, verifier.get_output_embeddings().weight[kept])
    source = make_source_batch(3)
    encoder_states = verifier.get_encoder()(**source)[0]
    prefix = torch.tensor([[2, 7, 9], [2, 8, 1], [2, 1, 1]])
    adapter = SpecDrafterAdapter(drafter)
    state = adapter.init_drafting_state(source["input_ids"], source["attention_mask"], encoder_states)
    proposal = adapter.propose(state, prefix, torch.tensor([3, 2, 1]), 4)
    assert torch.isin(proposal.draft_ids, kept).all()
    # the head scores its 7 ids; the loop sees scores over the verifier's vocabulary, -inf outside the head
    assert proposal.head_logits.shape == (3, 4, 7) and torch.equal(proposal.head_ids, kept)
    assert proposal.draft_logits.shape == (3, 4, VOCAB_SIZE)
    assert torch.equal(proposal.draft_logits[..., kept], proposal.head_logits)
    # the proposal distribution of sampling: zero outside the head's ids
    q = draft_distribution(proposal.draft_logits, proposal.draft_ids, VOCAB_SIZE)
    outside = torch.ones(VOCAB_SIZE, dtype=torch.bool)
    outside[kept] = False
    assert (q[..., outside] == 0).all() and torch.allclose(q.sum(-1), torch.ones(3, 4))
    # derived on demand: the drafts are the head's argmax, so their probability is the head's top-1 probability
    assert proposal.draft_confidence is None
    torch.testing.assert_close(proposal.confidence(), torch.softmax(proposal.head_logits, dim=-1).amax(dim=-1))

    drafter.save_pretrained(tmp_path)
    loaded = SpecDrafterModel.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.draft_vocab_ids, kept)
    adapter = SpecDrafterAdapter(loaded)
    state = adapter.init_drafting_state(source["input_ids"], source["attention_mask"], encoder_states)
    again = adapter.propose(state, prefix, torch.tensor([3, 2, 1]), 4)
    assert torch.equal(again.draft_ids, proposal.draft_ids)


def test_reduced_head_ignores_targets_outside_its_set():
    drafter = tiny_drafter(draft_vocab_size=3, tie_word_embeddings=False)
    drafter.draft_vocab_ids.copy_(torch.tensor([2, 10, 20]))
    labels = torch.tensor([[10, 20, 2, 55, -100]])
    assert drafter.to_draft_vocab(labels).tolist() == [[1, 2, 0, -100, -100]]
    assert drafter.from_draft_vocab(torch.tensor([0, 2])).tolist() == [2, 20]


def test_reduced_head_label_loss_is_the_mean_over_targets_in_its_set_and_zero_without_any():
    """forward's `labels` loss averages over the targets the head can name; a batch with none gives 0, not NaN."""
    drafter = tiny_drafter(draft_vocab_size=3, tie_word_embeddings=False)
    drafter.draft_vocab_ids.copy_(torch.tensor([2, 10, 20]))
    source = make_source_batch(1)
    inputs = dict(**source, decoder_input_ids=torch.tensor([[0, 5]]), num_draft_tokens=4)
    logits = drafter(**inputs).logits
    loss = drafter(**inputs, labels=torch.tensor([[10, 55, 2, -100]])).loss
    expected = torch.nn.functional.cross_entropy(logits[0, [0, 2]], torch.tensor([1, 0]))
    torch.testing.assert_close(loss, expected)
    nothing = drafter(**inputs, labels=torch.tensor([[55, 56, -100, -100]])).loss
    assert nothing.item() == 0.0


def test_config_rejects_inconsistent_options():
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        tiny_config(draft_vocab_size=10)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        tiny_config(draft_vocab_size=VOCAB_SIZE + 1, tie_word_embeddings=False)
    with pytest.raises(ValueError, match="causal"):
        tiny_config(verifier_state_layers=[-1], prefix_attention="bidirectional")
    with pytest.raises(ValueError, match="at least one layer"):
        tiny_config(verifier_state_layers=[])
    with pytest.raises(ValueError, match="num_draft_tokens"):
        tiny_config(max_draft_tokens=4, num_draft_tokens=5)


def test_from_verifier_rejects_encoder_layers_without_an_encoder():
    with pytest.raises(ValueError, match="encoder_layers"):
        SpecDrafterModel.from_verifier(build_verifier("bart"), use_verifier_encoder=True, encoder_layers=1)


def test_reduced_head_keeps_a_transformers_encoder_tied_to_the_shared_embedding(tmp_path):
    verifier = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, draft_vocab_ids=[2, 5, 9], encoder_layers=1)
    assert drafter.encoder.embed_tokens.weight is drafter.shared.weight
    assert drafter.lm_head.weight is not drafter.shared.weight
    drafter.save_pretrained(tmp_path)
    loaded = SpecDrafterModel.from_pretrained(tmp_path)
    assert loaded.encoder.embed_tokens.weight is loaded.shared.weight
    torch.testing.assert_close(loaded.lm_head.weight, drafter.lm_head.weight)
