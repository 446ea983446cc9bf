"""The machine a timing ran on: its CPU model, and whether other processes compete for the cores a run needs."""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["check_machine_load", "cpu_model", "load_average", "shared_machine_warning"]

logger = logging.getLogger(__name__)

# a busy shell, the run's own start-up: load the 1-minute average shows without slowing a run down
_LOAD_MARGIN = 0.5


def cpu_model() -> str:
    """The CPU's model name from `/proc/cpuinfo` (Linux), else `platform.processor()` or the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The 1-minute load average, or `None` where the system keeps none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def shared_machine_warning(load: float, cpu_count: int, threads: int) -> str | None:
    """A warning when other processes already keep busy the cores a run's threads need; `None` otherwise.

    Rule: a run with `threads` threads needs `threads` cores, so other processes may keep the other
    `cpu_count - threads` cores busy without slowing it down. The load average taken before the run starts counts
    those processes (running or waiting for a core); when it exceeds `cpu_count - threads` by more than half a core,
    some of the run's threads will share a core and its timings measure the neighbours as much as the strategies.
    With `threads >= cpu_count` any load above 0.5 warns.

    Args:
        load (`float`): The 1-minute load average before the run.
        cpu_count (`int`): Logical cores of the machine.
        threads (`int`): Threads the run computes with (`torch.get_num_threads()`).

    Returns:
        `str` or `None`: the warning, naming the figures.
    """
    free_cores = max(cpu_count - threads, 0)
    if load <= free_cores + _LOAD_MARGIN:
        return None
    return (
        f"load average {load:.2f} on {cpu_count} CPU cores before the run, which needs {threads} of them: other "
        f"processes compete for its cores, so its timings drift with theirs. Strategies are timed interleaved, "
        f"which keeps speed-ups paired, but prefer an idle machine or fewer `num_threads`."
    )


def check_machine_load(threads: int) -> dict[str, Any]:
    """Read the load average, log a warning when the machine is shared (`shared_machine_warning`), return both.

    Returns:
        `dict`: `load_average_1min` (`None` where unavailable) and `shared_machine_warning` (`None` when idle enough),
        for the environment record.
    """
    load = load_average()
    warning = None if load is None else shared_machine_warning(load, os.cpu_count() or 1, threads)
    if warning is not None:
        logger.warning(warning)
    return {"load_average_1min": load, "shared_machine_warning": warning}
