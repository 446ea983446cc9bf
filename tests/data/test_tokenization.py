"""Tokenization of text pairs with the verifier's tokenizer: T5 prefixes, length filtering and truncation, the batched
(and cached) map, and the vocabulary check against a verifier's config.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
from conftest import VOCAB_SIZE, build_verifier, build_word_tokenizer
from transformers import BartConfig, PreTrainedTokenizerFast

from specdec_hf.data import DataArguments, check_tokenizer_matches, default_source_prefix, tokenize_pairs
from specdec_hf.data.loading import load_text_pairs
from specdec_hf.data.tokenization import source_length_limit

FIXTURE = Path(__file__).parent.parent / "fixtures" / "mt_fixture.jsonl"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    with open(FIXTURE, encoding="utf-8") as f:
        translations = [json.loads(line)["translation"] for line, _ in zip(f, range(30), strict=False)]
    return [{"id": str(i), "source": t["en"], "target": t["de"]} for i, t in enumerate(translations)]


@pytest.fixture(scope="module")
def tokenizer(rows) -> PreTrainedTokenizerFast:
    return build_word_tokenizer([row["source"] for row in rows] + [row["target"] for row in rows])


@pytest.fixture
def pairs(rows) -> datasets.Dataset:
    return datasets.Dataset.from_list(rows)


def column(dataset: datasets.Dataset, name: str) -> list:
    return list(dataset[name])


def test_default_source_prefix():
    assert default_source_prefix("t5", "translation", "en", "de") == "translate English to German: "
    assert default_source_prefix("mt5", "translation", "en", "ro") == "translate English to Romanian: "
    assert default_source_prefix("t5", "summarization") == "summarize: "
    assert default_source_prefix("bart", "summarization") is None
    assert default_source_prefix("t5", None) is None
    with pytest.raises(ValueError, match="no T5 prefix for languages"):
        default_source_prefix("t5", "translation", "en", "ja")


def test_tokenize_pairs_adds_ids_and_applies_the_prefix(pairs, tokenizer):
    prefix = "summarize: "
    tokenized = tokenize_pairs(pairs, tokenizer, source_prefix=prefix, max_source_length=512, max_target_length=512)

    assert tokenized.column_names == ["id", "source", "target", "input_ids", "labels"]
    assert column(tokenized, "input_ids") == tokenizer([prefix + s for s in column(pairs, "source")])["input_ids"]
    assert column(tokenized, "labels") == tokenizer(text_target=column(pairs, "target"))["input_ids"]
    assert all(ids[-1] == tokenizer.eos_token_id for ids in column(tokenized, "labels"))
    sources_only = tokenize_pairs(pairs, tokenizer, with_targets=False)
    assert "labels" not in sources_only.column_names
    assert column(sources_only, "input_ids") == tokenizer(column(pairs, "source"))["input_ids"]


def test_overlong_pairs_are_dropped_and_counted_or_truncated(pairs, tokenizer, caplog):
    source_lengths = [len(ids) for ids in tokenizer(column(pairs, "source"))["input_ids"]]
    target_lengths = [len(ids) for ids in tokenizer(text_target=column(pairs, "target"))["input_ids"]]
    limit = sorted(source_lengths)[len(source_lengths) // 2]
    fits = [s <= limit and t <= limit for s, t in zip(source_lengths, target_lengths, strict=True)]
    assert 0 < sum(fits) < len(fits)

    with caplog.at_level(logging.WARNING, logger="specdec_hf.data.tokenization"):
        kept = tokenize_pairs(pairs, tokenizer, max_source_length=limit, max_target_length=limit)
    truncated = tokenize_pairs(pairs, tokenizer, max_source_length=limit, max_target_length=limit, overlong="truncate")

    assert column(kept, "id") == [row_id for row_id, fit in zip(column(pairs, "id"), fits, strict=True) if fit]
    assert f"dropped {len(fits) - sum(fits)} of {len(fits)} pairs" in caplog.text
    assert truncated.num_rows == pairs.num_rows
    assert max(len(ids) for ids in column(truncated, "input_ids") + column(truncated, "labels")) == limit
    assert all(
        ids[-1] == tokenizer.eos_token_id for ids in column(truncated, "input_ids") + column(truncated, "labels")
    )


def test_tokenization_of_file_data_is_cached(tmp_path, rows, tokenizer):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    dataset = load_text_pairs(DataArguments(data_files=str(path), cache_dir=str(tmp_path / "cache")), "train")

    first = tokenize_pairs(dataset, tokenizer, max_source_length=512, max_target_length=512)
    second = tokenize_pairs(dataset, tokenizer, max_source_length=512, max_target_length=512)

    assert first.cache_files and first.cache_files == second.cache_files
    assert column(first, "input_ids") == column(second, "input_ids")


def test_bad_arguments(pairs, tokenizer):
    with pytest.raises(ValueError, match="`overlong` must be 'drop' or 'truncate'"):
        tokenize_pairs(pairs, tokenizer, overlong="cut")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['target'\]"):
        tokenize_pairs(pairs.remove_columns("target"), tokenizer)


def test_check_tokenizer_matches(tokenizer):
    check_tokenizer_matches(tokenizer, build_verifier("bart").config)

    small = BartConfig(vocab_size=50, pad_token_id=1, eos_token_id=2, bos_token_id=0)
    with pytest.raises(ValueError, match=rf"{len(tokenizer)} tokens but the verifier's vocabulary has 50"):
        check_tokenizer_matches(tokenizer, small)
    other_pad = BartConfig(vocab_size=VOCAB_SIZE, pad_token_id=0, eos_token_id=2, bos_token_id=0)
    with pytest.raises(ValueError, match="tokenizer pad_token_id = 1 but the verifier's pad_token_id = 0"):
        check_tokenizer_matches(tokenizer, other_pad)


@pytest.mark.parametrize(
    ("tokenizer_limit", "config", "expected"),
    [
        (int(1e30), {"max_position_embeddings": 320}, 320),  # a tokenizer without a limit states a sentinel
        (512, {"max_position_embeddings": 1024}, 512),
        (int(1e30), {"n_positions": 256}, 256),
        (int(1e30), {}, 1024),  # nothing stated: the default
    ],
)
def test_source_length_limit_is_the_least_stated_limit(tokenizer_limit, config, expected):
    tokenizer = SimpleNamespace(model_max_length=tokenizer_limit)
    assert source_length_limit(tokenizer, SimpleNamespace(config=SimpleNamespace(**config))) == expected
