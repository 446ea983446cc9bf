"""Waiting for a device, so that a wall-clock reading covers the work queued on it (decoding and evaluation both
time their steps)."""

from __future__ import annotations

import torch

__all__ = ["synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on `device` (a no-op on CPU), so that a wall-clock reading covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
