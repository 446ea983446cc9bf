"""Loaders of (source, target) pairs: local formats, the registered datasets' column mappings, the Debian corpora, and
the errors for bad input. Nothing here touches the network: Hub loaders are exercised on local data of their schema.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
from pathlib import Path

import datasets
import pytest
from transformers import HfArgumentParser

from specdec_hf.data import KNOWN_DATASETS, DataArguments, load_text_pair_splits, load_text_pairs
from specdec_hf.data.loading import sample_indices
from specdec_hf.data.local_files import read_jsonl as read_jsonl_rows

FIXTURES = Path(__file__).parent.parent / "fixtures"
CONFIGS = Path(__file__).parent.parent.parent / "configs" / "data"


def read_jsonl(path: Path, limit: int = 12) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(limit), strict=False)]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def mt_rows() -> list[dict]:
    return read_jsonl(FIXTURES / "mt_fixture.jsonl")


@pytest.fixture(scope="module")
def sum_rows() -> list[dict]:
    return read_jsonl(FIXTURES / "sum_fixture.jsonl")


@pytest.fixture
def flat_rows(mt_rows) -> list[dict]:
    """Plain `source`/`target` rows; the first source has quotes and a tab-free comma, as real TSV/CSV text does."""
    rows = [{"source": row["translation"]["en"], "target": row["translation"]["de"]} for row in mt_rows]
    rows[0]["source"] = 'The "Export" dialog, opened with "File".'
    return rows


def load(tmp_path: Path, split: str = "train", **kwargs) -> datasets.Dataset:
    return load_text_pairs(DataArguments(cache_dir=str(tmp_path / "cache"), **kwargs), split)


def pairs(dataset: datasets.Dataset) -> list[tuple[str, str]]:
    return list(zip(dataset["source"], dataset["target"], strict=True))


# ----------------------------------------------------------------------------------------------------------------
# Local files
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".tsv", ".parquet"])
def test_local_formats_give_the_common_schema(tmp_path, flat_rows, suffix):
    path = tmp_path / f"pairs{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, flat_rows)
    elif suffix == ".json":
        path.write_text(json.dumps(flat_rows, ensure_ascii=False), encoding="utf-8")
    elif suffix == ".csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["source", "target"])
            writer.writeheader()
            writer.writerows(flat_rows)
    elif suffix == ".tsv":
        lines = ["source\ttarget"] + [f"{row['source']}\t{row['target']}" for row in flat_rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        datasets.Dataset.from_list(flat_rows).to_parquet(str(path))

    dataset = load(tmp_path, data_files=[str(path)])

    assert dataset.column_names == ["id", "source", "target"]
    assert pairs(dataset) == [(row["source"], row["target"]) for row in flat_rows]
    assert dataset["id"] == [str(i) for i in range(len(flat_rows))]  # no id column: the row number


def test_nested_translation_rows_by_language_and_by_dotted_column(tmp_path, mt_rows):
    path = write_jsonl(tmp_path / "mt.jsonl", mt_rows)
    expected = [(row["translation"]["en"], row["translation"]["de"]) for row in mt_rows]

    assert pairs(load(tmp_path, data_files=[path], source_lang="en", target_lang="de")) == expected
    assert pairs(load(tmp_path, data_files=[path], source_lang="de", target_lang="en")) == [
        (t, s) for s, t in expected
    ]
    dotted = load(tmp_path, data_files=[path], source_column="translation.en", target_column="translation.de")
    assert pairs(dotted) == expected


def test_summarization_columns_and_ids_are_found_without_configuration(tmp_path, sum_rows):
    dataset = load(tmp_path, data_files=write_jsonl(tmp_path / "sum.jsonl", sum_rows))

    assert pairs(dataset) == [(row["document"], row["summary"]) for row in sum_rows]
    assert dataset["id"] == [row["id"] for row in sum_rows]


def test_named_splits_max_samples_and_splits_dict(tmp_path, flat_rows):
    train = write_jsonl(tmp_path / "a.jsonl", flat_rows)
    validation = write_jsonl(tmp_path / "b.jsonl", flat_rows[:3])

    by_items = load(tmp_path, "validation", data_files=[f"train={train}", f"validation={validation}"])
    by_dict = load(tmp_path, "train", data_files={"train": train, "validation": validation}, max_samples=5)
    both = load_text_pair_splits(DataArguments(data_files={"train": train, "validation": validation}))

    assert pairs(by_items) == pairs(load(tmp_path, data_files=validation))
    assert by_dict.num_rows == 5
    assert isinstance(both, datasets.DatasetDict) and {k: v.num_rows for k, v in both.items()} == {
        "train": len(flat_rows),
        "validation": 3,
    }


def test_command_line_and_yaml_parsing(tmp_path):
    (args,) = HfArgumentParser(DataArguments).parse_args_into_dataclasses(
        args=["--data_files", "train=a.jsonl", "test=b.tsv", "--source_lang", "en", "--target_lang", "de"]
    )
    assert args.data_files == {"train": ["a.jsonl"], "test": ["b.tsv"]}
    assert args.task == "translation" and args.languages == ("en", "de")

    for path in sorted(CONFIGS.glob("*.yaml")):
        (config,) = HfArgumentParser(DataArguments).parse_yaml_file(str(path))
        assert config.known is not None, path


# ----------------------------------------------------------------------------------------------------------------
# Registered datasets: the Hub loaders' column mapping, on local data of the same schema
# ----------------------------------------------------------------------------------------------------------------
def _wmt_rows(mt_rows: list[dict], other: str) -> list[dict]:
    return [{"translation": {other: row["translation"]["de"], "en": row["translation"]["en"]}} for row in mt_rows]


def test_wmt_local_copies_use_the_registered_directions(tmp_path, mt_rows):
    wmt14 = write_jsonl(tmp_path / "wmt14.jsonl", _wmt_rows(mt_rows, "de"))
    wmt16 = write_jsonl(tmp_path / "wmt16.jsonl", _wmt_rows(mt_rows, "ro"))
    en_de = [(row["translation"]["en"], row["translation"]["de"]) for row in mt_rows]

    assert pairs(load(tmp_path, dataset_name="wmt14", data_files=wmt14)) == en_de
    assert pairs(load(tmp_path, dataset_name="wmt16", data_files=wmt16)) == en_de  # en -> "ro" by default
    reverse = load(tmp_path, dataset_name="wmt/wmt14", data_files=wmt14, source_lang="de", target_lang="en")
    assert pairs(reverse) == [(t, s) for s, t in en_de]


def test_summarization_local_copies_use_the_registered_columns(tmp_path, sum_rows):
    cnn = [{"article": r["document"], "highlights": r["summary"], "id": r["id"]} for r in sum_rows]
    xsum = [{"document": r["document"], "summary": r["summary"], "id": r["id"]} for r in sum_rows]
    expected = [(r["document"], r["summary"]) for r in sum_rows]

    for name, rows in (("cnn_dailymail", cnn), ("xsum", xsum)):
        dataset = load(
            tmp_path, "test", dataset_name=name, data_files={"test": write_jsonl(tmp_path / f"{name}.jsonl", rows)}
        )
        assert pairs(dataset) == expected and dataset["id"] == [r["id"] for r in sum_rows]


@pytest.mark.parametrize(
    "name, hub_id, config_name, schema",
    [
        ("wmt14", "wmt/wmt14", "de-en", "translation"),
        ("wmt16", "wmt/wmt16", "ro-en", "translation"),
        ("cnn_dailymail", "abisee/cnn_dailymail", "3.0.0", "cnn"),
        ("xsum", "EdinburghNLP/xsum", None, "xsum"),
    ],
)
def test_hub_loading_calls_the_real_dataset_and_maps_its_columns(monkeypatch, name, hub_id, config_name, schema):
    calls = []
    hub_rows = {
        "translation": [{"translation": {"de": "Hallo Welt.", "en": "Hello world.", "ro": "Salut lume."}}],
        "cnn": [{"article": "A long article.", "highlights": "Short.", "id": "a1"}],
        "xsum": [{"document": "A long document.", "summary": "Short.", "id": "x1"}],
    }[schema]

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs["split"]))
        return datasets.Dataset.from_list(hub_rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset = load_text_pairs(DataArguments(dataset_name=name), "validation")

    assert calls == [(hub_id, config_name, "validation")]
    assert dataset.num_rows == 1 and dataset[0]["source"].startswith(("Hello", "A long"))


def test_unreachable_hub_dataset_names_the_dataset_and_the_offline_fix(monkeypatch):
    def offline(path, name=None, **kwargs):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match=r"wmt/wmt14.*HF_HUB_OFFLINE.*--data_files"):
        load_text_pairs(DataArguments(dataset_name="wmt14"), "train")


# ----------------------------------------------------------------------------------------------------------------
# Offline Debian corpora
# ----------------------------------------------------------------------------------------------------------------
def test_debian_corpora_read_their_directories(tmp_path, monkeypatch, mt_rows, sum_rows):
    monkeypatch.chdir(tmp_path)  # the registered default directories are relative: data/debian_en_de, data/debian_sum
    write_jsonl(tmp_path / "data" / "debian_en_de" / "validation.jsonl", mt_rows)
    write_jsonl(tmp_path / "elsewhere" / "test.jsonl", sum_rows)

    mt = load(tmp_path, "validation", dataset_name="debian_en_de")
    summaries = load(tmp_path, "test", dataset_name="debian_sum", data_dir=str(tmp_path / "elsewhere"))

    assert pairs(mt) == [(row["translation"]["en"], row["translation"]["de"]) for row in mt_rows]
    assert summaries["id"] == [row["id"] for row in sum_rows]


@pytest.mark.parametrize("name, task", [("debian_en_de", "translation"), ("debian_sum", "summarization")])
def test_missing_debian_corpus_says_how_to_build_it(tmp_path, monkeypatch, name, task):
    monkeypatch.chdir(tmp_path)
    command = f"python -m specdec_hf.data.debian_corpus --task {task} --output_dir {KNOWN_DATASETS[name].path}"
    with pytest.raises(FileNotFoundError, match=command):
        load(tmp_path, dataset_name=name)


def test_missing_split_file_in_a_directory_lists_what_is_there(tmp_path, mt_rows):
    write_jsonl(tmp_path / "corpus" / "train.jsonl", mt_rows)
    with pytest.raises(FileNotFoundError, match=r"split 'test'.*train\.jsonl"):
        load(tmp_path, "test", data_dir=str(tmp_path / "corpus"), source_lang="en", target_lang="de")


# ----------------------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------------------
def test_missing_column_is_named_with_the_columns_present(tmp_path, sum_rows):
    path = write_jsonl(tmp_path / "sum.jsonl", sum_rows)
    with pytest.raises(ValueError, match=r"source column 'text' not found.*'document'.*--source_column"):
        load(tmp_path, data_files=path, source_column="text", target_column="summary")


def test_rows_with_empty_or_missing_texts_are_skipped_and_counted(tmp_path, flat_rows, caplog):
    rows = flat_rows[:6]
    rows[1]["source"], rows[3]["target"], rows[4]["source"] = "", None, "   "
    with caplog.at_level(logging.WARNING, logger="specdec_hf.data.loading"):
        dataset = load(tmp_path, data_files=write_jsonl(tmp_path / "pairs.jsonl", rows))

    assert dataset["id"] == ["0", "2", "5"]
    assert "skipped 3 of 6 rows" in caplog.text


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"dataset_name": "wmt15"}, ValueError, r"unknown dataset 'wmt15'.*registered datasets.*--data_files"),
        ({}, ValueError, "no data given"),
        ({"data_files": "missing.jsonl"}, FileNotFoundError, r"'missing\.jsonl'.*does not exist"),
        ({"dataset_name": "wmt14", "source_lang": "en"}, ValueError, "give both `source_lang` and `target_lang`"),
        ({"dataset_name": "wmt14", "source_lang": "en", "target_lang": "fr"}, ValueError, r"languages \['de', 'en'\]"),
        ({"data_files": ["a.jsonl", "test=b.jsonl"]}, ValueError, "name the split of every data file or of none"),
        ({"data_files": "x.jsonl", "max_samples": 0}, ValueError, "`max_samples` must be positive"),
    ],
)
def test_bad_arguments_raise_clear_errors(tmp_path, monkeypatch, kwargs, error, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=message):
        load(tmp_path, **kwargs)


def test_bad_files_raise_clear_errors(tmp_path, mt_rows):
    path = write_jsonl(tmp_path / "mt.jsonl", mt_rows)
    (tmp_path / "pairs.txt").write_text("a\tb\n", encoding="utf-8")

    with pytest.raises(ValueError, match="set `--source_lang` and `--target_lang`"):
        load(tmp_path, data_files=path)
    with pytest.raises(ValueError, match=r"form the `train` split only.*--data_files test="):
        load(tmp_path, "test", data_files=path)
    with pytest.raises(ValueError, match=r"split 'test' is not in data_files.*\['train'\]"):
        load(tmp_path, "test", data_files={"train": path})
    with pytest.raises(ValueError, match="supported formats are"):
        load(tmp_path, data_files=str(tmp_path / "pairs.txt"))
    with pytest.raises(IsADirectoryError, match=r"is a directory: name the files in it.*--data_dir"):
        load(tmp_path, data_files=str(tmp_path))
    (tmp_path / "pairs.csv").write_text("source,target\na,b\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"the train files mix formats \['\.csv', '\.jsonl'\]; convert them to one"):
        load(tmp_path, data_files=[path, str(tmp_path / "pairs.csv")])


def test_malformed_json_lines_row_names_the_file_and_line(tmp_path, mt_rows):
    """`datasets` said "An error occurred while generating the dataset" (its cause: a position, no file, no line)."""
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(mt_rows[0]) + "\n\n" + '{"translation": {"en": "Open the file", "de": \n')
    with pytest.raises(ValueError, match=rf"data file '{path}', line 3: not valid JSON .*fix or remove that line"):
        load(tmp_path, data_files=str(path), source_lang="en", target_lang="de")
    array = tmp_path / "array.jsonl"
    array.write_text(json.dumps(mt_rows[0]) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"array\.jsonl', line 2: a JSON Lines row must be an object"):
        load(tmp_path, data_files=str(array), source_lang="en", target_lang="de")
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps({"source": "Größe", "target": "size"}, ensure_ascii=False).encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.jsonl'\] \[train\] is not UTF-8 text"):
        load(tmp_path, data_files=str(latin1))
    gzipped = tmp_path / "broken.jsonl.gz"
    with gzip.open(gzipped, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps(mt_rows[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=rf"data file '{gzipped}', line 2: not valid JSON"):
        load(tmp_path, data_files=str(gzipped), source_lang="en", target_lang="de")
    document = tmp_path / "doc.json"  # one JSON document, not JSON Lines: its own line and column
    document.write_text(json.dumps([mt_rows[0]]).rstrip("]") + ',\n {"translation": }]')
    with pytest.raises(
        ValueError, match=rf"data file '{document}', line 2, column \d+: not valid JSON \(Expecting value\)"
    ):
        load(tmp_path, data_files=str(document), source_lang="en", target_lang="de")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv", ".jsonl.gz"])
def test_empty_file_is_named(tmp_path, content, suffix):
    """An empty `.jsonl` raised a bare StopIteration from `datasets`; blank lines "corresponds to no data!"."""
    path = tmp_path / f"empty{suffix}"
    if suffix.endswith(".gz"):
        with gzip.open(path, "wt") as handle:
            handle.write(content)
    else:
        path.write_text(content)
    with pytest.raises(ValueError, match=rf"data file '{path}' is empty \(no rows, or only blank lines\)"):
        load(tmp_path, "test", data_files=[f"test={path}"], source_column="source", target_column="target")


def test_row_lacking_its_target_key_is_reported_as_a_missing_target(tmp_path, mt_rows, caplog):
    """Rows of mixed shape become one JSON column in `datasets`, once reported as "source column not found"."""
    rows = [mt_rows[0], {"translation": {"en": "Open the file."}}, mt_rows[2], {"translation": {"de": "Nur Deutsch"}}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="specdec_hf.data.loading"):
        dataset = load(tmp_path, data_files=path, source_lang="en", target_lang="de")
    assert pairs(dataset) == [tuple(row["translation"][lang] for lang in ("en", "de")) for row in (rows[0], rows[2])]
    assert "skipped 2 of 4 rows" in caplog.text
    assert "the first is row 2, counting from 1, whose target 'translation.de' is empty or missing" in caplog.text
    no_target = write_jsonl(tmp_path / "en_only.jsonl", [{"translation": {"en": "Hello ."}}] * 2)
    with pytest.raises(ValueError, match=r"target column 'translation\.de' not found"):
        load(tmp_path, data_files=no_target, source_lang="en", target_lang="de")
    flat = write_jsonl(tmp_path / "flat.jsonl", [{"source": "Hello ."}])
    with pytest.raises(ValueError, match=r"a `source` column but no `target` column"):
        load(tmp_path, data_files=flat)


def test_unreadable_parquet_and_csv_files_are_named(tmp_path, flat_rows):
    parquet = tmp_path / "pairs.parquet"
    datasets.Dataset.from_list(flat_rows).to_parquet(str(parquet))
    parquet.write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"data file '{parquet}' is not a readable Parquet file.*truncated"):
        load(tmp_path, data_files=str(parquet))
    quoted = tmp_path / "pairs.csv"
    quoted.write_text('source,target\n"an unclosed quote,b\n')
    with pytest.raises(ValueError, match=rf"cannot read '{quoted}' as comma-separated text: ParserError"):
        load(tmp_path, data_files=str(quoted))


def test_read_jsonl_names_the_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n')
    rows = read_jsonl_rows(path)
    assert next(rows) == {"a": 1}
    with pytest.raises(ValueError, match=r"rows\.jsonl', line 3: not valid JSON"):
        next(rows)


def test_sample_indices_draws_like_evaluate_in_split_order():
    """`--limit N --limit_seed S`: N rows drawn with S, in the split's order; every row when there are no more."""
    drawn = sample_indices(50, 7, 3)
    assert drawn == sorted(drawn) and len(set(drawn)) == 7 and all(0 <= row < 50 for row in drawn)
    assert drawn == sample_indices(50, 7, 3) and drawn != sample_indices(50, 7, 4)
    assert sample_indices(5, 5, 0) == sample_indices(5, 9, 0) == [0, 1, 2, 3, 4]
