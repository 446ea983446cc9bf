"""The n-gram store: what it counts and keeps, its longest-context lookup, and a save / load round trip."""

from __future__ import annotations

import json

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file, save_file

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
    store.save_pretrained(tmp_path)
    assert is_ngram_store(tmp_path) and not is_ngram_store(tmp_path / "missing")
    tensors = load_file(tmp_path / "ngram_store.safetensors")
    # ids in int16 where the vocabulary allows it
    assert tensors["continuations"].dtype == (torch.int16 if vocab_size <= 2**15 else torch.int32)
    config = json.loads((tmp_path / "ngram_store.json").read_text())
    assert config == {"vocab_size": vocab_size, "max_ngram_size": 3, **store.build_settings}
    loaded = NgramStore.from_pretrained(tmp_path)
    assert loaded.vocab_size == vocab_size and loaded.max_ngram_size == 3
    assert loaded.build_settings == store.build_settings
    assert loaded.continuations.keys() == store.continuations.keys()
    for context, (ids, shares) in store.continuations.items():
        assert loaded.continuations[context][0] == ids
        assert loaded.continuations[context][1] == pytest.approx(shares, abs=1e-3)  # float16 shares


def test_a_directory_without_a_store_is_refused(tmp_path):
    assert not is_ngram_store(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no ngram_store.json: it is not a saved n-gram store"):
        NgramStore.from_pretrained(tmp_path)


def test_a_missing_path_is_no_store_without_asking_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def no_request(*args, **kwargs):
        raise AssertionError("asked the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_request)
    assert not is_ngram_store("runs/a/b")  # no Hub id either
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert not is_ngram_store("owner/store")  # offline, and not in the cache


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (huggingface_hub.errors.LocalEntryNotFoundError("the Hub cannot be reached"), False),
        (OSError("404 Client Error: Entry Not Found"), False),  # what an HfHubHTTPError is (below)
        ("/cache/owner/store/ngram_store.json", True),
    ],
)
def test_a_hub_id_is_a_store_when_its_file_can_be_fetched(tmp_path, monkeypatch, answer, expected):
    """An unreachable Hub (huggingface_hub's LocalEntryNotFoundError) or a repository without the file: not a store,
    and no exception; the model loader then tries the name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def download(*args, **kwargs):
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert is_ngram_store("owner/store") is expected
    # a missing file, repository or revision is an HTTP error of the Hub's, an OSError
    for error in ("RemoteEntryNotFoundError", "RepositoryNotFoundError", "RevisionNotFoundError"):
        assert issubclass(getattr(huggingface_hub.errors, error), OSError)


def _edit_tables(path, **replaced):
    tensors = load_file(path / "ngram_store.safetensors")
    tensors.update(replaced)
    save_file({name: value for name, value in tensors.items() if value is not None}, path / "ngram_store.safetensors")


def test_tables_that_do_not_fit_their_settings_are_refused(tmp_path):
    NgramStore.from_sequences(SEQUENCES, vocab_size=10, max_ngram_size=2, min_count=1).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "ngram_store.json").read_text())
    (tmp_path / "ngram_store.json").write_text(json.dumps({**config, "max_ngram_size": 3}))
    with pytest.raises(ValueError, match="do not fit together or its ngram_store.json: build and save it again"):
        NgramStore.from_pretrained(tmp_path)
    (tmp_path / "ngram_store.json").write_text(json.dumps({**config, "vocab_size": 8}))
    with pytest.raises(ValueError, match="context \\(2,\\) holds an id outside the vocabulary \\[0, 8\\)"):
        NgramStore.from_pretrained(tmp_path)
    (tmp_path / "ngram_store.json").write_text(json.dumps(config))
    contexts = load_file(tmp_path / "ngram_store.safetensors")["contexts"]
    for damaged in (
        {"contexts": torch.cat([contexts[:1], contexts[:-1]])},  # a context twice
        {"contexts": contexts.flip(1).contiguous()},  # -1 after the ids
        {"shares": None},  # a table missing
    ):
        original = load_file(tmp_path / "ngram_store.safetensors")
        _edit_tables(tmp_path, **damaged)
        with pytest.raises(ValueError, match="do not fit together"):
            NgramStore.from_pretrained(tmp_path)
        save_file(original, tmp_path / "ngram_store.safetensors")
    assert NgramStore.from_pretrained(tmp_path).continuations[(5, 6)][0] == (7, 8)  # the undamaged tables load


@pytest.mark.parametrize(
    ("continuations", "vocab_size", "message"),
    [
        ({(5, 6, 7): ((8,), (1.0,))}, 400, "has 3 tokens \\(1 to max_ngram_size=2\\)"),
        ({(5,): (tuple(range(256)), (0.1,) * 256)}, 400, "has 256 continuations and 256 shares"),
        ({(5,): ((6, 7), (1.0,))}, 400, "has 2 continuations and 1 shares"),
        ({(5,): ((6,), (float("nan"),))}, 400, "has shares \\(nan,\\) outside \\[0, 1\\]"),
        ({(5,): ((300,), (1.0,))}, 299, "holds an id outside the vocabulary \\[0, 299\\)"),
    ],
)
def test_a_hand_built_store_that_cannot_draft_is_named(tmp_path, continuations, vocab_size, message):
    with pytest.raises(ValueError, match=message):  # when it is built, before anything is written
        NgramStore(continuations, vocab_size=vocab_size, max_ngram_size=2).save_pretrained(tmp_path)
    assert not any(tmp_path.iterdir())


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
