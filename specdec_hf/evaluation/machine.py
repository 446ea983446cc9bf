"""The machine a timing ran on: its CPU model, and whether other processes compete for the cores a run needs."""

from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

__all__ = ["busy_cores", "check_machine_load", "cpu_model", "load_average", "shared_machine_warning"]

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


def busy_cores(interval: float = 0.5) -> float | None:
    """How many cores other processes keep busy now: the non-idle share of all CPU time over `interval` seconds,
    times the cores (Linux `/proc/stat`); `None` elsewhere.

    Unlike the load average, which decays over a minute, this reads what runs at the moment the run starts (before
    it loads its models), so a job that just ended, or this command's own set-up, does not count.
    """

    def read() -> tuple[int, int] | None:
        try:
            fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    first = read()
    if first is None:
        return None
    time.sleep(interval)
    second = read()
    total, idle = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    return (total - idle) / total * (os.cpu_count() or 1)


def shared_machine_warning(load: float, cpu_count: int, threads: int) -> str | None:
    """A warning when other processes already keep busy the cores a run's threads need; `None` otherwise.

    Rule: a run with `threads` threads needs `threads` cores, so other processes may keep the other
    `cpu_count - threads` cores busy without slowing it down. `load` counts those processes (the cores they keep busy
    just before the run, or the load average); when it exceeds `cpu_count - threads` by more than half a core,
    some of the run's threads will share a core and its timings measure the neighbours as much as the strategies.
    With `threads >= cpu_count` any load above 0.5 warns.

    Args:
        load (`float`): Cores other processes keep busy before the run (`busy_cores`, or the 1-minute load average).
        cpu_count (`int`): Logical cores of the machine.
        threads (`int`): Threads the run computes with: torch's, or a peer runtime's where it takes more
            (the evaluation's CTranslate2 rows, `ct2_threads`).

    Returns:
        `str` or `None`: the warning, naming the figures.
    """
    free_cores = max(cpu_count - threads, 0)
    if load <= free_cores + _LOAD_MARGIN:
        return None
    return (
        f"load {load:.2f} on {cpu_count} CPU cores before the run, which needs {threads} of them: other "
        f"processes compete for its cores, so its timings drift with theirs. Strategies are timed interleaved, "
        f"which keeps speed-ups paired, but prefer an idle machine or fewer threads (`num_threads`, `ct2_threads`)."
    )


def check_machine_load(threads: int) -> dict[str, Any]:
    """Measure what else runs (`busy_cores`, else the load average), log a warning when the machine is shared
    (`shared_machine_warning`), and return the figures.

    Returns:
        `dict`: `busy_cores_before_run` and `load_average_1min` (`None` where unavailable) and
        `shared_machine_warning` (`None` when idle enough), for the environment record.
    """
    busy, load = busy_cores(), load_average()
    measure = busy if busy is not None else load
    warning = None if measure is None else shared_machine_warning(measure, os.cpu_count() or 1, threads)
    if warning is not None:
        logger.warning(warning)
    return {"busy_cores_before_run": busy, "load_average_1min": load, "shared_machine_warning": warning}
