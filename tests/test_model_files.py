"""Models, tokenizers and checkpoints read from disk: a missing directory or a damaged file is named."""

from __future__ import annotations

import pytest
import torch
from conftest import build_verifier

from specdec_hf import SpecDrafterModel, model_files
from specdec_hf.model_files import find_damaged_file, load_pretrained


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("drafter")
    SpecDrafterModel.from_verifier(build_verifier("bart"), max_draft_tokens=4, decoder_layers=1).save_pretrained(
        directory
    )
    return directory


def truncate(path, keep: float = 0.5) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def test_truncated_safetensors_is_named(drafter_dir, tmp_path):
    """safetensors alone said "incomplete metadata, file not fully covered", naming no file."""
    damaged = tmp_path / "drafter"
    damaged.mkdir()
    for file in drafter_dir.iterdir():
        (damaged / file.name).write_bytes(file.read_bytes())
    assert isinstance(load_pretrained(SpecDrafterModel.from_pretrained, str(damaged), "drafters"), SpecDrafterModel)
    truncate(damaged / "model.safetensors")
    with pytest.raises(
        OSError, match=rf"`drafters` '{damaged}': {damaged}/model.safetensors cannot be read .*truncated"
    ):
        load_pretrained(SpecDrafterModel.from_pretrained, str(damaged), "drafters")


@pytest.mark.parametrize("offline", [True, False])
def test_missing_local_directory_is_not_reported_as_a_hub_problem(monkeypatch, tmp_path, offline):
    """Offline, transformers said "We couldn't connect to 'https://huggingface.co'", or for a path of three parts
    "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(model_files, "_hub_offline", lambda: offline)
    for name in ("models/demo-en-de/drafterx", str(tmp_path / "missing"), "../missing"):
        with pytest.raises(FileNotFoundError, match=rf"`drafters` '{name}': no such directory.*not a Hub id either"):
            load_pretrained(SpecDrafterModel.from_pretrained, name, "drafters")
    calls = []
    if offline:  # a name that could be a Hub id, but offline mode and nothing of that name in the cache
        with pytest.raises(FileNotFoundError, match=r"'runs/drafter': no such directory \(relative to .*offline mode"):
            load_pretrained(calls.append, "runs/drafter", "drafters")
    else:  # online, such a name is the Hub's to resolve; when it fails, the missing directory is said first
        load_pretrained(calls.append, "runs/drafter", "drafters")

        def unreachable_hub(name, **kwargs):
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

        with pytest.raises(OSError, match=r"'runs/drafter': no such directory .*could not be loaded either: We"):
            load_pretrained(unreachable_hub, "runs/drafter", "drafters")
    assert calls == ([] if offline else ["runs/drafter"])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(NotADirectoryError, match=r"'config.json' is a file: give the directory"):
        load_pretrained(calls.append, "config.json", "drafters")


@pytest.mark.parametrize("cached_file", ["config.json", "ngram_store.json"])
def test_a_hub_id_in_the_cache_loads_offline(monkeypatch, tmp_path, cached_file):
    """A model's config.json, or an n-gram store's ngram_store.json, in the Hub cache: the id goes to the loader."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(model_files, "_hub_offline", lambda: True)
    monkeypatch.setattr(
        model_files.huggingface_hub,
        "try_to_load_from_cache",
        lambda repo_id, filename, **kwargs: f"/cache/{repo_id}/{filename}" if filename == cached_file else None,
    )
    calls = []
    load_pretrained(calls.append, "owner/store", "drafters")
    assert calls == ["owner/store"]


def test_damaged_torch_archives_are_found_and_intact_files_pass(tmp_path):
    torch.save({"state": {0: {"exp_avg": torch.ones(64, 64)}}}, tmp_path / "optimizer.bin")
    torch.save({"step": 3}, tmp_path / "legacy.bin", _use_new_zipfile_serialization=False)  # no checksums to test
    assert find_damaged_file(tmp_path) is None
    truncate(tmp_path / "optimizer.bin")
    file, problem = find_damaged_file(tmp_path)
    assert file == tmp_path / "optimizer.bin" and "not a complete torch.save archive" in problem


def test_loading_errors_that_are_not_damage_pass_through_unchanged(drafter_dir):
    def failing_loader(name, **kwargs):
        raise ValueError("the loader's own complaint")

    with pytest.raises(ValueError, match="the loader's own complaint"):
        load_pretrained(failing_loader, str(drafter_dir), "drafters")


def test_from_pretrained_called_directly_names_the_missing_directory_and_the_damaged_file(drafter_dir, tmp_path):
    """`SpecDrafterModel.from_pretrained` itself said "Repo id must be in the form ..." for a missing directory and
    "incomplete metadata, file not fully covered" for a truncated file."""
    missing = tmp_path / "runs" / "drafter"
    with pytest.raises(FileNotFoundError, match=rf"`pretrained_model_name_or_path` '{missing}': no such directory"):
        SpecDrafterModel.from_pretrained(missing)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for file in drafter_dir.iterdir():
        (damaged / file.name).write_bytes(file.read_bytes())
    assert isinstance(SpecDrafterModel.from_pretrained(damaged, dtype=torch.float32), SpecDrafterModel)
    truncate(damaged / "model.safetensors")
    with pytest.raises(OSError, match=rf"{damaged}/model.safetensors cannot be read .*truncated"):
        SpecDrafterModel.from_pretrained(damaged)
