"""The n-gram store: what it counts and keeps, its longest-context lookup, and a save / load round trip."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specdec_hf.drafters import NgramStore, is_ngram_store

# three outputs: "5 6" is followed by 7 twice and by 8 once; "9" only ever by 5
SEQUENCES = [[2, 5, 6, 7, 2], [2, 9, 5, 6, 7, 2], [2, 5, 6, 8, 2]]


def test_contexts_keep_their_most_frequent_continuations_and_shares():
    store = NgramStore.from_sequences(SEQUENCES, vocab_size=10, max_ngram_size=2, max_continuations=4, min_count=1)
    ids, shares = store.continuations[(5, 6)]
    assert ids == (7, 8) and shares == pytest.approx((2 / 3, 1 / 3))
    assert store.continuations[(9,)] == ((5,), (1.0,))
    # the decoder start token begins a context too; no context spans more than two tokens
    assert store.continuations[(2,)][0][0] == 5 and max(len(context) for context in store.continuations) == 2
    assert store.build_settings == {"max_continuations": 4, "min_count": 1, "num_sequences": 3}


def test_pruning_keeps_the_top_continuations_of_contexts_seen_often_enough():
    store = NgramStore.from_sequences(SEQUENCES, vocab_size=10, max_ngram_size=2, max_continuations=1, min_count=2)
    assert store.continuations[(5, 6)] == ((7,), (pytest.approx(2 / 3),))
    assert (9,) not in store.continuations and (9, 5) not in store.continuations  # seen once


def test_lookup_takes_the_longest_stored_context():
    store = NgramStore.from_sequences(SEQUENCES, vocab_size=10, max_ngram_size=2, min_count=1)
    assert store.lookup([2, 9, 5])[0] == (6,)  # "9 5" is stored
    assert store.lookup([4, 5])[0] == (6,)  # "4 5" is not: "5" is
    assert store.lookup([4]) is None and store.lookup([]) is None


@pytest.mark.parametrize("vocab_size", [10, 40_000])
def test_save_and_load_round_trip(tmp_path, vocab_size):
    store = NgramStore.from_sequences(SEQUENCES, vocab_size=vocab_size, max_ngram_size=3, min_count=1)
    store.save_pretrained(tmp_path, extra_config={"source_bias": 0.5})
    assert is_ngram_store(tmp_path) and not is_ngram_store(tmp_path / "missing")
    tensors = load_file(tmp_path / "ngram_store.safetensors")
    # ids in int16 where the vocabulary allows it
    assert tensors["continuations"].dtype == (torch.int16 if vocab_size <= 2**15 else torch.int32)
    assert json.loads((tmp_path / "ngram_store.json").read_text())["source_bias"] == 0.5
    loaded = NgramStore.from_pretrained(tmp_path)
    assert loaded.vocab_size == vocab_size and loaded.max_ngram_size == 3
    assert loaded.build_settings == store.build_settings
    assert loaded.continuations.keys() == store.continuations.keys()
    for context, (ids, shares) in store.continuations.items():
        assert loaded.continuations[context][0] == ids
        assert loaded.continuations[context][1] == pytest.approx(shares, abs=1e-3)  # float16 shares


def test_a_directory_without_a_store_is_refused(tmp_path):
    assert not is_ngram_store(tmp_path)
    with pytest.raises(OSError, match="ngram_store.json"):
        NgramStore.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_ngram_size=0), "`max_ngram_size` must be an integer >= 1"),
        (dict(max_continuations=256), "`max_continuations` must be at most 255"),
        (dict(min_count=True), "`min_count` must be an integer >= 1"),
        (dict(min_count=9), "no context of the 3 sequences occurs 9 times or more"),
        (dict(vocab_size=8), "sequence 1 holds id 9, outside the vocabulary \\[0, 8\\)"),
    ],
)
def test_bad_settings_and_ids_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NgramStore.from_sequences(SEQUENCES, **{"vocab_size": 10, **kwargs})
