"""Resumable checkpoints that a kill cannot corrupt: write to a temporary directory, then rename it into place."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

__all__ = ["find_latest_checkpoint", "read_training_state", "save_checkpoint_atomically"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_STATE_FILE = "training_state.json"


def save_checkpoint_atomically(accelerator, output_dir: str | Path, step: int, state: dict, keep: int) -> Path:
    """`accelerator.save_state` into `output_dir/checkpoint-{step}` via a temporary directory and a rename.

    A run killed while writing leaves only a `.tmp` directory, which `find_latest_checkpoint` ignores, so the last
    good checkpoint stays usable. Only the main process renames and prunes; all processes take part in the save.

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
    if accelerator.is_main_process and temporary.exists():
        shutil.rmtree(temporary)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(temporary))
    # every rank writes its own files (RNG states, ...): all must be done before the directory is marked complete
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (temporary / _STATE_FILE).write_text(json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        temporary.rename(final)
        for old in _checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


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


def read_training_state(checkpoint: str | Path) -> dict:
    """The extra training state saved with a checkpoint."""
    path = Path(checkpoint) / _STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} is not a complete checkpoint (no {_STATE_FILE}).")
    return json.loads(path.read_text())
