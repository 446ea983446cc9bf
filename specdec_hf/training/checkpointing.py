"""Resumable checkpoints that a kill cannot corrupt: write to a temporary directory, then rename it into place."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ..model_files import find_damaged_file

__all__ = [
    "check_checkpoint_files",
    "check_data_order",
    "find_latest_checkpoint",
    "is_checkpoint_writer",
    "load_checkpoint",
    "read_training_state",
    "save_checkpoint_atomically",
]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_STATE_FILE = "training_state.json"


def save_checkpoint_atomically(accelerator, output_dir: str | Path, step: int, state: dict, keep: int) -> Path:
    """`accelerator.save_state` into `output_dir/checkpoint-{step}` via a temporary directory and a rename.

    A run killed while writing leaves only a `.tmp` directory, which `find_latest_checkpoint` ignores, so the last
    good checkpoint stays usable. All processes take part in the save; the main process renames and prunes, or,
    when the accelerator saves on each node (`ProjectConfiguration(save_on_each_node=True)`: machines without a
    shared filesystem), each machine's local main process does so in its own `output_dir`, so that every machine
    can resume from `latest`.

    Args:
        accelerator (`accelerate.Accelerator`): Saves model, optimizer, scheduler, RNG and dataloader states.
        output_dir: Directory holding the checkpoints.
        step (`int`): The optimizer step the checkpoint is taken after.
        state (`dict`): Extra JSON-serialisable training state (step, epoch, batches consumed, ...).
        keep (`int`): Number of newest checkpoints to keep.
    """
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    temporary = output_dir / f"checkpoint-{step}.tmp"
    writes = is_checkpoint_writer(accelerator)
    if writes and temporary.exists():
        shutil.rmtree(temporary)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(temporary))
    # every rank writes its own files (RNG states, ...): all must be done before the directory is marked complete
    accelerator.wait_for_everyone()
    if writes:
        (temporary / _STATE_FILE).write_text(json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        temporary.rename(final)
        for old in _checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def is_checkpoint_writer(accelerator) -> bool:
    """Whether this process writes what is not per rank (the state file, the rename, the pruning): the main process,
    or each machine's local main process when the accelerator saves on each node."""
    if accelerator.project_configuration.save_on_each_node:
        return accelerator.is_local_main_process
    return accelerator.is_main_process


def _checkpoints(output_dir: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in output_dir.glob("checkpoint-*") if (m := _CHECKPOINT.match(p.name))]
    return [path for _, path in sorted(found)]


def find_latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step in `output_dir`, or `None`."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    complete = [path for path in _checkpoints(output_dir) if (path / _STATE_FILE).is_file()]
    return complete[-1] if complete else None


def read_training_state(checkpoint: str | Path, state_keys: tuple[str, ...] = ("step",)) -> dict:
    """The extra training state saved with a checkpoint; `state_keys` name the integers it must hold (where the run
    stopped).

    Raises:
        `FileNotFoundError`: `checkpoint` is not a complete checkpoint.
        `ValueError`: its state file is damaged (not JSON, or without the step and data position).
    """
    path = Path(checkpoint) / _STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete checkpoint (no {_STATE_FILE}).")
    try:
        state = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged ({err}): {_resume_elsewhere(Path(checkpoint))}.") from None
    missing = [key for key in state_keys if not isinstance(state, dict) or not isinstance(state.get(key), int)]
    if missing:
        raise ValueError(
            f"{path} is damaged: it lacks the integer field(s) {', '.join(missing)} that say where the run stopped; "
            f"{_resume_elsewhere(Path(checkpoint))}."
        )
    return state


def check_checkpoint_files(checkpoint: str | Path, process_index: int, custom_objects: int = 0) -> None:
    """Refuse a checkpoint that lacks a file the resume needs (accelerate would go on without some of them, e.g. a
    missing RNG state, and resume with other random draws).

    Raises:
        `FileNotFoundError`: naming the missing files and the way out.
    """
    checkpoint = Path(checkpoint)
    needed = ["optimizer.bin", f"random_states_{process_index}.pkl"]
    # objects registered with `register_for_checkpointing` (the learning-rate scheduler)
    needed += [f"custom_checkpoint_{index}.pkl" for index in range(custom_objects)]
    missing = [name for name in needed if not (checkpoint / name).is_file()]
    if not any((checkpoint / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
        missing.append("model.safetensors")
    if missing:
        raise FileNotFoundError(
            f"{checkpoint} lacks {', '.join(missing)}, which resuming needs: {_resume_elsewhere(checkpoint)}."
        )


def _resume_elsewhere(checkpoint: Path) -> str:
    """The way out from a checkpoint that cannot be resumed: an earlier complete one, or a new run."""
    earlier = [
        path
        for path in _checkpoints(checkpoint.parent)
        if (path / _STATE_FILE).is_file() and path.resolve() != checkpoint.resolve()
    ]
    if _step(checkpoint) is not None:
        earlier = [path for path in earlier if _step(path) < _step(checkpoint)]
    if earlier:
        return (
            f"resume from the previous checkpoint instead (`--resume_from_checkpoint {earlier[-1]}`), or delete "
            f"{checkpoint} and resume from `latest`"
        )
    return "no earlier checkpoint is left: train again with `--overwrite_output_dir`"


def load_checkpoint(
    accelerator, checkpoint: str | Path, custom_objects: int = 0, state_keys: tuple[str, ...] = ("step",)
) -> dict:
    """Restore `checkpoint` into `accelerator` (`load_state`) and return its extra training state.

    A damaged file (truncated by a full disk, or a copy cut short) is named, with the previous complete checkpoint
    to resume from instead; torch alone reports "failed finding central directory" without the file.

    Args:
        accelerator (`accelerate.Accelerator`): The one the checkpoint was saved with (same objects registered).
        checkpoint: A directory written by `save_checkpoint_atomically`.
        custom_objects (`int`): How many objects were registered with `register_for_checkpointing` (their files
            must be there).
        state_keys (`tuple[str, ...]`): The integers the extra training state must hold.

    Raises:
        `FileNotFoundError`: `checkpoint` is not a complete checkpoint, or lacks a file resuming needs.
        `ValueError`: its state file is damaged.
        `RuntimeError`: a file of the checkpoint cannot be read (the message names it and the way out).
    """
    checkpoint = Path(checkpoint)
    state = read_training_state(checkpoint, state_keys)  # first: an incomplete checkpoint is reported as such
    check_checkpoint_files(checkpoint, accelerator.process_index, custom_objects)
    try:
        accelerator.load_state(str(checkpoint))
    except Exception as err:  # whatever torch or safetensors raised: name the damaged file, else let it through
        damaged = find_damaged_file(checkpoint)
        if damaged is None:
            raise
        file, problem = damaged
        fix = _resume_elsewhere(checkpoint)
        raise RuntimeError(
            f"cannot resume from {checkpoint}: {file} cannot be read ({problem}); it is probably truncated (a full "
            f"disk, or a copy cut short). {fix[0].upper()}{fix[1:]}."
        ) from err
    return state


def _step(checkpoint: Path) -> int | None:
    match = _CHECKPOINT.match(checkpoint.name)
    return int(match.group(1)) if match else None


def check_data_order(saved: dict | None, current: dict) -> None:
    """Refuse a resume whose batches would not continue where the run stopped: the checkpoint's data position
    (batches consumed in the epoch) means the same examples only with the same batch size, accumulation, processes,
    seed and data. A checkpoint written before these were recorded (`saved` is `None`) is taken as it is.

    Raises:
        `ValueError`: naming each setting that changed, with both values.
    """
    if saved is None:
        return
    changed = {key: (saved.get(key), value) for key, value in current.items() if saved.get(key) != value}
    if changed:
        changes = ", ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed.items())
        raise ValueError(
            f"the checkpoint was written with other data-order settings ({changes}): resuming would skip other "
            "examples than those already trained on. Resume with the checkpoint's values, or start a new run "
            "(another `output_dir`, or `--overwrite_output_dir`)."
        )
