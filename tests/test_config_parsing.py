"""The one YAML + command-line parser of train_drafter.py, evaluate.py, distillation and the demo scripts."""

from __future__ import annotations

import dataclasses
import enum
import re
from pathlib import Path
from typing import Literal

import pytest
import yaml
from transformers import HfArgumentParser

from specdec_hf import distillation
from specdec_hf.config_parsing import parse_yaml_and_cli
from specdec_hf.data import DataArguments
from specdec_hf.evaluation.arguments import EvaluationArguments, parse_evaluation_arguments
from specdec_hf.training import DrafterTrainingArguments

ROOT = Path(__file__).resolve().parents[1]


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


def test_dict_field_from_the_command_line(config, capsys):
    (args,) = parse_yaml_and_cli(
        [DrafterTrainingArguments], ["--config", str(config), "--drafter_config", '{"decoder_layers": 1}']
    )
    assert args.drafter_config == {"decoder_layers": 1}
    with pytest.raises(SystemExit):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(config), "--drafter_config", "[1, 2]"])
    assert "--drafter_config" in (err := capsys.readouterr().err) and "must be a mapping, got '[1, 2]'" in err


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


def _write(tmp_path, values: dict, name: str = "config.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


_TRAIN = {"verifier_name_or_path": "v", "train_data": "d", "output_dir": "o"}
_EVAL = {"verifier_name_or_path": "v", "drafters": ["d"], "dataset_name": "wmt14"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"max_steps": 2.5},
            r"`max_steps` must be an integer, got 2\.5 \(float\): write a whole number such as 2 or 3",
        ),
        ({"max_steps": True}, r"`max_steps` must be an integer, got true \(bool\)"),
        ({"learning_rate": "fast"}, r"`learning_rate` must be a number, got 'fast' \(str\)"),
        ({"drafter_config": [1, 2]}, r"`drafter_config` must be a mapping, got \[1, 2\] \(list\)"),
        ({"drafter_config": None}, r"`drafter_config` must be a mapping, got null: only optional fields take null"),
        ({"mixed_precision": False}, r"`mixed_precision` must be a string, got false \(bool\): quote it"),
        ({"push_to_hub": "maybe"}, r"`push_to_hub` must be true or false, got 'maybe'"),
        ({"max_splits": 2.5}, r"`max_splits` must be an integer, got 2\.5"),
    ],
)
def test_training_yaml_values_of_the_wrong_type_name_key_file_and_value(tmp_path, values, message):
    """`max_steps: 2.5` used to train 3 steps: YAML values skipped argparse's conversion."""
    config = _write(tmp_path, {**_TRAIN, **values})
    with pytest.raises(ValueError, match=rf"^{re.escape(str(config))}: {message}"):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(config)])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"strategies": "greedy beam"},
            r"`strategies` must be a list of strings, got 'greedy beam' .*\[greedy, beam\]",
        ),
        ({"strategies": ["greedy", 3]}, r"`strategies` must be a list of strings, got \[greedy, 3\] .*item 1 \(3\)"),
        ({"sweep_batch_sizes": [1, 2.5]}, r"`sweep_batch_sizes` must be a list of integers.*item 1 \(2\.5\)"),
        ({"max_new_tokens": 2.5}, r"`max_new_tokens` must be an integer, got 2\.5"),
        ({"batch_size": True}, r"`batch_size` must be an integer, got true \(bool\)"),
        ({"limit": "ten"}, r"`limit` must be an integer, got 'ten' \(str\)\.$"),
        ({"dtype": 16}, r"`dtype` must be a string, got 16 \(int\): quote it in YAML: unquoted digits are read"),
        ({"sweep": 1}, r"`sweep` must be true or false, got 1 \(int\)"),
        ({"data_files": 3}, r"`data_files` must be a list of strings \(or one string\) or a mapping, got 3"),
        ({"source_lang": "en", "target_lang": False}, r"`target_lang` must be a string, got false"),
    ],
)
def test_evaluation_yaml_values_of_the_wrong_type(tmp_path, values, message):
    config = _write(tmp_path, {**_EVAL, **values})
    with pytest.raises(ValueError, match=rf"^{re.escape(str(config))}: {message}"):
        parse_evaluation_arguments(["--config", str(config)])


def test_yaml_values_converted_as_the_command_line_would(tmp_path):
    """Whole numbers written as floats, YAML 1.1's `5e-4` (a string to PyYAML), a lone list item, `{}` text."""
    config = tmp_path / "train.yaml"
    config.write_text(
        "verifier_name_or_path: v\ntrain_data: d\noutput_dir: o\nmax_steps: 1.0e4\nwarmup_steps: 1e3\n"
        "learning_rate: 5e-4\nadam_beta1: 1\nmax_splits: null\ndrafter_config: '{decoder_layers: 1}'\n"
    )
    (args,) = parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(config)])
    assert (args.max_steps, args.warmup_steps) == (10_000, 1_000) and type(args.max_steps) is int
    assert args.learning_rate == 5e-4 and type(args.adam_beta1) is float and args.max_splits is None
    assert args.drafter_config == {"decoder_layers": 1}
    evaluation = _write(
        tmp_path,
        {**_EVAL, "strategies": "greedy", "sweep_batch_sizes": 8, "drafters": "d", "limit": 1000.0},
        "eval.yaml",
    )
    evaluation_args, _ = parse_evaluation_arguments(["--config", str(evaluation)])
    assert evaluation_args.strategies == ["greedy"] and evaluation_args.sweep_batch_sizes == [8]
    assert evaluation_args.drafters == ["d"] and evaluation_args.limit == 1000 and type(evaluation_args.limit) is int
    for data_files, expected in (({"test": "a.jsonl"}, {"test": ["a.jsonl"]}), ("a.jsonl", ["a.jsonl"])):
        evaluation = _write(tmp_path, {**_EVAL, "data_files": data_files}, "eval.yaml")
        assert parse_evaluation_arguments(["--config", str(evaluation)])[1].data_files == expected


def test_command_line_values_follow_the_same_rules(config, capsys):
    with pytest.raises(SystemExit):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(config), "--max_steps", "2.5"])
    assert "--max_steps" in (err := capsys.readouterr().err) and "must be an integer, got '2.5'" in err
    (args,) = parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(config), "--max_steps", "1e3"])
    assert args.max_steps == 1000


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max_new_tokens", "2.5", "must be an integer, got '2.5'"),
        ("--batch_size", "abc", "must be an integer, got 'abc'"),
        ("--sweep", "maybe", "must be true or false, got 'maybe'"),
    ],
)
def test_evaluation_command_line_values_follow_the_same_rules(option, value, message, capsys):
    with pytest.raises(SystemExit):
        parse_evaluation_arguments(["--verifier_name_or_path", "v", "--dataset_name", "wmt14", option, value])
    assert option in (err := capsys.readouterr().err) and message in err


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"batch_size": 2.5}, r"`batch_size` must be an integer, got 2\.5 \(float\)"),
        ({"num_beams": "two"}, r"`num_beams` must be an integer, got 'two' \(str\)"),
        ({"dtype": "bf16"}, r"`dtype` must be one of \[.*'bfloat16'.*\], got 'bf16'"),
    ],
)
def test_distillation_yaml_values_of_the_wrong_type(tmp_path, values, message):
    config = _write(tmp_path, {"verifier": "v", "output_dir": "o", "dataset_name": "wmt14", **values})
    with pytest.raises(ValueError, match=message):
        distillation.parse_args(["--config", str(config)])


def test_config_file_that_is_not_a_yaml_mapping(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("max_steps: [1,\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(broken))}, line 2, column 1, is not valid YAML: "):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(broken)])
    listing = tmp_path / "list.yaml"
    listing.write_text("- max_steps\n- 3\n")
    with pytest.raises(ValueError, match=r"list.yaml must hold `key: value` lines \(a YAML mapping\), but holds list"):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(listing)])
    with pytest.raises(FileNotFoundError, match="is a directory"):
        parse_yaml_and_cli([DrafterTrainingArguments], ["--config", str(tmp_path)])


def test_every_shipped_config_passes_the_type_checks():
    """The configs of the three scripts, checked against the dataclasses their script parses them into."""
    groups = {
        "train": [DrafterTrainingArguments],
        "eval": [EvaluationArguments, DataArguments],
        "data": [DataArguments, distillation.DistillationArguments],
    }
    checked = 0
    for group, classes in groups.items():
        for path in sorted((ROOT / "configs" / group).glob("*.yaml")):
            values = yaml.safe_load(path.read_text())
            parser = HfArgumentParser(classes)
            required = [action.dest for action in parser._actions if action.required and action.dest not in values]
            argv = [item for name in required for item in (f"--{name}", "x")]
            parse_yaml_and_cli(classes, ["--config", str(path), *argv])
            checked += 1
    assert checked >= 15


def test_train_drafter_refuses_a_fractional_max_steps_before_loading_anything(tmp_path):
    import train_drafter

    config = _write(tmp_path, {**_TRAIN, "max_steps": 2.5})
    with pytest.raises(ValueError, match=r"`max_steps` must be an integer, got 2\.5"):
        train_drafter.main(["--config", str(config)])


class _Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class _Choices:
    mode: Literal["fast", "exact"] = dataclasses.field(default="exact", metadata={"help": "A Literal field."})
    color: _Color = dataclasses.field(default=_Color.RED, metadata={"help": "An Enum field."})


def test_literal_and_enum_fields(tmp_path):
    (args,) = parse_yaml_and_cli([_Choices], ["--config", str(_write(tmp_path, {"mode": "fast", "color": "blue"}))])
    assert args.mode == "fast" and args.color is _Color.BLUE
    with pytest.raises(ValueError, match=r"`mode` must be one of fast, exact, got 'quick'"):
        parse_yaml_and_cli([_Choices], ["--config", str(_write(tmp_path, {"mode": "quick"}))])
    with pytest.raises(ValueError, match=r"`color` must be one of red, blue, got 'green'"):
        parse_yaml_and_cli([_Choices], ["--config", str(_write(tmp_path, {"color": "green"}))])
