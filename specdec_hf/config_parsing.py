"""One YAML + command-line parser for every script of the project (training, distillation, evaluation, demo).

`--config file.yaml` gives the values of the dataclasses' fields; any `--name value` on the command line overrides
them, as with TRL's `TrlParser` (built, like it, on transformers' `HfArgumentParser`).

Every value is checked against its field's declared type here, whichever way it comes: argparse converts
command-line text with this module's converters, and YAML values (already numbers, lists or mappings, which argparse
would pass through unchecked) go through the same rules before they become the parser's defaults. So `max_steps: 2.5`
fails with the key, the file, the expected type and the value instead of training 3 steps. The rules:

* an integer field takes an integer, or a number with a whole value (`1.0e4`); never `true`/`false`;
* a number field takes an integer or a number; a string field only a string (quote `no`, `on`, `2014` in YAML);
* a list field takes a list, or one item on its own (`strategies: greedy`, as `--strategies greedy` on the
  command line) unless that item is text with commas or spaces, which means a list written as one string;
* a mapping field takes a mapping, or its YAML / JSON text; `null` only where the field is optional.

A dataclass whose config-file form is richer than its command-line form (`DataArguments.data_files` also takes a
`{split: paths}` mapping in YAML) declares that form in a `config_file_types` class attribute.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from transformers import HfArgumentParser

__all__ = ["parse_yaml_and_cli"]

_TRUE = ("true", "yes", "y", "t", "on", "1")
_FALSE = ("false", "no", "n", "f", "off", "0")
_SCALAR_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping"}
_PLURALS = {int: "integers", float: "numbers", bool: "booleans (true or false)", str: "strings", dict: "mappings"}


def parse_yaml_and_cli(dataclass_types, argv: list[str] | None = None):
    """Parse `--config file.yaml` (values) and the remaining command line (overrides) into dataclasses.

    YAML keys become the parser's defaults, so any `--name value` on the command line wins. Unknown YAML keys are
    an error, as unknown flags are, and so is a value of the wrong type, from the file or the command line (see the
    module docstring for the rules).

    Args:
        dataclass_types (`list[type]`): The dataclasses whose fields are the keys and flags.
        argv (`list[str]`, *optional*): The command line without the program name (default: `sys.argv[1:]`).

    Returns:
        `tuple`: One instance of each dataclass, in order.

    Raises:
        `FileNotFoundError`: the `--config` file does not exist.
        `ValueError`: the file is not YAML, not a mapping, has unknown keys, or a value of the wrong type.
        `SystemExit`: a command-line error (argparse prints the flag and what is wrong).
    """
    # argparse reads `--config path` and `--config=path` alike, and reports a `--config` without a value
    config_parser = argparse.ArgumentParser(add_help=False)
    config_parser.add_argument("--config", type=str, default=None)
    namespace, _ = config_parser.parse_known_args(argv)
    parser = HfArgumentParser(dataclass_types)
    command_line_types = _field_types(dataclass_types, in_config_file=False)
    for action in parser._actions:
        # `--no_<flag>` complements convert nothing; Literal / Enum fields keep their argparse `choices`
        if action.dest in command_line_types and action.type is not None and action.choices is None:
            action.type = _command_line_type(_item_type(command_line_types[action.dest]))
    parser.add_argument("--config", type=str, default=None, help="YAML file with the values of the fields.")
    if namespace.config:
        path = Path(namespace.config)
        values = _read_config(path)
        field_types = _field_types(dataclass_types, in_config_file=True)
        unknown = sorted(str(key) for key in values if key not in field_types)
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown}; `--help` lists the valid fields.")
        values = {key: _check_config_value(key, value, field_types[key], str(path)) for key, value in values.items()}
        parser.set_defaults(**values)
        # YAML now provides the required fields: stop argparse from demanding them on the command line.
        for action in parser._actions:
            if action.dest in values:
                action.required = False
    *parsed, _config = parser.parse_args_into_dataclasses(args=argv)
    return tuple(parsed)


def _check_config_value(key: str, value: Any, annotation: Any, source: str) -> Any:
    """`value` as the field `key` of type `annotation` takes it (`1.0e4` → 10000, `greedy` → `["greedy"]`).

    Args:
        key (`str`): The field's name, for the message.
        value: What the YAML file (or a caller) gives.
        annotation: The field's declared type (`int`, `float | None`, `list[str]`, `dict`, `Literal[...]`, ...).
        source (`str`): Where the value comes from (the file), for the message.

    Raises:
        `ValueError`: naming the source, the key, the expected type, the value and how to write it.
    """
    try:
        return _check(value, annotation)
    except _Mismatch as mismatch:
        hint = f": {mismatch.hint}" if mismatch.hint else ""
        raise ValueError(
            f"{source}: `{key}` must be {mismatch.expected}, got {_shown(value, with_type=True)}{hint}."
        ) from None


class _Mismatch(Exception):
    """A value that does not fit its type: `expected` says what would, `hint` how to write it."""

    def __init__(self, expected: str, hint: str = ""):
        super().__init__(expected)
        self.expected = expected
        self.hint = hint


def _check(value: Any, annotation: Any) -> Any:
    """The value converted to `annotation`, or `_Mismatch`. Text is read as the command line reads it."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        failures = []
        for member in (arg for arg in args if arg is not type(None)):
            try:
                return _check(value, member)
            except _Mismatch as mismatch:
                failures.append(mismatch)
        hint = next((failure.hint for failure in failures if failure.hint), "")
        raise _Mismatch(" or ".join(failure.expected for failure in failures), hint)
    if value is None:
        raise _Mismatch(_describe(annotation), "only optional fields take null")
    if origin is Literal:
        return _check_choice(value, list(args))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation(_check_choice(value, [member.value for member in annotation]))
    if origin is list or annotation is list:
        return _check_list(value, args[0] if args else Any)
    if origin is dict or annotation is dict:
        return _check_mapping(value)
    if annotation is bool:
        return _check_bool(value)
    if annotation is int:
        return _check_int(value)
    if annotation is float:
        return _check_float(value)
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            raise _Mismatch("a string", "quote it in YAML: unquoted yes/no/on/off/true/false are read as booleans")
        raise _Mismatch("a string", "quote it in YAML: unquoted digits are read as numbers (1.10 as 1.1)")
    return value  # any other declared type is left to the dataclass


def _check_int(value: Any) -> int:
    if isinstance(value, bool):
        raise _Mismatch("an integer", "write a whole number")
    if isinstance(value, int):
        return value
    number = _parse_number(value) if isinstance(value, str) else value
    if isinstance(number, int) and not isinstance(number, bool):
        return number
    if isinstance(number, float):
        if number.is_integer():  # `1.0e4` in YAML, `--max_steps 1e4` on the command line
            return int(number)
        lower = int(number // 1) if number == number and abs(number) != float("inf") else None
        example = f" such as {lower} or {lower + 1}" if lower is not None else ""
        raise _Mismatch("an integer", f"write a whole number{example}")
    raise _Mismatch("an integer")


def _check_float(value: Any) -> float:
    if isinstance(value, bool):
        raise _Mismatch("a number", "write a number such as 0.5")
    if isinstance(value, (int, float)):
        return float(value)
    number = _parse_number(value) if isinstance(value, str) else None
    if number is None:
        raise _Mismatch("a number", "write a number such as 0.5 or 5e-4")
    return float(number)


def _parse_number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _check_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _Mismatch("true or false")


def _check_choice(value: Any, choices: list) -> Any:
    for choice in choices:
        if value == choice or (isinstance(value, str) and value == str(choice)):
            return choice
    raise _Mismatch(f"one of {', '.join(str(choice) for choice in choices)}")


def _check_list(value: Any, item_type: Any) -> list:
    expected = f"a list of {_PLURALS.get(item_type, 'values')}"
    if isinstance(value, str) and any(character.isspace() or character == "," for character in value.strip()):
        items = [item for item in value.replace(",", " ").split() if item]
        raise _Mismatch(expected, f"write a YAML list, e.g. [{', '.join(items)}]")
    if isinstance(value, dict):
        raise _Mismatch(expected, "write a YAML list, e.g. [a, b]")
    if not isinstance(value, (list, tuple)):
        # one item on its own is a list of one, as `--strategies greedy` is on the command line
        try:
            return [_check(value, item_type)]
        except _Mismatch as mismatch:
            raise _Mismatch(
                f"{expected} (or one {mismatch.expected.removeprefix('a ').removeprefix('an ')})", mismatch.hint
            ) from None
    checked = []
    for index, item in enumerate(value):
        try:
            checked.append(_check(item, item_type))
        except _Mismatch as mismatch:
            detail = f"item {index} ({_shown(item)}) is not {mismatch.expected}"
            raise _Mismatch(expected, f"{detail}; {mismatch.hint}" if mismatch.hint else detail) from None
    return checked


def _check_mapping(value: Any) -> dict:
    if isinstance(value, str):  # `--drafter_config '{"decoder_layers": 1}'`: YAML or JSON text of a mapping
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise _Mismatch("a mapping", "write YAML or JSON such as {decoder_layers: 1}") from None
        if value is None:
            return {}
    if isinstance(value, dict):
        return value
    raise _Mismatch("a mapping", "write it as key: value pairs, e.g. {decoder_layers: 1} ({} for none)")


def _describe(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list or annotation is list:
        return f"a list of {_PLURALS.get(args[0] if args else Any, 'values')}"
    if origin is dict:
        return "a mapping"
    if origin is Literal:
        return f"one of {', '.join(str(arg) for arg in args)}"
    return _SCALAR_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _shown(value: Any, with_type: bool = False) -> str:
    """A value as it would be written in YAML (text quoted), shortened; with its Python type when asked."""
    if isinstance(value, str):
        text = repr(value)
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({type(value).__name__})" if with_type and value is not None else text


def _command_line_type(annotation: Any):
    """The argparse `type` of a field: command-line text converted by the same rules as YAML values."""

    def convert(text: str):
        try:
            return _check(text, annotation)
        except _Mismatch as mismatch:
            hint = f" ({mismatch.hint})" if mismatch.hint else ""
            raise argparse.ArgumentTypeError(f"must be {mismatch.expected}, got {text!r}{hint}") from None

    return convert


def _item_type(annotation: Any) -> Any:
    """What argparse converts one command-line word into: the item type of a list, the type of an optional."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union or origin is types.UnionType:
        members = [arg for arg in args if arg is not type(None)]
        return _item_type(members[0]) if len(members) == 1 else annotation
    if origin is list:
        return args[0] if args else Any
    return annotation


def _field_types(dataclass_types, in_config_file: bool) -> dict[str, Any]:
    """Every field's declared type; in a config file, the richer one its dataclass may declare for it there."""
    field_types = {}
    for dataclass_type in dataclass_types:
        hints = typing.get_type_hints(dataclass_type)
        overrides = getattr(dataclass_type, "config_file_types", {}) if in_config_file else {}
        for field in dataclasses.fields(dataclass_type):
            field_types[field.name] = overrides.get(field.name, hints[field.name])
    return field_types


def _read_config(path: Path) -> dict:
    if not path.is_file():
        state = "is a directory, not a YAML file" if path.is_dir() else "no such file"
        raise FileNotFoundError(f"--config {path}: {state}.")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}," if mark is not None else ""
        problem = " ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None)))) or str(err)
        raise ValueError(f"{path}{where} is not valid YAML: {problem}.") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a text file ({err}): give a YAML file of `key: value` lines.") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(
            f"{path} must hold `key: value` lines (a YAML mapping), but holds {type(values).__name__} "
            f"{_shown(values)}."
        )
    return values
