"""The one YAML + command-line parser of train_drafter.py, evaluate.py, distillation and the demo scripts."""

from __future__ import annotations

import pytest
import yaml

from specdec_hf import distillation
from specdec_hf.config_parsing import parse_yaml_and_cli
from specdec_hf.evaluation.arguments import parse_evaluation_arguments
from specdec_hf.training import DrafterTrainingArguments


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "train.yaml"
    values = {"verifier_name_or_path": "v", "train_data": "d", "output_dir": "o", "max_steps": 7}
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_yaml_values_and_overrides(config, form):
    config_args = ["--config", str(config)] if form == "separate" else [f"--config={config}"]
    (args,) = parse_yaml_and_cli([DrafterTrainingArguments], [*config_args, "--learning_rate", "0.01"])
    assert args.max_steps == 7 and args.learning_rate == 0.01 and args.verifier_name_or_path == "v"


def test_dict_field_from_the_command_line(config):
    (args,) = parse_yaml_and_cli(
        [DrafterTrainingArguments], ["--config", str(config), "--drafter_config", '{"decoder_layers": 1}']
    )
    assert args.drafter_config == {"decoder_layers": 1}
    with pytest.raises(SystemExit):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(config), "--drafter_config", "[1, 2]"])


def test_bad_config_arguments(config, tmp_path, capsys):
    with pytest.raises(SystemExit):  # argparse: "expected one argument"
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config"])
    assert "--config" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="no such file"):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(tmp_path / "missing.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"verifier_name_or_path": "v", "no_such_field": 1}))
    with pytest.raises(ValueError, match="no_such_field"):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(bad)])


def test_every_script_uses_it(tmp_path):
    """Distillation and evaluation read `--config=path` too, and report a trailing `--config` as argparse does."""
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"dataset_name": "wmt14", "dataset_config_name": "de-en"}))
    data_args, args = distillation.parse_args([f"--config={data}", "--verifier", "v", "--output_dir", "o"])
    assert data_args.dataset_name == "wmt14" and args.verifier == "v"
    with pytest.raises(SystemExit):
        distillation.parse_args(["--verifier", "v", "--output_dir", "o", "--config"])
    evaluation = tmp_path / "eval.yaml"
    evaluation.write_text(
        yaml.safe_dump({"verifier_name_or_path": "v", "output_dir": "o", "dataset_name": "wmt14", "drafters": ["d"]})
    )
    evaluation_args, data_args = parse_evaluation_arguments([f"--config={evaluation}", "--limit", "3"])
    assert evaluation_args.limit == 3 and data_args.dataset_name == "wmt14"
