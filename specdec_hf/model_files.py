"""Models, tokenizers and checkpoints read from disk, with errors that name the argument and the file at fault.

transformers reports a missing local directory as a Hub problem ("We couldn't connect to 'https://huggingface.co'"
when offline, "Repo id must be in the form 'repo_name' or 'namespace/repo_name'" for a path of three parts), and
safetensors or torch report a truncated file without its name ("incomplete metadata, file not fully covered",
"failed finding central directory"). `load_pretrained` wraps the project's own `from_pretrained` calls: it checks a
name that is not a directory before transformers sees it, and after a failed load looks for the damaged file;
`find_damaged_file` serves resumable checkpoints too. A directory that loads is never read twice.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import huggingface_hub
import safetensors
from huggingface_hub.errors import HFValidationError

__all__ = ["find_damaged_file", "load_pretrained"]

_Loaded = TypeVar("_Loaded")
# files `torch.save` writes (a zip archive since torch 1.6), by the names transformers and accelerate give them
_TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".pkl")
# one of these in the Hub cache means a Hub id was downloaded before and can load offline (ngram_store.json: an
# n-gram store, whose config.json holds only its drafter's settings and may be absent)
_CACHED_MARKERS = ("config.json", "tokenizer_config.json", "ngram_store.json")


def load_pretrained(load: Callable[..., _Loaded], name_or_path: str, argument: str, **kwargs) -> _Loaded:
    """`load(name_or_path, **kwargs)` (a `from_pretrained`), with errors naming `argument` and the file at fault.

    Args:
        load (`Callable`): E.g. `AutoModelForSeq2SeqLM.from_pretrained`, `SpecDrafterModel.from_pretrained`.
        name_or_path (`str`): A local directory or a Hub id.
        argument (`str`): The field or parameter that named it (`drafters`, `verifier_name_or_path`).
        **kwargs: Passed to `load`.

    Raises:
        `FileNotFoundError`: `name_or_path` is no directory and cannot be a Hub id, or the Hub is off (offline mode)
            and nothing of that name is in its cache.
        `OSError`: a weight file of the directory is damaged (the message names it), or `name_or_path` is no
            directory and could not be loaded as a Hub id either (the message adds the loader's).
    """
    path = Path(name_or_path).expanduser()
    if not path.exists():
        _check_hub_id(str(name_or_path), argument)
    elif not path.is_dir():
        raise NotADirectoryError(
            f"`{argument}` {str(name_or_path)!r} is a file: give the directory that holds config.json and the weights "
            f"(e.g. {str(path.parent)!r})."
        )
    try:
        return load(name_or_path, **kwargs)
    except Exception as err:  # whatever the loader raised: name a damaged file, else let it through
        if path.is_dir():
            _raise_if_damaged(path, name_or_path, argument, err)
        elif isinstance(err, OSError):
            # a Hub id that could not be fetched (no network without HF_HUB_OFFLINE, no such repository) may as
            # well be a mistyped directory, which transformers' message does not say
            raise OSError(
                f"`{argument}` {str(name_or_path)!r}: {_no_such_directory(str(name_or_path))}, and as a Hub id it "
                f"could not be loaded either: {err}"
            ) from err
        raise


def _raise_if_damaged(path: Path, name_or_path: str, argument: str, err: Exception) -> None:
    damaged = find_damaged_file(path)
    if damaged is not None:
        file, problem = damaged
        raise OSError(
            f"`{argument}` {str(name_or_path)!r}: {file} cannot be read ({problem}); it is probably truncated (an "
            "interrupted download, copy or save): save or copy it again."
        ) from err


def find_damaged_file(directory: str | os.PathLike) -> tuple[Path, str] | None:
    """The first weight or state file of `directory` that cannot be read whole, with why, or `None`.

    Reads the safetensors headers (which must cover the whole file) and checks the zip archives `torch.save`
    writes (their central directory and checksums); files in torch's pre-1.6 format are not checked.

    Args:
        directory (`str` or `os.PathLike`): A model directory or a checkpoint.
    """
    for path in sorted(Path(directory).iterdir()):
        if path.suffix == ".safetensors":
            try:
                with safetensors.safe_open(str(path), framework="pt"):
                    pass
            except Exception as err:  # safetensors raises its own SafetensorError (and OSError)
                return path, f"{type(err).__name__}: {err}"
        elif path.suffix in _TORCH_SUFFIXES and path.is_file():
            problem = _zip_problem(path)
            if problem is not None:
                return path, problem
    return None


def _zip_problem(path: Path) -> str | None:
    with path.open("rb") as handle:
        legacy = handle.read(1) == b"\x80"  # a bare pickle: torch's pre-1.6 format, which has no checksums
    if legacy:
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            bad_member = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"not a complete torch.save archive: {err}"
    return None if bad_member is None else f"member {bad_member} fails its checksum"


def _no_such_directory(name: str) -> str:
    return "no such directory" + ("" if Path(name).is_absolute() else f" (relative to {os.getcwd()})")


def _check_hub_id(name: str, argument: str) -> None:
    where = _no_such_directory(name)
    try:
        huggingface_hub.utils.validate_repo_id(name)
    except HFValidationError:
        raise FileNotFoundError(
            f"`{argument}` {name!r}: {where}, and not a Hub id either (those read 'name' or 'owner/name'): check the "
            "path."
        ) from None
    # try_to_load_from_cache: a path when cached, else None or a sentinel (a file known not to exist)
    cached = any(isinstance(huggingface_hub.try_to_load_from_cache(name, file), str) for file in _CACHED_MARKERS)
    if _hub_offline() and not cached:
        raise FileNotFoundError(
            f"`{argument}` {name!r}: {where}, and as a Hub id it is not in the local Hub cache, which is all that "
            "offline mode (HF_HUB_OFFLINE) reads: check the path, or download the model with network access."
        )


def _hub_offline() -> bool:
    """Whether the Hub may not be reached (HF_HUB_OFFLINE); a function so that tests can take either side."""
    return huggingface_hub.constants.HF_HUB_OFFLINE  # HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE, read at import
