"""The n-gram store drafter: its drafts, the source's preference, exact β=1 output on every family, and saving."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, generate_with_drafter, make_source_batch

from specdec_hf.drafters import NgramStore, NgramStoreDrafter, draft_from_store

GREEDY = dict(do_sample=False, num_beams=1)

pytestmark = pytest.mark.usefixtures("fresh_draft_length_measurements")

# "5" is followed by 6 three times and by 8 twice; "6" by 7, "7" by 2 (EOS)
SEQUENCES = [[2, 5, 6, 7, 2]] * 3 + [[2, 5, 8, 2]] * 2


def _drafter(**kwargs) -> NgramStoreDrafter:
    return NgramStoreDrafter(NgramStore.from_sequences(SEQUENCES, VOCAB_SIZE, max_ngram_size=2, min_count=1), **kwargs)


def _propose(drafter, source, prefixes, num_draft_tokens=3):
    """One proposal for right-padded `prefixes` (lists of ids) against `source` `(rows, length)` (1 = padding)."""
    state = drafter.init_drafting_state(source, (source != 1).long(), None)
    lengths = torch.tensor([len(prefix) for prefix in prefixes])
    width = int(lengths.max())
    prefix_ids = torch.tensor([prefix + [1] * (width - len(prefix)) for prefix in prefixes])
    return drafter.propose(state, prefix_ids, lengths, num_draft_tokens)


def test_drafts_chain_the_most_frequent_continuations():
    proposal = _propose(_drafter(source_bias=0.0), torch.tensor([[9, 8, 2]]), [[2, 5]])
    assert proposal.draft_ids.tolist() == [[6, 7, 2]] and proposal.num_drafts.tolist() == [3]
    assert proposal.draft_logits is None  # a looked-up token is a certain proposal


def test_the_source_tips_the_choice_toward_its_tokens():
    # 8 (share 0.4) occurs in the source: 0.4 + 0.3 beats 6's 0.6
    assert _propose(_drafter(), torch.tensor([[9, 8, 2]]), [[2, 5]]).draft_ids[0, 0].item() == 8
    # in padding only, or among the ignored ids, it does not count
    drafter = _drafter()
    masked = drafter.init_drafting_state(torch.tensor([[9, 2, 8]]), torch.tensor([[1, 1, 0]]), None)
    assert drafter.propose(masked, torch.tensor([[2, 5]]), torch.tensor([2]), 1).draft_ids.tolist() == [[6]]
    ignoring = _drafter(ignored_source_ids=[8])
    assert _propose(ignoring, torch.tensor([[9, 8, 2]]), [[2, 5]], 1).draft_ids.tolist() == [[6]]


def test_rows_draft_apart_and_stop_where_no_context_is_stored():
    source = torch.tensor([[9, 2, 1], [9, 8, 2]])
    proposal = _propose(_drafter(), source, [[2, 4], [2, 5, 8]], 3)
    # row 0: nothing follows "4"; row 1: "5 8" then "8" -> 2 (EOS), then "2" -> 5 (the start of an output)
    assert proposal.num_drafts.tolist() == [0, 3]
    assert proposal.draft_ids.tolist() == [[0, 0, 0], [2, 5, 8]]
    kept = _drafter().select_rows(
        _drafter().init_drafting_state(source, (source != 1).long(), None), torch.tensor([1])
    )
    assert kept.source_tokens == [frozenset({9, 8, 2})]


def test_each_row_drafts_after_its_own_last_tokens_in_a_ragged_batch():
    """Rows of lengths 5 and 9 (the shortest longer than the context): each row's tail is its own last two tokens."""
    drafter = _drafter(source_bias=0.0)
    prefixes = [[2, 9, 9, 9, 5], [2, 9, 9, 9, 9, 9, 9, 5, 8]]
    proposal = _propose(drafter, torch.tensor([[9, 2], [9, 2]]), prefixes, 2)
    # row 0 ends "9 5": "5" -> 6 -> 7; row 1 ends "5 8": -> 2 (EOS) -> 5
    assert proposal.draft_ids.tolist() == [[6, 7], [2, 5]] and proposal.num_drafts.tolist() == [2, 2]
    assert draft_from_store(drafter.store, [9, 5], (), 2, 0.0) == [6, 7]


def test_without_source_ids_it_drafts_from_the_store_alone():
    drafter = _drafter()
    state = drafter.init_drafting_state(None, None, torch.zeros(1, 3, 8))
    assert state.source_tokens is None
    proposal = drafter.propose(state, torch.tensor([[2, 5]]), torch.tensor([2]), 1)
    assert proposal.draft_ids.tolist() == [[6]]


def _own_outputs_drafter(model, inputs, **kwargs) -> tuple[torch.Tensor, NgramStoreDrafter]:
    """Greedy's outputs for `inputs` and a drafter whose store counts them (drafts that are often right)."""
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    pad = model.generation_config.pad_token_id
    sequences = [[token for token in row if token != pad] for row in reference.tolist()]
    return reference, NgramStoreDrafter(NgramStore.from_sequences(sequences, VOCAB_SIZE, min_count=1), **kwargs)


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("num_draft_tokens", [3, "auto"])
def test_equals_greedy(family, batch_size, num_draft_tokens):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=11, pad_token_id=model.config.pad_token_id)
    reference, drafter = _own_outputs_drafter(model, inputs)
    output = generate_with_drafter(model, inputs, drafter, max_new_tokens=20, num_draft_tokens=num_draft_tokens)
    assert torch.equal(output.sequences, reference)
    if num_draft_tokens == 3:  # drafts were verified and some accepted (a fixed k drafts at every iteration)
        stats = output.speculative_stats
        assert sum(stats.generated_tokens) > sum(stats.iterations)


def test_a_store_of_other_outputs_still_equals_greedy():
    """Drafts that are mostly wrong (a store of another model's outputs) change nothing but the speed."""
    model = build_verifier("bart")
    inputs = make_source_batch(3, seed=12, pad_token_id=model.config.pad_token_id)
    _, drafter = _own_outputs_drafter(build_verifier("bart", seed=1), inputs)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    output = generate_with_drafter(model, inputs, drafter, max_new_tokens=20, num_draft_tokens=4)
    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    # drafts were proposed and most of them rejected
    assert stats.drafter_calls > 0 and sum(stats.verified_tokens) > 2 * sum(stats.accepted_tokens)


def test_sampling_with_looked_up_drafts_stays_in_the_verifiers_support():
    model = build_verifier("t5")
    inputs = make_source_batch(2, seed=13, pad_token_id=model.config.pad_token_id)
    reference, drafter = _own_outputs_drafter(model, inputs)
    output = generate_with_drafter(model, inputs, drafter, do_sample=True, top_k=1, max_new_tokens=20)
    assert torch.equal(output.sequences, reference)  # top_k=1: the only token sampling may emit is greedy's


def test_save_and_load_keep_the_settings(tmp_path):
    drafter = _drafter(num_draft_tokens=3, source_bias=0.5, ignored_source_ids=[2, 1])
    drafter.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["source_bias"] == 0.5
    assert "library_name: specdec_hf" in (tmp_path / "README.md").read_text()  # the Hub's card names this library
    loaded = NgramStoreDrafter.from_pretrained(tmp_path)
    assert (loaded.num_draft_tokens, loaded.max_draft_tokens, loaded.source_bias) == (3, 8, 0.5)
    assert loaded.ignored_source_ids == frozenset({1, 2}) and loaded.vocab_size == VOCAB_SIZE
    assert loaded.store.continuations.keys() == drafter.store.continuations.keys()
    assert NgramStoreDrafter.from_pretrained(tmp_path, num_draft_tokens="auto").num_draft_tokens == "auto"
    with pytest.raises(ValueError, match="got \\['max_ngram_size'\\]: .*build another with"):
        NgramStoreDrafter.from_pretrained(tmp_path, max_ngram_size=3)


def test_settings_are_saved_as_the_drafter_holds_them(tmp_path, monkeypatch):
    """A set of ignored ids (not JSON) is saved, as the drafter's sorted list; `~` is a local path when loading."""
    drafter = _drafter(ignored_source_ids={2, 1})
    drafter.save_pretrained(tmp_path / "store")
    assert json.loads((tmp_path / "store" / "config.json").read_text())["ignored_source_ids"] == [1, 2]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert NgramStoreDrafter.from_pretrained("~/store").ignored_source_ids == frozenset({1, 2})


@pytest.mark.parametrize(
    "model_files",
    [["model.safetensors"], ["model.safetensors.index.json", "model-00001-of-00002.safetensors"], ["config.json"]],
)
def test_a_model_directory_is_not_overwritten(tmp_path, model_files):
    for name in model_files:
        (tmp_path / name).write_text('{"model_type": "bart"}')
    before = {path.name: path.read_text() for path in tmp_path.iterdir()}
    with pytest.raises(ValueError, match="holds a model .*; an n-gram store writes its own config.json"):
        _drafter().save_pretrained(tmp_path)
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == before


def test_an_earlier_store_is_saved_over_but_a_bad_one_writes_nothing(tmp_path):
    _drafter().save_pretrained(tmp_path)
    _drafter(num_draft_tokens=2).save_pretrained(tmp_path)  # its own config.json: replaced
    assert NgramStoreDrafter.from_pretrained(tmp_path).num_draft_tokens == 2
    drafter = _drafter()
    drafter.store.continuations[(5,)] = ((VOCAB_SIZE,), (1.0,))  # edited after it was checked
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    with pytest.raises(ValueError, match="outside the vocabulary"):
        drafter.save_pretrained(tmp_path)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_draft_tokens=0), "`num_draft_tokens` must be an integer >= 1 or 'auto'"),
        (dict(num_draft_tokens=9), "`num_draft_tokens` \\(9\\) exceeds `max_draft_tokens` \\(8\\)"),
        (dict(max_draft_tokens=0), "`max_draft_tokens` must be an integer >= 1"),
        (dict(source_bias=-0.1), "`source_bias` must be a number >= 0"),
        (dict(source_bias=float("nan")), "`source_bias` must be a number >= 0"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    store = NgramStore.from_sequences(SEQUENCES, VOCAB_SIZE, min_count=1)
    with pytest.raises(ValueError, match=message):
        NgramStoreDrafter(store, **kwargs)


def test_a_hand_built_store_with_drafts_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="holds an id outside the vocabulary \\[0, 10\\)"):
        NgramStoreDrafter(NgramStore({(5,): ((60,), (1.0,))}, vocab_size=10, max_ngram_size=2))


def test_a_store_of_another_vocabulary_is_refused():
    model = build_verifier("bart")
    drafter = NgramStoreDrafter(NgramStore.from_sequences(SEQUENCES, VOCAB_SIZE + 1, min_count=1))
    inputs = make_source_batch(1, pad_token_id=model.config.pad_token_id)
    with pytest.raises(ValueError, match="vocab"):
        generate_with_drafter(model, inputs, drafter, max_new_tokens=4)
