"""The weight dtypes the scripts accept by name (`--dtype float32`), and their torch dtypes."""

from __future__ import annotations

import torch

__all__ = ["TORCH_DTYPES", "torch_dtype"]

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called `name` (a key of `TORCH_DTYPES`).

    Raises:
        ValueError: naming the valid choices.
    """
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(TORCH_DTYPES)}, got {name!r}.")
    return TORCH_DTYPES[name]
