"""`train_drafter.py` end to end on a tiny verifier and the fixture: CLI + YAML, resume, two processes, and a gain."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import build_verifier, build_word_tokenizer
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSeq2SeqLM

import train_drafter
from specdec_hf import SpecDrafterAdapter, SpecDrafterModel
from specdec_hf.config_parsing import parse_yaml_and_cli
from specdec_hf.data import DataArguments, load_text_pairs
from specdec_hf.distillation import DistillationSettings, distill, load_distilled_dataset
from specdec_hf.training import evaluate_drafter

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "mt_fixture.jsonl"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A saved tiny verifier (with tokenizer) and its distilled outputs on 96 fixture sentences."""
    root = tmp_path_factory.mktemp("train_drafter")
    pairs = load_text_pairs(DataArguments(data_files=str(FIXTURE), source_lang="en", target_lang="de"), "train")
    pairs = pairs.select(range(96))
    tokenizer = build_word_tokenizer(list(pairs["source"]))
    verifier = build_verifier("bart")
    verifier.save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    settings = DistillationSettings(output_dir=str(root / "distilled"), batch_size=32, max_new_tokens=12)
    distill(verifier, tokenizer, pairs, settings, progress=False)
    return root


def write_config(workspace: Path, name: str, **overrides) -> Path:
    values = {
        "verifier_name_or_path": str(workspace / "verifier"),
        "train_data": str(workspace / "distilled"),
        "output_dir": str(workspace / name),
        "max_draft_tokens": 4,
        "drafter_config": {"decoder_layers": 1, "prefix_attention": "causal"},
        "dataset_description": "tiny verifier's greedy outputs on 96 fixture sentences",
        "per_device_train_batch_size": 16,
        "learning_rate": 3e-3,
        "lr_scheduler_type": "inverse_sqrt",
        "warmup_steps": 2,
        "max_steps": 6,
        "checkpointing_steps": 3,
        "eval_steps": 100,
        "eval_samples": 16,
        "eval_max_new_tokens": 12,
        "logging_steps": 1,
        "num_threads": 1,
        **overrides,
    }
    path = workspace / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_cli_with_yaml_config_saves_a_loadable_drafter(workspace):
    config = write_config(workspace, "cli")
    metrics = train_drafter.main(["--config", str(config), "--max_steps", "4"])
    output = workspace / "cli"
    assert (output / "model.safetensors").is_file() and (output / "README.md").is_file()
    assert json.loads((output / "eval_results.json").read_text())["step"] == 4
    assert metrics["tokens_per_iteration"] >= 1.0 and len(metrics["accuracy_by_position"]) == 4
    drafter = AutoModel.from_pretrained(output)
    assert isinstance(drafter, SpecDrafterModel) and SpecDrafterAdapter(drafter).num_draft_tokens == 4
    assert "Spec-Drafter" in (output / "README.md").read_text()
    card = ModelCard.load(output / "README.md").data  # a local verifier is named in the text, not as base_model
    assert card.base_model is None and card.eval_results is not None


@pytest.mark.parametrize("group_by_length", [False, True])
def test_resumed_run_equals_uninterrupted_run(workspace, group_by_length, monkeypatch):
    # dropout and gradient accumulation make the run depend on restored RNG states and the accumulation phase; the
    # 12 micro-steps span three epochs of 5 batches, so the resumed run also re-enters the epochs' orders. An
    # evaluation at steps 2 (before the interruption at 3) and 4 (after) switches the drafter to eval mode and back.
    randomness = dict(drafter_config={"decoder_layers": 1, "prefix_attention": "causal", "dropout": 0.1})
    randomness.update(gradient_accumulation_steps=2, group_by_length=group_by_length, eval_steps=2)
    modes = []
    loss_function = train_drafter.drafter_training_loss

    def recording_loss(model, *args, **kwargs):
        modes.append(model.training)
        return loss_function(model, *args, **kwargs)

    monkeypatch.setattr(train_drafter, "drafter_training_loss", recording_loss)
    suffix = "_grouped" if group_by_length else ""
    train_drafter.main(["--config", str(write_config(workspace, f"straight{suffix}", **randomness))])
    straight_forwards = len(modes)
    interrupted = write_config(workspace, f"resumed{suffix}", max_steps=3, **randomness)
    train_drafter.main(["--config", str(interrupted)])
    assert (workspace / f"resumed{suffix}" / "checkpoint-3").is_dir()
    train_drafter.main(["--config", str(interrupted), "--max_steps", "6", "--resume_from_checkpoint", "latest"])
    # every micro-step of the three runs in training mode (dropout on); the two halves together did the same work
    assert straight_forwards > 0 and modes == [True] * (2 * straight_forwards)
    straight = load_file(workspace / f"straight{suffix}" / "model.safetensors")
    resumed = load_file(workspace / f"resumed{suffix}" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)


def test_resuming_a_finished_run_keeps_its_evaluation(workspace):
    """A resume with nothing left to do re-evaluates the saved weights instead of writing empty results."""
    config = write_config(workspace, "finished", max_steps=3)
    first = train_drafter.main(["--config", str(config)])
    again = train_drafter.main(["--config", str(config), "--resume_from_checkpoint", "latest"])
    saved = json.loads((workspace / "finished" / "eval_results.json").read_text())
    assert saved["step"] == 3 and saved["tokens_per_iteration"] == again["tokens_per_iteration"]
    assert again["tokens_per_iteration"] == pytest.approx(first["tokens_per_iteration"])
    assert "not measured" not in (workspace / "finished" / "README.md").read_text()


def test_resuming_from_a_truncated_optimizer_state_names_the_file_and_the_previous_checkpoint(workspace):
    """torch alone said "PytorchStreamReader failed reading zip archive: failed finding central directory"."""
    config = write_config(workspace, "damaged", max_steps=2, checkpointing_steps=1)
    train_drafter.main(["--config", str(config)])
    optimizer_state = workspace / "damaged" / "checkpoint-2" / "optimizer.bin"
    optimizer_state.write_bytes(optimizer_state.read_bytes()[:-200])
    resume = ["--config", str(config), "--max_steps", "3", "--resume_from_checkpoint", "latest"]
    previous = workspace / "damaged" / "checkpoint-1"
    with pytest.raises(RuntimeError, match=rf"{optimizer_state} cannot be read.*--resume_from_checkpoint {previous}"):
        train_drafter.main(resume)


def test_trained_drafter_beats_untrained(workspace):
    metrics = train_drafter.main(["--config", str(write_config(workspace, "longer", max_steps=80, eval_steps=80))])
    verifier = AutoModelForSeq2SeqLM.from_pretrained(workspace / "verifier").eval()
    held_out = [dict(row) for row in load_distilled_dataset(workspace / "distilled").select(range(80, 96))]
    untrained = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal"
    )
    baseline = evaluate_drafter(verifier, untrained, held_out, max_new_tokens=12)
    print(f"Tok. trained {metrics['tokens_per_iteration']:.2f} vs untrained {baseline['tokens_per_iteration']:.2f}")
    assert metrics["tokens_per_iteration"] > baseline["tokens_per_iteration"] + 0.3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_with_gloo(workspace):
    """Data parallelism on CPU: two real ranks (gloo). `accelerate launch` needs MPI for several CPU processes
    (`--mpirun_hostfile`), which this machine lacks, so the ranks are started with torchrun, the launcher
    `accelerate launch` itself uses for several GPUs; ACCELERATE_USE_CPU makes Accelerate pick gloo."""
    config = write_config(workspace, "two_processes", max_steps=2, checkpointing_steps=2)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        str(ROOT / "train_drafter.py"),
        "--config",
        str(config),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    result = subprocess.run(command, cwd=workspace, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (workspace / "two_processes" / "model.safetensors").is_file()
    checkpoint = workspace / "two_processes" / "checkpoint-2"
    # both ranks' RNG states made it into the checkpoint before it was marked complete
    assert (checkpoint / "random_states_0.pkl").is_file() and (checkpoint / "random_states_1.pkl").is_file()
    assert (checkpoint / "training_state.json").is_file()


@pytest.mark.parametrize("config", sorted((ROOT / "configs" / "train").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_training_configs_parse(config):
    (args,) = parse_yaml_and_cli([train_drafter.DrafterTrainingArguments], ["--config", str(config)])
    assert args.verifier_name_or_path and args.train_data and args.max_draft_tokens >= 1


def test_glancing_training_runs(workspace):
    metrics = train_drafter.main(
        ["--config", str(write_config(workspace, "glancing", max_steps=3)), "--glancing_ratio", "0.5"]
    )
    assert (workspace / "glancing" / "model.safetensors").is_file() and metrics["tokens_per_iteration"] >= 1.0


def test_every_split_soft_labels_features_and_reduced_head(workspace):
    """The shipped drafter's recipe on the tiny verifier: it trains, saves its head's ids and drafts from them."""
    config = write_config(
        workspace,
        "eagle",
        drafter_config={
            "decoder_layers": 1,
            "prefix_attention": "causal",
            "use_verifier_encoder": True,
            "verifier_state_layers": [1, -1],
        },
        split_points="all",
        max_splits=4,
        soft_label_weight=0.5,
        draft_vocab_size=40,
        group_by_length=True,
        max_steps=30,
        eval_steps=30,
    )
    metrics = train_drafter.main(["--config", str(config)])
    drafter = SpecDrafterModel.from_pretrained(workspace / "eagle")
    assert drafter.config.draft_vocab_size == 40 and drafter.lm_head.weight.shape[0] == 40
    assert drafter.config.verifier_state_layers == [1, -1]
    # the head keeps the most frequent target ids: those of the training data
    distilled = load_distilled_dataset(workspace / "distilled")
    counts = torch.bincount(torch.tensor([i for ids in distilled["target_ids"][:80] for i in ids[1:]]), minlength=99)
    assert set(drafter.draft_vocab_ids[:5].tolist()) <= set(counts.argsort(descending=True)[:12].tolist())
    assert metrics["tokens_per_iteration"] > 1.0
    card = (workspace / "eagle" / "README.md").read_text()
    assert "every split point" in card and "KL" in card and "most frequent" in card


def test_continuing_a_drafter_of_another_vocabulary_layout_is_refused(workspace):
    """A drafter whose special ids differ from the verifier's (e.g. not re-laid with <pad> last) is not trained on."""
    verifier = AutoModelForSeq2SeqLM.from_pretrained(workspace / "verifier")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1)
    drafter.config.pad_token_id = verifier.config.pad_token_id + 1
    drafter.save_pretrained(workspace / "other_layout")
    config = write_config(workspace, "other_layout_run", drafter_config={})
    with pytest.raises(
        ValueError, match="drafter_name_or_path has pad_token_id 2, the verifier 1.*relayout_spec_drafter"
    ):
        train_drafter.main(["--config", str(config), "--drafter_name_or_path", str(workspace / "other_layout")])


def test_a_new_run_never_overwrites_an_earlier_one_or_the_verifier(workspace):
    config = write_config(workspace, "kept", max_steps=4, checkpointing_steps=2)
    train_drafter.main(["--config", str(config)])
    output = workspace / "kept"
    finished = (output / "model.safetensors").read_bytes()
    # a shorter run into the same directory: refused, the finished drafter untouched
    with pytest.raises(ValueError, match=r"holds an earlier run \(checkpoint-2, checkpoint-4.*--overwrite_output_dir"):
        train_drafter.main(["--config", str(config), "--max_steps", "2"])
    assert (output / "model.safetensors").read_bytes() == finished
    # replaced on purpose: the earlier run's checkpoints go, so `latest` is the new run's
    train_drafter.main(["--config", str(config), "--max_steps", "2", "--overwrite_output_dir"])
    assert sorted(path.name for path in output.glob("checkpoint-*")) == ["checkpoint-2"]
    assert json.loads((output / "eval_results.json").read_text())["step"] == 2
    # the verifier's own directory (or one holding it) is never an output_dir
    verifier_files = {path.name: path.read_bytes() for path in (workspace / "verifier").iterdir() if path.is_file()}
    for target in (workspace / "verifier", workspace):
        with pytest.raises(ValueError, match="is \\(or holds\\) the verifier"):
            train_drafter.main(["--config", str(config), "--output_dir", str(target), "--overwrite_output_dir"])
    assert {p.name: p.read_bytes() for p in (workspace / "verifier").iterdir() if p.is_file()} == verifier_files


def test_a_resume_that_would_change_the_data_order_or_lacks_a_file_stops(workspace):
    config = write_config(workspace, "order", max_steps=2, checkpointing_steps=1)
    train_drafter.main(["--config", str(config)])
    resume = ["--config", str(config), "--max_steps", "3", "--resume_from_checkpoint", "latest"]
    with pytest.raises(ValueError, match=r"per_device_train_batch_size: 16 -> 8.*another `output_dir`"):
        train_drafter.main([*resume, "--per_device_train_batch_size", "8"])
    checkpoint = workspace / "order" / "checkpoint-2"
    (checkpoint / "random_states_0.pkl").rename(checkpoint / "moved.pkl")
    previous = workspace / "order" / "checkpoint-1"
    with pytest.raises(FileNotFoundError, match=rf"lacks random_states_0.pkl.*--resume_from_checkpoint {previous}"):
        train_drafter.main(resume)
    (checkpoint / "moved.pkl").rename(checkpoint / "random_states_0.pkl")
    state_file = checkpoint / "training_state.json"
    state_file.write_text('{"step": 2, "epo')  # cut short
    with pytest.raises(ValueError, match=rf"{state_file} is damaged"):
        train_drafter.main(resume)
    state_file.write_text('{"step": 2}')
    with pytest.raises(ValueError, match="lacks the integer field\\(s\\) epoch, batches_in_epoch, micro_step"):
        train_drafter.main(resume)


def test_train_data_that_cannot_train_is_refused(workspace, tmp_path):
    """Not a distilled dataset, a damaged one, or too few rows to hold out the evaluation's samples."""
    with pytest.raises(FileNotFoundError, match=rf"'{tmp_path}' is not a distilled dataset: run .*distillation"):
        train_drafter.main(["--config", str(write_config(workspace, "not_distilled", train_data=str(tmp_path)))])
    damaged = tmp_path / "damaged_distilled"
    shutil.copytree(workspace / "distilled", damaged)
    for arrow_file in damaged.glob("data-*.arrow"):
        arrow_file.write_bytes(arrow_file.read_bytes()[: arrow_file.stat().st_size // 2])
    with pytest.raises(OSError, match=rf"distilled dataset in '{damaged}' cannot be read"):
        train_drafter.main(["--config", str(write_config(workspace, "damaged_data", train_data=str(damaged)))])
    with pytest.raises(ValueError, match=r"train_data has 96 rows, too few to hold out `eval_samples=500`"):
        train_drafter.main(["--config", str(write_config(workspace, "few_rows", eval_samples=500))])


def test_resuming_without_a_complete_checkpoint_is_refused(workspace, tmp_path):
    config = write_config(workspace, "never_saved")
    with pytest.raises(FileNotFoundError, match=r"--resume_from_checkpoint latest: no complete checkpoint in"):
        train_drafter.main(["--config", str(config), "--resume_from_checkpoint", "latest"])
    with pytest.raises(
        FileNotFoundError, match=rf"{tmp_path} is not a complete checkpoint \(no training_state.json\)"
    ):
        train_drafter.main(["--config", str(config), "--resume_from_checkpoint", str(tmp_path)])


def test_every_split_point_needs_a_causal_prefix(workspace):
    config = write_config(workspace, "bidirectional", split_points="all", drafter_config={"decoder_layers": 1})
    with pytest.raises(ValueError, match=r"`split_points: all` needs a drafter with `prefix_attention: causal`"):
        train_drafter.main(["--config", str(config)])


def test_a_missing_model_directory_is_named_by_its_argument(workspace, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths of three parts: no Hub id either
    config = write_config(workspace, "no_verifier", verifier_name_or_path="runs/old/verifier")
    with pytest.raises(FileNotFoundError, match=r"`verifier_name_or_path` 'runs/old/verifier': no such directory"):
        train_drafter.main(["--config", str(config)])
    config = write_config(workspace, "no_drafter", drafter_config={})
    with pytest.raises(FileNotFoundError, match=r"`drafter_name_or_path` 'runs/old/drafter': no such directory"):
        train_drafter.main(["--config", str(config), "--drafter_name_or_path", "runs/old/drafter"])
