"""Running one strategy over the batches once, instrumented: its outputs, statistics, time shares and memory peak.

This pass is also the strategy's warm-up: forward hooks on the verifier (and on the AR assistant), a timing wrapper
around the drafter, and every output kept. The timed passes are not here: they interleave all strategies
(`interleaved.py`, driven by `runner.py`) through `group_runner`, with nothing attached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..data.padding import trim_at_eos
from .batching import Batch, restore_order
from .memory import measure_peak_memory
from .progress import progress_bar
from .strategies import Strategy
from .timing import ModuleTimer, TimedDrafter, timed

__all__ = ["StrategyRun", "count_generated_tokens", "group_runner", "run_strategy"]


@dataclass
class StrategyRun:
    """What the instrumented pass of one strategy measured (its timed passes are interleaved with the others').

    Args:
        strategy (`Strategy`): The strategy.
        batch_size (`int`): Rows per `generate()` call.
        sequences (`list[list[int]]`): Generated ids per dataset row (data order, up to and including EOS).
        instrumented_s (`float`): Wall time of the instrumented pass (hooks attached).
        verifier_s (`float`): Time inside the verifier's forward passes (encoder and decoder) in that pass.
        verifier_decoder_calls (`int`): The verifier's decoder forward passes in that pass.
        drafter_s (`float`, *optional*): Time inside the drafter (or the AR assistant) in that pass.
        speculative (`dict`, *optional*): Summed speculative statistics (speculative strategies only).
        peak_activation_bytes (`int`, *optional*): Memory peak of one `generate()` call on the first batch.
    """

    strategy: Strategy
    batch_size: int
    sequences: list[list[int]]
    instrumented_s: float
    verifier_s: float
    verifier_decoder_calls: int
    drafter_s: float | None = None
    speculative: dict[str, Any] | None = None
    peak_activation_bytes: int | None = None
    generation_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return sum(len(ids) for ids in self.sequences)

    @property
    def tokens_per_iteration(self) -> float | None:
        """Tok.: tokens per verifier pass. Greedy 1 by definition; beam search and CTranslate2: not defined (None)."""
        kind = self.strategy.kind
        if kind == "greedy":
            return 1.0
        if kind == "speculative":
            return self.speculative["tokens_per_iteration"]
        if kind in ("beam", "ctranslate2"):
            return None
        # assisted / prompt lookup run one row per call: tokens per verifier decoder pass
        return self.generated_tokens / max(self.verifier_decoder_calls, 1)


def _generate_all(verifier, batches: Sequence[Batch], kwargs: dict, desc: str, disable_tqdm: bool) -> list:
    with torch.inference_mode():
        return [verifier.generate(**batch.inputs, **kwargs) for batch in progress_bar(batches, desc, disable_tqdm)]


def _sum_speculative_stats(outputs: list) -> dict[str, Any]:
    stats = [output.speculative_stats for output in outputs]
    generated = sum(sum(s.generated_tokens) for s in stats)
    iterations = sum(sum(s.iterations) for s in stats)
    verified = sum(sum(s.verified_tokens) for s in stats)
    accepted = sum(sum(s.accepted_tokens) for s in stats)
    width = max(len(s.accepted_at_position) for s in stats)
    accepted_at = [
        sum(s.accepted_at_position[i] for s in stats if i < len(s.accepted_at_position)) for i in range(width)
    ]
    verified_at = [
        sum(s.verified_at_position[i] for s in stats if i < len(s.verified_at_position)) for i in range(width)
    ]
    return {
        "tokens_per_iteration": generated / max(iterations, 1),
        "generated_tokens": generated,
        "row_iterations": iterations,
        "verifier_calls": sum(s.verifier_calls for s in stats),
        "drafter_calls": sum(s.drafter_calls for s in stats),
        "verified_tokens": verified,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / max(verified, 1),
        "accepted_at_position": accepted_at,
        "verified_at_position": verified_at,
        "acceptance_by_position": [a / d if d else None for a, d in zip(accepted_at, verified_at, strict=True)],
    }


def _sequences(outputs: list) -> list[torch.LongTensor]:
    return [output if isinstance(output, torch.Tensor) else output.sequences for output in outputs]


def group_runner(verifier, groups: Sequence[Sequence[Batch]], kwargs: dict) -> Callable[[int], list]:
    """`run(g)`: generate the batches of `groups[g]` with nothing attached, the unit of the interleaved timing.

    Args:
        verifier: The model whose `generate()` runs.
        groups (`Sequence[Sequence[Batch]]`): Per group, the batches one strategy decodes it in (the group's batch
            itself, or its rows one at a time for batch-size-1 strategies).
        kwargs (`dict`): The strategy's `generate()` arguments.
    """

    def run(group: int) -> list:
        with torch.inference_mode():
            return [verifier.generate(**batch.inputs, **kwargs) for batch in groups[group]]

    return run


def count_generated_tokens(
    verifier, batches: Sequence[Batch], kwargs: dict, eos_token_ids: Sequence[int], desc: str, disable_tqdm: bool
) -> int:
    """One untimed pass over `batches` (a warm-up); the tokens it generated, up to and including each row's EOS.

    Args:
        verifier: The model whose `generate()` runs.
        batches (`Sequence[Batch]`): The inputs.
        kwargs (`dict`): The strategy's `generate()` arguments.
        eos_token_ids (`Sequence[int]`): Where each output is cut.
        desc (`str`): The progress bar's label.
        disable_tqdm (`bool`): Hide the progress bar.
    """
    outputs = _generate_all(verifier, batches, kwargs, desc, disable_tqdm)
    return sum(len(ids) for sequences in _sequences(outputs) for ids in _generated_ids(sequences, eos_token_ids))


def run_strategy(
    strategy: Strategy,
    verifier,
    batches: Sequence[Batch],
    kwargs: dict[str, Any],
    device: torch.device,
    eos_token_ids: Sequence[int],
    measure_memory: bool = True,
    disable_tqdm: bool = False,
) -> StrategyRun:
    """Run `strategy` once over `batches`, instrumented: the warm-up, its outputs, statistics and time shares.

    Args:
        strategy (`Strategy`): The strategy.
        verifier: The model whose `generate()` runs.
        batches (`Sequence[Batch]`): Its inputs.
        kwargs (`dict`): Its `generate()` arguments (`strategies.generation_kwargs`); a speculative strategy's
            `drafter` is wrapped in a `TimedDrafter` for this pass, an `assistant_model` gets forward hooks.
        device (`torch.device`): Synchronised around timed calls.
        eos_token_ids (`Sequence[int]`): Where each output is cut.
        measure_memory (`bool`): Also measure the memory peak of one call on the first batch.
        disable_tqdm (`bool`): Hide the progress bar.

    Returns:
        [`StrategyRun`]
    """
    # 1. Instrumented pass: hooks on the verifier (encoder + decoder calls) and on the assistant, a timing drafter.
    timed_drafter = TimedDrafter(kwargs["drafter"], device) if strategy.kind == "speculative" else None
    instrumented_kwargs = kwargs if timed_drafter is None else {**kwargs, "drafter": timed_drafter}
    verifier_timer = ModuleTimer([verifier.get_encoder(), verifier], device)
    assistant_timer = None
    with contextlib.ExitStack() as hooks:
        hooks.enter_context(verifier_timer)
        if strategy.kind == "assisted":
            assistant = kwargs["assistant_model"]
            assistant_timer = hooks.enter_context(ModuleTimer([assistant.get_encoder(), assistant], device))
        instrumented_s, outputs = timed(
            lambda: _generate_all(verifier, batches, instrumented_kwargs, strategy.name, disable_tqdm), device
        )
    per_batch = [_generated_ids(sequences, eos_token_ids) for sequences in _sequences(outputs)]
    sequences = restore_order(batches, per_batch)

    # 2. Memory peak of one call on the first (with length sorting: the longest) batch.
    peak = None
    if measure_memory:
        with torch.inference_mode():
            peak = measure_peak_memory(lambda: verifier.generate(**batches[0].inputs, **kwargs), device)

    drafter_s = None
    if timed_drafter is not None:
        drafter_s = timed_drafter.total_s
    elif assistant_timer is not None:
        drafter_s = assistant_timer.total_s
    recorded = {key: value for key, value in kwargs.items() if isinstance(value, (int, float, str, bool))}
    return StrategyRun(
        strategy=strategy,
        batch_size=max(len(batch.rows) for batch in batches),
        sequences=sequences,
        instrumented_s=instrumented_s,
        verifier_s=verifier_timer.total_s,
        verifier_decoder_calls=verifier_timer.calls[1],
        drafter_s=drafter_s,
        speculative=_sum_speculative_stats(outputs) if strategy.kind == "speculative" else None,
        peak_activation_bytes=peak,
        generation_kwargs=recorded,
    )


def _generated_ids(sequences: torch.LongTensor, eos_token_ids: Sequence[int]) -> list[list[int]]:
    """Each row's generated ids: after the decoder start token, up to and including the first EOS."""
    return trim_at_eos(sequences, eos_token_ids, keep_prompt=False)
