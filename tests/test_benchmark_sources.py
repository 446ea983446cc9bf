"""benchmarks/_common.py's `read_sources`: the held-out rows of both demo pairs, and a clear error for others."""

from __future__ import annotations

import json

import pytest
from conftest import load_repository_script


class _Tokenizer:
    def __call__(self, text, return_tensors=None):
        return {"text": text}


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_translation_and_summarization_rows_give_their_sources(tmp_path):
    common = load_repository_script("benchmarks/_common.py", "benchmarks_common")
    translation = _write(tmp_path / "mt.jsonl", [{"translation": {"en": "a b", "de": "c"}}] * 3)
    summarization = _write(tmp_path / "sum.jsonl", [{"document": "long text", "summary": "s"}] * 3)
    assert common.read_sources(translation, _Tokenizer(), 2) == [{"text": "a b"}] * 2
    assert common.read_sources(summarization, _Tokenizer(), 5) == [{"text": "long text"}] * 3
    with pytest.raises(ValueError, match="neither `translation` nor `document`"):
        common.read_sources(_write(tmp_path / "other.jsonl", [{"text": "x"}]), _Tokenizer(), 1)
