"""Memory: parameter bytes of a model and the activation peak of one `generate()` call.

* CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus what was allocated before the call
  (the models' weights), i.e. the call's own peak.
* CPU: there is no allocator peak counter, so the call runs under `torch.profiler` with `profile_memory=True`, and
  the peak is the running sum of every op's net allocation (its own, children excluded) and of the frees, in
  start-time order. A buffer allocated and freed inside one op is not seen, so this is a slight lower bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["measure_peak_memory", "memory_method", "parameter_bytes", "peak_from_profiler_events"]


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes held by `model`'s parameters and buffers (each shared tensor counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        pointer = tensor.data_ptr()
        if pointer in seen:
            continue
        seen.add(pointer)
        total += tensor.numel() * tensor.element_size()
    return total


def memory_method(device: torch.device) -> str:
    """How `measure_peak_memory` measures on `device`, in words (saved next to the figures)."""
    if device.type == "cuda":
        return "cuda: torch.cuda.max_memory_allocated during the call minus memory allocated before it"
    return (
        "cpu: torch.profiler(profile_memory=True); peak of the running sum of each op's net self allocation and "
        "the frees, in start order (allocations freed inside one op are not seen: a lower bound)"
    )


def peak_from_profiler_events(events: Iterable[Any]) -> int:
    """Peak of the running allocation total over profiler events (`self_cpu_memory_usage`, `time_range.start`).

    Op events carry their own net allocation (children excluded), `[memory]` events the frees (and allocations)
    outside any op; summing both in start-time order follows the live bytes. Never below 0.
    """
    changes = [
        (event.time_range.start, event.self_cpu_memory_usage)
        for event in events
        if getattr(event, "self_cpu_memory_usage", 0)
    ]
    changes.sort(key=lambda change: change[0])
    current = peak = 0
    for _, delta in changes:
        current += delta
        peak = max(peak, current)
    return int(peak)


def measure_peak_memory(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes allocated by `fn()` on `device` above what was allocated when it started (see module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        fn()
    return peak_from_profiler_events(profile.events())
