"""A training run's `output_dir` before the first step: nothing of an earlier run or of the verifier is overwritten.

A new run into a directory that holds an earlier one would overwrite its finished drafter and model card, prune its
own fresh checkpoints next to the earlier run's higher-numbered ones (so that `--resume_from_checkpoint latest` later
resumes the *earlier* run under the new settings), and an `output_dir` that is the verifier's directory would
overwrite the verifier's `config.json` and weights. So an earlier run must be continued (`--resume_from_checkpoint`)
or replaced on purpose (`--overwrite_output_dir`, which removes its checkpoints and saved drafter first).
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["earlier_run_files", "prepare_output_dir"]

# what a run writes at its top level (save_pretrained, the evaluation, the model card), besides its checkpoints
_RUN_FILES = ("config.json", "model.safetensors", "eval_results.json", "README.md")


def earlier_run_files(output_dir: str | Path) -> list[Path]:
    """The checkpoints (complete or not) and saved-drafter files of an earlier run in `output_dir`."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    checkpoints = sorted(path for path in output_dir.glob("checkpoint-*") if path.is_dir())
    return checkpoints + [output_dir / name for name in _RUN_FILES if (output_dir / name).is_file()]


def prepare_output_dir(
    output_dir: str | Path,
    verifier_name_or_path: str,
    resume_from_checkpoint: str | None,
    overwrite_output_dir: bool,
    remove: bool = True,
) -> None:
    """Refuse an `output_dir` whose use would destroy something; with `overwrite_output_dir`, clear the earlier run.

    Args:
        output_dir: The run's directory.
        verifier_name_or_path (`str`): The verifier; when a local directory, `output_dir` may not be it or hold it.
        resume_from_checkpoint (`str`, *optional*): Set when the run continues an earlier one.
        overwrite_output_dir (`bool`): Replace an earlier run: its checkpoints and saved drafter are removed.
        remove (`bool`): Whether this process removes them (the one process that writes checkpoints); the others
            only check.

    Raises:
        `ValueError`: `output_dir` is (or holds) the verifier; it holds an earlier run and neither
            `resume_from_checkpoint` nor `overwrite_output_dir` says what to do with it; or both are set.
    """
    output = Path(output_dir).resolve()
    verifier = Path(verifier_name_or_path)
    if verifier.is_dir() and (output == verifier.resolve() or output in verifier.resolve().parents):
        raise ValueError(
            f"`output_dir` {output_dir} is (or holds) the verifier {verifier_name_or_path}: the run would overwrite "
            "its config.json and weights. Choose another `output_dir`."
        )
    if resume_from_checkpoint and overwrite_output_dir:
        raise ValueError(
            "`resume_from_checkpoint` continues the run in `output_dir` and `overwrite_output_dir` discards it: "
            "pass only one of them."
        )
    earlier = earlier_run_files(output)
    if not earlier or resume_from_checkpoint:
        return
    if not overwrite_output_dir:
        names = ", ".join(path.name for path in earlier[:4]) + (", ..." if len(earlier) > 4 else "")
        raise ValueError(
            f"`output_dir` {output_dir} holds an earlier run ({names}). Pass `--resume_from_checkpoint latest` to "
            "continue it, `--overwrite_output_dir` to replace it (its checkpoints and drafter are removed), or "
            "choose another `output_dir`."
        )
    if remove:
        for path in earlier:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
