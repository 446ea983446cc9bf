"""Progress bars that show on a terminal and stay out of log files."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from tqdm.auto import tqdm

__all__ = ["progress_bar"]

T = TypeVar("T")


def progress_bar(iterable: Iterable[T], desc: str, disable_tqdm: bool = False) -> Iterable[T]:
    """`iterable` wrapped in a transient tqdm bar, drawn only when stderr is a terminal.

    tqdm's `disable=None` turns a bar off when its stream is not a TTY: `evaluate.py > log.txt 2>&1` would otherwise
    fill the log with one carriage-return redraw per update. In a notebook (`tqdm.auto`) the bar still shows.

    Args:
        iterable (`Iterable`): What to iterate over.
        desc (`str`): The bar's label.
        disable_tqdm (`bool`): Hide the bar on a terminal too.
    """
    return tqdm(iterable, desc=desc, leave=False, disable=True if disable_tqdm else None)
