"""Counting the host synchronisations that the project's own code makes inside speculative `generate()`.

On a GPU every read of a device value by the host (`.item()`, `.tolist()`, `bool(tensor)`, `int(tensor)`, a
`nonzero`, a boolean-mask index, a copy to the CPU, a host→device `torch.tensor(...)`) waits until the GPU is idle,
so a speculative iteration is only worth what it saves in launches and waits. `HostSyncCounter` is a
`TorchFunctionMode` that records those calls, on any device (the count does not depend on it), when the call comes
from a file of the `specdec_hf` package (the verifier's own forward and transformers' set-up are not the project's to
change); `per_iteration` splits the count by the verifier's forward calls, so that the one-off set-up before the
first iteration does not weigh on short runs. `torch.cuda.set_sync_debug_mode("warn")` is the device-side check of
the same thing on CUDA.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["HostSyncCounter"]

_PACKAGE = str(Path(__file__).resolve().parents[1])
_SEP = os.sep
_TENSOR = torch.Tensor
# methods and functions that make the host wait for the device (or copy device data to the host)
_SYNCING = {
    _TENSOR.item: "item",
    _TENSOR.tolist: "tolist",
    _TENSOR.__bool__: "bool",
    _TENSOR.__int__: "int",
    _TENSOR.__float__: "float",
    _TENSOR.__index__: "index",
    _TENSOR.cpu: "cpu",
    _TENSOR.numpy: "numpy",
    _TENSOR.nonzero: "nonzero",
    torch.nonzero: "nonzero",
    torch.equal: "equal",
    torch.tensor: "tensor",
    _TENSOR.unique: "unique",
    torch.unique: "unique",
    torch.masked_select: "masked_select",
}


class HostSyncCounter(TorchFunctionMode):
    """
    Counts host-synchronising torch calls made by `specdec_hf`'s code, bucketed by iteration.

    Args:
        verifier (`torch.nn.Module`, *optional*): Its forward calls mark iteration boundaries (each speculative
            iteration runs one verification); without it every call lands in bucket 0.

    Use as a context manager around `generate()`. `counts` (a `Counter` of call names), `by_iteration` (one
    `Counter` per verifier call: the calls made after that call, up to the next one).
    """

    def __init__(self, verifier: torch.nn.Module | None = None):
        super().__init__()
        self.verifier = verifier
        self.counts: Counter = Counter()
        self.by_iteration: list[Counter] = [Counter()]
        self._handle = None

    def __enter__(self):
        if self.verifier is not None:
            self._handle = self.verifier.register_forward_pre_hook(lambda module, args: self._next_iteration())
        return super().__enter__()

    def __exit__(self, *exc_info):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return super().__exit__(*exc_info)

    def _next_iteration(self) -> None:
        self.by_iteration.append(Counter())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _SYNCING.get(func)
        if name is None and func is _TENSOR.__getitem__ and len(args) > 1 and _is_bool_mask(args[1]):
            name = "boolean index"
        if name is None and func in (torch.where, _TENSOR.where) and len(args) + len(kwargs) == 1:
            name = "where(condition)"
        if name is None and func in (torch.repeat_interleave, _TENSOR.repeat_interleave):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if isinstance(repeats, torch.Tensor):
                name = "repeat_interleave(tensor)"
        if name == "tensor" and kwargs.get("device") is None:
            name = None  # a tensor built on the host: no transfer
        if name is not None and _called_from_package():
            self.counts[name] += 1
            self.by_iteration[-1][name] += 1
        return func(*args, **kwargs)

    def per_iteration(self) -> list[int]:
        """The number of counted calls after each verifier call (the last bucket is the loop's wrap-up)."""
        return [sum(counter.values()) for counter in self.by_iteration[1:]]


def _is_bool_mask(index) -> bool:
    if isinstance(index, torch.Tensor):
        return index.dtype == torch.bool
    if isinstance(index, tuple):
        return any(isinstance(part, torch.Tensor) and part.dtype == torch.bool for part in index)
    return False


def _called_from_package() -> bool:
    """Whether the nearest caller outside torch (and outside this file) is a file of `specdec_hf`."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != __file__ and f"{_SEP}torch{_SEP}" not in filename:
            return filename.startswith(_PACKAGE)
        frame = frame.f_back
    return False
