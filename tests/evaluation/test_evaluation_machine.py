"""The shared-machine warning rule, the CPU model and progress bars that stay out of redirected output."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from specdec_hf.evaluation import machine
from specdec_hf.evaluation.machine import check_machine_load, cpu_model, shared_machine_warning
from specdec_hf.evaluation.progress import progress_bar


@pytest.mark.parametrize(
    ("load", "cpu_count", "threads", "warns"),
    [
        (0.3, 8, 4, False),  # idle
        (4.4, 8, 4, False),  # others keep the 4 cores the run leaves free busy (within the half-core margin)
        (4.6, 8, 4, True),  # ... and more: one of the run's cores is shared
        (2.56, 2, 1, True),  # two training jobs on a 2-core machine, a 1-thread run
        (0.4, 4, 4, False),  # every core for the run, next to nothing else
        (0.6, 4, 4, True),
        (0.6, 4, 8, True),  # more threads than cores: no core is free for anything else
    ],
)
def test_shared_machine_warning_rule(load, cpu_count, threads, warns):
    warning = shared_machine_warning(load, cpu_count, threads)
    assert (warning is not None) == warns
    if warns:
        assert f"load {load:.2f} on {cpu_count} CPU cores" in warning
        assert f"needs {threads} of them" in warning


def test_check_machine_load_logs_and_records(monkeypatch, caplog):
    monkeypatch.setattr(machine, "busy_cores", lambda: None)  # not Linux: the load average decides
    monkeypatch.setattr(machine, "load_average", lambda: 7.0)
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 8)
    with caplog.at_level(logging.WARNING, logger=machine.__name__):
        record = check_machine_load(threads=4)
    assert record["load_average_1min"] == 7.0
    assert record["shared_machine_warning"] in caplog.text
    # what runs now decides over a load average that still remembers a finished job
    monkeypatch.setattr(machine, "busy_cores", lambda: 0.1)
    assert check_machine_load(threads=4)["shared_machine_warning"] is None
    monkeypatch.setattr(machine, "busy_cores", lambda: None)
    monkeypatch.setattr(machine, "load_average", lambda: None)  # no load figure on this system: no warning
    assert check_machine_load(threads=4)["shared_machine_warning"] is None


def test_busy_cores_reads_the_cores_in_use():
    busy = machine.busy_cores(0.05)
    assert busy is None or 0.0 <= busy <= (machine.os.cpu_count() or 1)


def test_cpu_model_names_something():
    assert cpu_model().strip()


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "disable_tqdm", "shown"),
    [(FakeTerminal, False, True), (FakeTerminal, True, False), (io.StringIO, False, False)],
)
def test_progress_bar_only_on_a_terminal(monkeypatch, stream, disable_tqdm, shown):
    monkeypatch.setattr(sys, "stderr", stream())
    bar = progress_bar(range(3), "work", disable_tqdm)
    assert list(bar) == [0, 1, 2]
    assert ("work" in sys.stderr.getvalue()) == shown
