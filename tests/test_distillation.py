"""Sequence-level distillation: the written rows are the verifier's own greedy (or beam) outputs, and an interrupted
run resumes from its shards without recomputing them and ends with the same dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch
import yaml
from conftest import build_verifier, build_word_tokenizer
from transformers import PreTrainedTokenizerFast

from specdec_hf.data import DataArguments, load_text_pairs
from specdec_hf.data.padding import trim_at_eos
from specdec_hf.distillation import (
    CONFIG_NAME,
    DistillationSettings,
    distill,
    load_distilled_dataset,
    main,
    weights_digest,
)

FIXTURE = Path(__file__).parent / "fixtures" / "mt_fixture.jsonl"
MAX_NEW_TOKENS = 8
SETTINGS = dict(batch_size=8, max_new_tokens=MAX_NEW_TOKENS, shard_size=8)


def run_distill(verifier, tokenizer, dataset, output_dir, **overrides):
    """`distill` with the test's settings (`overrides` replace some) and no progress bar."""
    settings = DistillationSettings(output_dir=str(output_dir), **{**SETTINGS, **overrides})
    return distill(verifier, tokenizer, dataset, settings, progress=False)


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> DataArguments:
    cache_dir = tmp_path_factory.mktemp("cache")
    return DataArguments(
        data_files=str(FIXTURE), source_lang="en", target_lang="de", max_samples=20, cache_dir=str(cache_dir)
    )


@pytest.fixture(scope="module")
def dataset(data_args) -> datasets.Dataset:
    return load_text_pairs(data_args, "train")


@pytest.fixture(scope="module")
def tokenizer(dataset) -> PreTrainedTokenizerFast:
    return build_word_tokenizer(list(dataset["source"]))


@pytest.fixture(scope="module")
def verifier():
    return build_verifier("bart")  # vocabulary 99 and BART's special ids, like `tokenizer`


class CountingGenerate:
    """Wraps `verifier.generate` to count the sources it decodes."""

    def __init__(self, verifier, monkeypatch):
        self.sources = 0
        self._generate = verifier.generate
        monkeypatch.setattr(verifier, "generate", self)

    def __call__(self, input_ids, **kwargs):
        self.sources += input_ids.shape[0]
        return self._generate(input_ids=input_ids, **kwargs)


def expected_target_ids(verifier, tokenizer, sources: list[str], **generate_kwargs) -> list[list[int]]:
    """Each source decoded alone (batch 1, no padding), cut after the first EOS."""
    targets = []
    for source in sources:
        input_ids = torch.tensor([tokenizer(source)["input_ids"]])
        sequences = verifier.generate(
            input_ids=input_ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, **generate_kwargs
        )
        targets += trim_at_eos(sequences, verifier.generation_config.eos_token_id)
    return targets


def test_distill_writes_the_verifiers_greedy_outputs(tmp_path, verifier, tokenizer, dataset):
    result = run_distill(verifier, tokenizer, dataset, tmp_path / "out")

    sources = list(dataset["source"])
    target_ids = expected_target_ids(verifier, tokenizer, sources)
    assert result.column_names == ["id", "source", "target", "reference", "input_ids", "target_ids"]
    assert list(result["source"]) == sources and list(result["reference"]) == list(dataset["target"])
    assert list(result["input_ids"]) == tokenizer(sources)["input_ids"]
    assert list(result["target_ids"]) == target_ids
    assert list(result["target"]) == tokenizer.batch_decode(target_ids, skip_special_tokens=True)
    assert all(ids[0] == verifier.config.decoder_start_token_id for ids in target_ids)
    assert sorted(path.name for path in (tmp_path / "out" / "shards").glob("*.parquet")) == [
        "shard-00000.parquet",
        "shard-00001.parquet",
        "shard-00002.parquet",
    ]
    config = json.loads((tmp_path / "out" / CONFIG_NAME).read_text())
    assert config["num_examples"] == 20 and config["num_beams"] == 1 and config["max_new_tokens"] == MAX_NEW_TOKENS
    assert list(load_distilled_dataset(tmp_path / "out")["target_ids"]) == target_ids


def test_beam_search_outputs_and_source_prefix(tmp_path, verifier, tokenizer, dataset):
    subset = dataset.select(range(4))
    prefix = "translate English to German: "
    result = run_distill(verifier, tokenizer, subset, tmp_path / "beam", num_beams=2, source_prefix=prefix)

    sources = [prefix + source for source in subset["source"]]
    assert list(result["input_ids"]) == tokenizer(sources)["input_ids"]
    assert list(result["target_ids"]) == expected_target_ids(verifier, tokenizer, sources, num_beams=2)


def test_sources_are_cut_to_what_the_verifier_reads(tmp_path, tokenizer, dataset):
    """Unset, `max_source_length` is the verifier's position limit; beyond it the run is refused before anything of
    an earlier run is removed."""
    limit = MAX_NEW_TOKENS + 2  # the decoder reads its start token and MAX_NEW_TOKENS more
    verifier = build_verifier("bart", max_position_embeddings=limit)
    subset = dataset.select(range(4))
    assert max(len(ids) for ids in tokenizer(list(subset["source"]))["input_ids"]) > limit

    result = run_distill(verifier, tokenizer, subset, tmp_path / "cut")

    assert max(len(ids) for ids in result["input_ids"]) == limit
    assert all(ids[-1] == tokenizer.eos_token_id for ids in result["input_ids"])
    assert json.loads((tmp_path / "cut" / CONFIG_NAME).read_text())["max_source_length"] == limit
    with pytest.raises(ValueError, match=f"`max_source_length` is {limit + 1}.*cover {limit} tokens"):
        run_distill(
            verifier, tokenizer, subset, tmp_path / "cut", max_source_length=limit + 1, overwrite_output_dir=True
        )
    assert (tmp_path / "cut" / CONFIG_NAME).is_file()  # refused before the overwrite


def test_a_run_that_recorded_a_longer_source_limit_resumes(tmp_path, tokenizer, dataset):
    """Runs started when the default was 1024 whatever the verifier could read held no longer source: they resume."""
    verifier = build_verifier("bart", max_position_embeddings=64)
    reference = run_distill(verifier, tokenizer, dataset, tmp_path / "reference")
    output_dir = tmp_path / "old"
    assert run_distill(verifier, tokenizer, dataset, output_dir, max_shards=1) is None
    settings_file = output_dir / "shards" / "settings.json"
    settings = json.loads(settings_file.read_text())
    settings_file.write_text(json.dumps({**settings, "max_source_length": 1024}))
    other = build_verifier("bart", seed=1, max_position_embeddings=64)
    other.name_or_path = verifier.name_or_path
    with pytest.raises(ValueError, match="weights changed"):
        run_distill(other, tokenizer, dataset, output_dir)
    assert json.loads(settings_file.read_text())["max_source_length"] == 1024  # a refused run changes no record

    assert run_distill(verifier, tokenizer, dataset, output_dir).to_list() == reference.to_list()
    assert json.loads(settings_file.read_text())["max_source_length"] == 64


def test_a_verifier_without_a_position_table_takes_longer_sources(tmp_path, tokenizer, dataset):
    verifier = build_verifier("t5", pad_token_id=1, eos_token_id=2, decoder_start_token_id=1)  # the tokenizer's ids
    result = run_distill(verifier, tokenizer, dataset.select(range(2)), tmp_path / "t5", max_source_length=4096)
    assert json.loads((tmp_path / "t5" / CONFIG_NAME).read_text())["max_source_length"] == 4096
    assert result.num_rows == 2


def test_interrupted_run_resumes_from_its_shards(tmp_path, monkeypatch, verifier, tokenizer, dataset):
    reference = run_distill(verifier, tokenizer, dataset, tmp_path / "reference")
    output_dir = tmp_path / "resumed"
    generate = CountingGenerate(verifier, monkeypatch)

    assert run_distill(verifier, tokenizer, dataset, output_dir, max_shards=1) is None
    assert generate.sources == 8 and not (output_dir / CONFIG_NAME).exists()
    with pytest.raises(FileNotFoundError, match="unfinished distillation: run \\(or rerun, to resume\\)"):
        load_distilled_dataset(output_dir)
    (output_dir / "shards" / "shard-00001.parquet.tmp").write_bytes(b"half a shard")  # a kill mid-write
    resumed = run_distill(verifier, tokenizer, dataset, output_dir)
    assert generate.sources == 20  # only the 12 sources of the two unfinished shards were decoded again

    # A finished run is loaded, not recomputed; with the merged output lost, the shards alone rebuild it.
    run_distill(verifier, tokenizer, dataset, output_dir)
    (output_dir / CONFIG_NAME).unlink()
    rebuilt = run_distill(verifier, tokenizer, dataset, output_dir)
    assert generate.sources == 20
    for result in (resumed, rebuilt):
        assert result.to_list() == reference.to_list()


def test_bad_input_and_output_dir_of_another_run_are_refused(tmp_path, verifier, tokenizer, dataset):
    output_dir = tmp_path / "out"
    run_distill(verifier, tokenizer, dataset.select(range(8)), output_dir)

    with pytest.raises(ValueError, match=r"other settings \(max_new_tokens: 8 -> 4\).*--overwrite_output_dir"):
        run_distill(verifier, tokenizer, dataset, output_dir, max_new_tokens=4)
    with pytest.raises(ValueError, match="holds other sources than this data"):
        run_distill(verifier, tokenizer, dataset.select(range(10, 18)), output_dir)
    with pytest.raises(ValueError, match="no rows: nothing to distill"):
        run_distill(verifier, tokenizer, dataset.select([]), tmp_path / "empty")
    overwritten = run_distill(
        verifier, tokenizer, dataset.select(range(10, 18)), output_dir, overwrite_output_dir=True
    )
    assert list(overwritten["source"]) == list(dataset["source"])[10:18]


def test_resuming_after_other_weights_were_saved_to_the_verifier_path_is_refused(tmp_path, tokenizer, dataset):
    """The shards are keyed by the verifier's weights, not its path (the name_or_path stays the same)."""
    first, second = build_verifier("bart"), build_verifier("bart", seed=1)
    for model in (first, second):
        model.name_or_path = str(tmp_path / "verifier")
    output_dir = tmp_path / "out"
    assert run_distill(first, tokenizer, dataset, output_dir, max_shards=1) is None
    with pytest.raises(ValueError, match="the verifier's weights changed.*--overwrite_output_dir"):
        run_distill(second, tokenizer, dataset, output_dir)
    assert run_distill(first, tokenizer, dataset, output_dir).num_rows == dataset.num_rows


def test_shards_of_a_run_without_a_weights_digest_are_kept_and_the_digest_recorded(
    tmp_path, verifier, tokenizer, dataset
):
    output_dir = tmp_path / "out"
    assert run_distill(verifier, tokenizer, dataset, output_dir, max_shards=1) is None
    settings_path = output_dir / "shards" / "settings.json"
    settings = json.loads(settings_path.read_text())
    del settings["verifier_sha256"]  # as written before the digest existed
    settings_path.write_text(json.dumps(settings))
    assert run_distill(verifier, tokenizer, dataset, output_dir).num_rows == dataset.num_rows
    assert json.loads(settings_path.read_text())["verifier_sha256"] == weights_digest(verifier)


def test_command_line(tmp_path, verifier, tokenizer, data_args):
    model_dir = tmp_path / "verifier"
    verifier.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    output_dir = tmp_path / "distilled"
    config_path = tmp_path / "distill.yaml"
    values = {"verifier": str(model_dir), "data_files": {"train": str(FIXTURE)}, "source_lang": "en", "batch_size": 4}
    config_path.write_text(yaml.safe_dump(values), encoding="utf-8")

    main(
        ["--config", str(config_path), "--target_lang", "de", "--max_samples", "6", "--cache_dir", data_args.cache_dir]
        + ["--output_dir", str(output_dir), "--max_new_tokens", "4", "--shard_size", "4"]
    )

    result = datasets.load_from_disk(str(output_dir))
    config = json.loads((output_dir / CONFIG_NAME).read_text())
    assert result.num_rows == 6 and len(result[0]["target_ids"]) <= 5
    assert config["verifier"] == str(model_dir) and config["data"]["source_lang"] == "en"


def test_command_line_names_a_missing_verifier_and_a_malformed_data_file(tmp_path, verifier, tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path of four parts: no Hub id either
    broken = tmp_path / "distil_bad.jsonl"
    broken.write_text("{oops}\n")
    values = {"data_files": [f"train={broken}"], "source_lang": "en", "target_lang": "de", "output_dir": "out"}
    values["cache_dir"] = str(tmp_path / "cache")
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump({**values, "verifier": "runs/demo/verifier/best"}))
    with pytest.raises(FileNotFoundError, match=r"`verifier` 'runs/demo/verifier/best': no such directory"):
        main(["--config", str(config)])
    verifier.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    config.write_text(yaml.safe_dump({**values, "verifier": str(tmp_path / "verifier")}))
    with pytest.raises(ValueError, match=rf"data file '{broken}', line 1: not valid JSON"):
        main(["--config", str(config)])


def test_damaged_distilled_dataset_names_its_directory(tmp_path):
    """Arrow said "Expected to be able to read 36016 bytes for message body, got 17604", naming nothing."""
    output_dir = tmp_path / "distilled"
    datasets.Dataset.from_dict({"input_ids": [[5, 6, 2]] * 500, "target_ids": [[2, 7, 2]] * 500}).save_to_disk(
        str(output_dir)
    )
    (output_dir / CONFIG_NAME).write_text("{}")
    (arrow_file,) = output_dir.glob("data-*.arrow")
    arrow_file.write_bytes(arrow_file.read_bytes()[: arrow_file.stat().st_size // 2])
    with pytest.raises(OSError, match=rf"distilled dataset in '{output_dir}' cannot be read .*--overwrite_output_dir"):
        load_distilled_dataset(output_dir)


def _saved(tmp_path, columns: dict) -> Path:
    output_dir = tmp_path / "distilled"
    datasets.Dataset.from_dict(columns).save_to_disk(str(output_dir))
    (output_dir / CONFIG_NAME).write_text("{}")
    return output_dir


@pytest.mark.parametrize(
    "columns, vocab_size, match",
    [
        ({"input_ids": [], "target_ids": []}, None, "holds no rows: nothing to train on"),
        ({"input_ids": ["5 6 2"], "target_ids": [[2, 7, 2]]}, None, "column `input_ids` holds string, not lists"),
        ({"input_ids": [[5, 6, 2]], "target_ids": [[2.0, 7.5]]}, None, "column `target_ids` holds list<item: double>"),
        ({"input_ids": [[5, 6, 2]], "target_ids": [[2, 120, 2]]}, 99, r"ids from 2 to 120, outside .*\[0, 99\)"),
        ({"input_ids": [[-1, 6, 2]], "target_ids": [[2, 7, 2]]}, 99, r"`input_ids` holds ids from -1 to 6"),
    ],
)
def test_distilled_data_that_cannot_train_is_named(tmp_path, columns, vocab_size, match):
    if not columns["input_ids"]:  # an empty dataset still needs the columns' types
        features = datasets.Features({name: datasets.Sequence(datasets.Value("int64")) for name in columns})
        output_dir = tmp_path / "distilled"
        datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(output_dir))
        (output_dir / CONFIG_NAME).write_text("{}")
    else:
        output_dir = _saved(tmp_path, columns)
    with pytest.raises(ValueError, match=match):
        load_distilled_dataset(output_dir, vocab_size)


def test_a_damaged_shard_is_decoded_again(tmp_path, verifier, tokenizer, dataset):
    """pyarrow alone said "Parquet magic bytes not found in footer": the shard is derived data, so it is redone."""
    output_dir = tmp_path / "out"
    reference = run_distill(verifier, tokenizer, dataset, tmp_path / "reference")
    assert run_distill(verifier, tokenizer, dataset, output_dir, max_shards=2) is None
    shard = output_dir / "shards" / "shard-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    assert run_distill(verifier, tokenizer, dataset, output_dir).to_list() == reference.to_list()
