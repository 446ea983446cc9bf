"""Distillation on several processes (torchrun, as `accelerate launch` starts them on GPUs): disjoint shards per
rank, one merge by rank 0, the same dataset row for row as one process, and resumption per shard."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_verifier, build_word_tokenizer

from specdec_hf.data import DataArguments, load_text_pairs
from specdec_hf.distillation import SHARDS_DIR, load_distilled_dataset

FIXTURE = Path(__file__).parent / "fixtures" / "mt_fixture.jsonl"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("distill_processes")
    pairs = load_text_pairs(DataArguments(data_files=str(FIXTURE), source_lang="en", target_lang="de"), "train")
    tokenizer = build_word_tokenizer(list(pairs["source"]))
    verifier = build_verifier("bart")
    verifier.save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    return root / "verifier"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _distill(verifier_dir: Path, output_dir: Path, processes: int, *extra: str) -> subprocess.CompletedProcess:
    arguments = ["--data_files", str(FIXTURE), "--source_lang", "en", "--target_lang", "de", "--max_samples", "44"]
    arguments += ["--verifier", str(verifier_dir), "--output_dir", str(output_dir), "--device", "cpu"]
    arguments += ["--shard_size", "8", "--batch_size", "8", "--max_new_tokens", "8", *extra]
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        launcher += ["--master_port", str(_free_port())]
    command = [*launcher, "-m", "specdec_hf.distillation", *arguments]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_two_processes_give_the_single_process_dataset(verifier_dir, tmp_path):
    _distill(verifier_dir, tmp_path / "single", 1)
    _distill(verifier_dir, tmp_path / "two", 2)
    single = load_distilled_dataset(tmp_path / "single")
    two = load_distilled_dataset(tmp_path / "two")
    assert single.num_rows == 44 and len(list((tmp_path / "two" / SHARDS_DIR).glob("*.parquet"))) == 6
    assert two.column_names == single.column_names
    assert two.to_dict() == single.to_dict()


def test_an_interrupted_run_resumes_its_shards(verifier_dir, tmp_path):
    """Each rank stops after one shard, one of them killed while writing its next (a `.tmp` file left behind); the
    rerun decodes only the rest and ends with the single-process dataset."""
    result = _distill(verifier_dir, tmp_path / "interrupted", 2, "--max_shards", "1")
    assert "stopped early" in result.stdout
    shards = sorted((tmp_path / "interrupted" / SHARDS_DIR).glob("*.parquet"))
    assert [path.name for path in shards] == ["shard-00000.parquet", "shard-00001.parquet"]
    first_written = {path.name: path.stat().st_mtime_ns for path in shards}
    (tmp_path / "interrupted" / SHARDS_DIR / "shard-00002.parquet.tmp").write_bytes(b"half a shard")
    _distill(verifier_dir, tmp_path / "interrupted", 2)
    _distill(verifier_dir, tmp_path / "single", 1)
    for path in shards:  # kept, not decoded again
        assert path.stat().st_mtime_ns == first_written[path.name]
    resumed = load_distilled_dataset(tmp_path / "interrupted")
    assert resumed.to_dict() == load_distilled_dataset(tmp_path / "single").to_dict()
