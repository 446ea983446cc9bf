"""Wall-clock measurement: synchronised timers, forward-hook timers on model instances and a timing drafter wrapper.

Nothing is patched: `ModuleTimer` registers forward hooks on given module *instances* (and removes them), and
`TimedDrafter` is a `Drafter` that delegates to the real one, so the speculative loop sees an ordinary drafter.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..device_sync import synchronize
from ..drafting import Drafter, DraftProposal
from ..generation.wrapping_drafter import WrappingDrafter

__all__ = ["ModuleTimer", "TimedDrafter", "median", "synchronize", "timed"]


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Run `fn()` and return (seconds, its result), synchronising `device` before and after."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def median(values: Iterable[float]) -> float:
    """The median of `values` (the figure reported for repeated timings)."""
    return statistics.median(list(values))


class ModuleTimer:
    """Time spent in the forward passes of some module instances, counted once when they nest.

    Registers forward pre-hooks and hooks on each module (e.g. a verifier and its encoder, which `generate()` calls
    separately) and accumulates the time of outermost calls. `calls[i]` counts the outermost calls of `modules[i]`.
    Use as a context manager: the hooks are removed on exit.

    Args:
        modules (`Iterable[torch.nn.Module]`): The instances to time.
        device (`torch.device`): Synchronised around each call on CUDA (so only for instrumented, untimed passes).
    """

    def __init__(self, modules: Iterable[torch.nn.Module], device: torch.device):
        self.modules = list(modules)
        self.device = device
        self.total_s = 0.0
        self.calls = [0] * len(self.modules)
        self._depth = 0
        self._start = 0.0
        self._handles: list = []

    def __enter__(self) -> ModuleTimer:
        for index, module in enumerate(self.modules):
            self._handles.append(module.register_forward_pre_hook(self._pre_hook))
            self._handles.append(module.register_forward_hook(self._make_post_hook(index)))
        return self

    def __exit__(self, *exc_info) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_hook(self, module, args) -> None:
        if self._depth == 0:
            synchronize(self.device)
            self._start = time.perf_counter()
        self._depth += 1

    def _make_post_hook(self, index: int):
        def post_hook(module, args, output) -> None:
            self._depth -= 1
            if self._depth == 0:
                synchronize(self.device)
                self.total_s += time.perf_counter() - self._start
                self.calls[index] += 1

        return post_hook


class TimedDrafter(WrappingDrafter):
    """A `Drafter` that times the wrapped drafter's `init_drafting_state` and `propose` calls.

    Args:
        drafter (`Drafter` or `SpecDrafterModel`): The real drafter (a model is wrapped in its adapter).
        device (`torch.device`): Synchronised around each call on CUDA.
    """

    passes_proposals_through = True

    def __init__(self, drafter: Drafter, device: torch.device):
        super().__init__(drafter)
        self.device = device
        self.total_s = 0.0
        self.propose_s = 0.0  # the part of `total_s` spent in `propose` (the rest: `init_drafting_state`)
        self.propose_calls = 0

    def _time(self, fn: Callable[[], Any]) -> Any:
        seconds, result = timed(fn, self.device)
        self.total_s += seconds
        return result

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states) -> Any:
        return self._time(lambda: self.drafter.init_drafting_state(input_ids, attention_mask, encoder_hidden_states))

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None) -> DraftProposal:
        """The wrapped drafter's proposal, timed."""
        self.propose_calls += 1
        before = self.total_s
        proposal = self._time(
            lambda: self.drafter.propose(state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states)
        )
        self.propose_s += self.total_s - before
        return proposal

    def select_rows(self, state, rows) -> Any:
        return self.drafter.select_rows(state, rows)
