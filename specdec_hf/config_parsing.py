"""One YAML + command-line parser for every script of the project (training, distillation, evaluation, demo).

`--config file.yaml` gives the values of the dataclasses' fields; any `--name value` on the command line overrides
them, as with TRL's `TrlParser` (built, like it, on transformers' `HfArgumentParser`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from transformers import HfArgumentParser

__all__ = ["parse_yaml_and_cli"]


def parse_yaml_and_cli(dataclass_types, argv: list[str] | None = None):
    """Parse `--config file.yaml` (values) and the remaining command line (overrides) into dataclasses.

    YAML keys become the parser's defaults, so any `--name value` on the command line wins. Unknown YAML keys are
    an error, as unknown flags are.
    """
    # argparse reads `--config path` and `--config=path` alike, and reports a `--config` without a value
    config_parser = argparse.ArgumentParser(add_help=False)
    config_parser.add_argument("--config", type=str, default=None)
    namespace, _ = config_parser.parse_known_args(argv)
    parser = HfArgumentParser(dataclass_types)
    for action in parser._actions:
        if action.type is dict:  # `--drafter_config '{"decoder_layers": 1}'`: a YAML / JSON mapping
            action.type = _mapping
    parser.add_argument("--config", type=str, default=None, help="YAML file with the values of the fields.")
    if namespace.config:
        path = Path(namespace.config)
        if not path.is_file():
            raise FileNotFoundError(f"--config {path}: no such file.")
        values = yaml.safe_load(path.read_text()) or {}
        known = {action.dest for action in parser._actions}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown}; `--help` lists the valid fields.")
        parser.set_defaults(**values)
        # YAML now provides the required fields: stop argparse from demanding them on the command line.
        for action in parser._actions:
            if action.dest in values:
                action.required = False
    *parsed, _config = parser.parse_args_into_dataclasses(args=argv)
    return tuple(parsed)


def _mapping(text: str) -> dict:
    """A command-line value of a `dict` field: YAML or JSON text of a mapping."""
    value = yaml.safe_load(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{\"key\": 1}}', got {text!r}")
    return value
