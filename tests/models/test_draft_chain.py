"""The draft chain (`draft_chain_dim`): each mask slot reads the token before it, the true one in training and the
previous slot's draft when drafting; a new chain drafts what the drafter drafted; β=1 stays exact with it."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, load_repository_script, make_source_batch
from tiny_drafters import ATOL, NUM_DRAFT_TOKENS, propose_fresh, random_prefixes, tiny_config, tiny_drafter

from specdec_hf import SpecDrafterModel, speculative_generate

HEAD_IDS = list(range(0, VOCAB_SIZE, 3))  # a reduced head: every third id
GREEDY = dict(do_sample=False, num_beams=1, max_new_tokens=14)


def _chained(seed: int = 0, **overrides) -> SpecDrafterModel:
    """A tiny causal drafter whose chain is not the identity (its output projection is random, not zero)."""
    drafter = tiny_drafter(seed, prefix_attention="causal", draft_chain_dim=8, **overrides)
    with torch.no_grad():
        drafter.draft_chain.out_proj.weight.normal_(std=0.5)
    return drafter


def _chained_with_head(reduced_head: bool) -> SpecDrafterModel:
    """`_chained()`, with a reduced head over `HEAD_IDS` when `reduced_head`."""
    if not reduced_head:
        return _chained()
    drafter = _chained(draft_vocab_size=len(HEAD_IDS), tie_word_embeddings=False)
    with torch.no_grad():
        drafter.draft_vocab_ids.copy_(torch.tensor(HEAD_IDS))
    return drafter


def _record_chain_steps(drafter: SpecDrafterModel) -> tuple[list, list]:
    """Hooks recording each chain step and each decoder pass's slot count: `(chain_steps, slots_per_call)`."""
    chain_steps, slots_per_call = [], []
    drafter.draft_chain.register_forward_hook(lambda module, args, output: chain_steps.append(args[1].shape))
    drafter.decoder.register_forward_hook(
        lambda module, args, kwargs, output: slots_per_call.append(output.shape[-2]), with_kwargs=True
    )
    return chain_steps, slots_per_call


def test_draft_chain_dim_must_be_positive():
    with pytest.raises(ValueError, match="draft_chain_dim"):
        tiny_config(draft_chain_dim=0)


def test_a_new_chain_drafts_what_the_drafter_drafted():
    add_draft_chain = load_repository_script("scripts/add_draft_chain.py", "add_draft_chain").add_draft_chain
    drafter = tiny_drafter(prefix_attention="causal")
    chained = add_draft_chain(drafter, 8)
    out_proj = chained.draft_chain.out_proj
    assert chained.config.draft_chain_dim == 8
    assert torch.count_nonzero(out_proj.weight) == torch.count_nonzero(out_proj.bias) == 0
    source = make_source_batch(3)
    lengths = [4, 1, 6]
    prefix_ids = random_prefixes(lengths, width=7)
    expected = propose_fresh(drafter, source, prefix_ids, lengths)
    proposal = propose_fresh(chained, source, prefix_ids, lengths)
    assert torch.equal(proposal.draft_ids, expected.draft_ids)
    torch.testing.assert_close(proposal.draft_logits, expected.draft_logits, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="already has a draft chain"):
        add_draft_chain(chained, 8)


@pytest.mark.parametrize("reduced_head", [False, True])
def test_teacher_forced_slots_read_the_labels_and_drafting_reads_the_drafts(reduced_head):
    drafter = _chained_with_head(reduced_head)
    source = make_source_batch(2)
    inputs = dict(**source, decoder_input_ids=random_prefixes([5, 5]))
    drafted = drafter(**inputs).logits
    drafts = drafter.from_draft_vocab(drafted.argmax(-1))
    # fed its own drafts as the true tokens, every slot scores what it scored while drafting
    torch.testing.assert_close(drafter(**inputs, labels=drafts).logits, drafted, atol=ATOL, rtol=0)
    # other true tokens change every slot after the first (each reads the one before it), never the first
    other = (drafts + 1 + torch.arange(NUM_DRAFT_TOKENS)) % VOCAB_SIZE
    forced = drafter(**inputs, labels=other).logits
    torch.testing.assert_close(forced[:, 0], drafted[:, 0], atol=ATOL, rtol=0)
    assert not torch.allclose(forced[:, 1:], drafted[:, 1:], atol=1e-3)


def test_chain_rows_put_tokens_outside_a_reduced_head_on_the_last_row():
    drafter = _chained_with_head(reduced_head=True)
    rows = drafter.draft_chain_rows(torch.tensor([0, 3, 4, -100, 96]))
    last = len(HEAD_IDS)
    assert rows.tolist() == [0, 1, last, last, 32]
    assert drafter.draft_chain.token_embedding.num_embeddings == last + 1


@pytest.mark.parametrize("reduced_head", [False, True])
def test_propose_on_a_ragged_batch_matches_forward(reduced_head):
    drafter = _chained_with_head(reduced_head)
    source = make_source_batch(3)
    lengths = [5, 2, 3]
    prefix_ids = random_prefixes(lengths)
    proposal = propose_fresh(drafter, source, prefix_ids, lengths)
    output = drafter(**source, decoder_input_ids=prefix_ids, decoder_attention_mask=(prefix_ids != 1).long())
    scores = proposal.head_logits if reduced_head else proposal.draft_logits
    torch.testing.assert_close(scores, output.logits.float(), atol=ATOL, rtol=0)
    assert torch.equal(proposal.draft_ids, drafter.from_draft_vocab(output.logits.argmax(-1)))
    # each row alone drafts what it drafts in the batch: the first slot reads its own row's last token
    for row, length in enumerate(lengths):
        source_length = int(source["attention_mask"][row].sum())
        single_source = {name: value[row : row + 1, :source_length] for name, value in source.items()}
        single = propose_fresh(drafter, single_source, prefix_ids[row : row + 1, :length], [length])
        assert torch.equal(single.draft_ids, proposal.draft_ids[row : row + 1])


def test_a_saved_drafter_loaded_with_a_chain_drafts_as_before(tmp_path):
    """`from_pretrained(path, draft_chain_dim=...)` adds a chain as the identity too (its weights are missing)."""
    drafter = tiny_drafter(prefix_attention="causal")
    drafter.save_pretrained(tmp_path)
    chained, info = SpecDrafterModel.from_pretrained(tmp_path, draft_chain_dim=8, output_loading_info=True)
    assert info["missing_keys"] and all(name.startswith("draft_chain.") for name in info["missing_keys"])
    assert torch.count_nonzero(chained.draft_chain.out_proj.weight) == 0
    source = make_source_batch(2)
    prefix_ids = random_prefixes([3, 5])
    expected = propose_fresh(drafter, source, prefix_ids, [3, 5])
    proposal = propose_fresh(chained.eval(), source, prefix_ids, [3, 5])
    assert torch.equal(proposal.draft_ids, expected.draft_ids)


def test_every_split_drafting_equals_one_call_per_split():
    """The training forward's every-split pass without labels drafts after each split as a call with that prefix."""
    drafter = _chained()
    source = make_source_batch(2)
    sequences = random_prefixes([9, 9])
    splits = torch.tensor([1, 4, 9])
    every = drafter(**source, decoder_input_ids=sequences, split_lengths=splits).logits  # (2, 3, k, vocab)
    for index, length in enumerate(splits.tolist()):
        one = drafter(**source, decoder_input_ids=sequences[:, :length]).logits
        torch.testing.assert_close(every[:, index], one, atol=ATOL, rtol=0)


def test_glancing_slots_feed_the_chain_their_true_token():
    """Glancing reveals some slots' tokens and marks their labels -100; the slot after one still reads its token."""
    drafter = _chained()
    source = make_source_batch(2)
    inputs = dict(**source, decoder_input_ids=random_prefixes([5, 5]))
    labels = torch.randint(4, VOCAB_SIZE, (2, NUM_DRAFT_TOKENS), generator=torch.Generator().manual_seed(3))
    glance_ids = torch.full_like(labels, -100)
    glance_ids[:, 1] = labels[:, 1]  # slot 1 revealed: nothing to learn there
    masked = labels.clone()
    masked[:, 1] = -100
    glanced = drafter(**inputs, glance_ids=glance_ids, labels=masked).logits
    reading_all = drafter(**inputs, glance_ids=glance_ids, labels=labels).logits
    torch.testing.assert_close(glanced, reading_all, atol=ATOL, rtol=0)


def test_labels_of_another_width_are_refused():
    drafter = _chained()
    source = make_source_batch(2)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        drafter(**source, decoder_input_ids=random_prefixes([5, 5]), labels=torch.randint(4, VOCAB_SIZE, (2, 3)))


def test_chain_rows_of_a_drafter_without_a_chain_are_refused():
    with pytest.raises(ValueError, match="draft_chain_dim"):
        tiny_drafter().draft_chain_rows(torch.tensor([4]))


def test_saved_chain_loads_and_drafts_identically(tmp_path):
    drafter = _chained()
    drafter.save_pretrained(tmp_path)
    loaded, info = SpecDrafterModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.config.draft_chain_dim == 8
    source = make_source_batch(2)
    prefix_ids = random_prefixes([3, 5])
    expected = propose_fresh(drafter, source, prefix_ids, [3, 5])
    torch.testing.assert_close(
        propose_fresh(loaded.eval(), source, prefix_ids, [3, 5]).draft_logits, expected.draft_logits
    )


def test_a_new_chain_gets_gradient_and_training_moves_it():
    drafter = tiny_drafter(prefix_attention="causal", draft_chain_dim=8).train()
    source = make_source_batch(2)
    labels = torch.randint(4, VOCAB_SIZE, (2, NUM_DRAFT_TOKENS))
    inputs = dict(**source, decoder_input_ids=random_prefixes([3, 4]), labels=labels)
    drafter(**inputs).loss.backward()
    # the output projection starts at zero, so it alone gets gradient at first; the rest follows once it moves
    assert drafter.draft_chain.out_proj.weight.grad.abs().sum() > 0
    assert drafter.draft_chain.token_embedding.weight.grad.abs().sum() == 0
    assert drafter.draft_chain.state_proj.weight.grad.abs().sum() == 0
    optimizer = torch.optim.SGD(drafter.draft_chain.parameters(), lr=0.5)
    optimizer.step()
    optimizer.zero_grad()
    drafter(**inputs).loss.backward()
    assert drafter.draft_chain.token_embedding.weight.grad.abs().sum() > 0
    assert drafter.draft_chain.state_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("num_draft_tokens", [1, 4])
def test_chained_drafter_keeps_beta_one_equal_to_greedy(family, batch_size, num_draft_tokens):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=2, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY)
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        model,
        max_draft_tokens=4,
        decoder_layers=1,
        prefix_attention="causal",
        verifier_state_layers=[1, -1],
        use_verifier_encoder=True,
        draft_vocab_ids=HEAD_IDS,
        draft_chain_dim=8,
    ).eval()
    with torch.no_grad():
        drafter.draft_chain.out_proj.weight.normal_(std=0.5)
    chain_steps, calls = _record_chain_steps(drafter)
    output = model.generate(
        **inputs, **GREEDY, custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=num_draft_tokens
    )
    assert torch.equal(output, reference)
    # drafting went through the chain, one step per drafted slot of every call (k shrinks near the length limit)
    assert calls and len(chain_steps) == sum(calls)


def test_chained_drafter_samples():
    """Sampling redraws each slot from its scores (given the previous slot's argmax); it runs and stays in range."""
    model = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", draft_chain_dim=8
    ).eval()
    with torch.no_grad():  # a chain that is not the identity: later slots read the argmax, not the token drawn
        drafter.draft_chain.out_proj.weight.normal_(std=0.5)
    chain_steps, calls = _record_chain_steps(drafter)
    inputs = make_source_batch(2, seed=2, pad_token_id=model.config.pad_token_id)
    torch.manual_seed(0)
    output = model.generate(
        **inputs, do_sample=True, max_new_tokens=10, custom_generate=speculative_generate, drafter=drafter
    )
    assert output.shape[0] == 2 and 1 < output.shape[1] <= 11
    assert int(output.min()) >= 0 and int(output.max()) < model.config.vocab_size
    assert calls and len(chain_steps) == sum(calls)  # the drafts came through the chain
