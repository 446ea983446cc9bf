"""Running one strategy over the batches: an instrumented pass (outputs, statistics, time shares), timed passes.

The first pass over the data is the warm-up and the instrumented one: forward hooks on the verifier (and on the AR
assistant), a timing wrapper around the drafter, and every output kept. Then `repeats` passes with nothing attached
are timed (synchronised on CUDA); the median is reported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from .batching import Batch, restore_order, trim_generated
from .memory import measure_peak_memory
from .strategies import Strategy, generation_kwargs
from .timing import ModuleTimer, TimedDrafter, median, timed

__all__ = ["StrategyRun", "run_strategy", "time_passes", "warm_up_and_time"]


@dataclass
class StrategyRun:
    """What running one strategy measured.

    Args:
        strategy (`Strategy`): The strategy.
        batch_size (`int`): Rows per `generate()` call.
        sequences (`list[list[int]]`): Generated ids per dataset row (data order, up to and including EOS).
        times_s (`list[float]`): Wall time of each timed pass over all batches.
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
    times_s: list[float]
    instrumented_s: float
    verifier_s: float
    verifier_decoder_calls: int
    drafter_s: float | None = None
    speculative: dict[str, Any] | None = None
    peak_activation_bytes: int | None = None
    generation_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        """Median wall time of the timed passes."""
        return median(self.times_s)

    @property
    def generated_tokens(self) -> int:
        return sum(len(ids) for ids in self.sequences)

    @property
    def tokens_per_iteration(self) -> float | None:
        """Tok.: tokens per verifier pass. Greedy 1 by definition; beam search: not defined (None)."""
        kind = self.strategy.kind
        if kind == "greedy":
            return 1.0
        if kind == "speculative":
            return self.speculative["tokens_per_iteration"]
        if kind == "beam":
            return None
        # assisted / prompt lookup run one row per call: tokens per verifier decoder pass
        return self.generated_tokens / max(self.verifier_decoder_calls, 1)


def _generate_all(verifier, batches: Sequence[Batch], kwargs: dict, desc: str, disable_tqdm: bool) -> list:
    with torch.inference_mode():
        return [
            verifier.generate(**batch.inputs, **kwargs)
            for batch in tqdm(batches, desc=desc, leave=False, disable=disable_tqdm)
        ]


def _sum_speculative_stats(outputs: list) -> dict[str, Any]:
    stats = [output.speculative_stats for output in outputs]
    generated = sum(sum(s.generated_tokens) for s in stats)
    iterations = sum(sum(s.iterations) for s in stats)
    drafted = sum(sum(s.drafted_tokens) for s in stats)
    accepted = sum(sum(s.accepted_tokens) for s in stats)
    width = max(len(s.accepted_at_position) for s in stats)
    accepted_at = [
        sum(s.accepted_at_position[i] for s in stats if i < len(s.accepted_at_position)) for i in range(width)
    ]
    drafted_at = [sum(s.drafted_at_position[i] for s in stats if i < len(s.drafted_at_position)) for i in range(width)]
    return {
        "tokens_per_iteration": generated / max(iterations, 1),
        "generated_tokens": generated,
        "row_iterations": iterations,
        "verifier_calls": sum(s.verifier_calls for s in stats),
        "drafter_calls": sum(s.drafter_calls for s in stats),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / max(drafted, 1),
        "accepted_at_position": accepted_at,
        "drafted_at_position": drafted_at,
        "acceptance_by_position": [a / d if d else None for a, d in zip(accepted_at, drafted_at, strict=True)],
    }


def _sequences(outputs: list) -> list[torch.LongTensor]:
    return [output if isinstance(output, torch.Tensor) else output.sequences for output in outputs]


def time_passes(
    verifier, batches: Sequence[Batch], kwargs: dict, repeats: int, device: torch.device, desc: str, disable_tqdm: bool
) -> list[float]:
    """Wall time of `repeats` full passes over `batches` (nothing attached; synchronised on CUDA)."""
    times = []
    for i in range(repeats):
        label = f"{desc} {i + 1}/{repeats}"
        times.append(
            timed(lambda label=label: _generate_all(verifier, batches, kwargs, label, disable_tqdm), device)[0]
        )
    return times


def warm_up_and_time(
    verifier,
    batches: Sequence[Batch],
    kwargs: dict,
    repeats: int,
    device: torch.device,
    eos_token_ids: Sequence[int],
    desc: str,
    disable_tqdm: bool,
) -> tuple[list[float], int]:
    """One untimed pass (warm-up; counts the generated tokens), then `repeats` timed passes.

    Returns:
        `(times_s, generated_tokens)`: the wall time of each timed pass and the tokens one pass generates.
    """
    outputs = _generate_all(verifier, batches, kwargs, f"{desc} warm-up", disable_tqdm)
    tokens = sum(len(ids) for sequences in _sequences(outputs) for ids in trim_generated(sequences, eos_token_ids))
    return time_passes(verifier, batches, kwargs, repeats, device, desc, disable_tqdm), tokens


def run_strategy(
    strategy: Strategy,
    verifier,
    batches: Sequence[Batch],
    device: torch.device,
    eos_token_ids: Sequence[int],
    repeats: int,
    max_new_tokens: int,
    num_beams: int = 5,
    drafter=None,
    assistant=None,
    prompt_lookup_num_tokens: int = 10,
    max_matching_ngram_size: int = 2,
    measure_memory: bool = True,
    disable_tqdm: bool = False,
) -> StrategyRun:
    """Run `strategy` over `batches`: one instrumented pass (warm-up, outputs, time shares), `repeats` timed passes.

    Returns:
        [`StrategyRun`]
    """

    def kwargs_with(drafter_for_call) -> dict:
        return generation_kwargs(
            strategy,
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            drafter=drafter_for_call,
            assistant_model=assistant,
            prompt_lookup_num_tokens=prompt_lookup_num_tokens,
            max_matching_ngram_size=max_matching_ngram_size,
        )

    # 1. Instrumented pass: hooks on the verifier (encoder + decoder calls) and on the assistant, a timing drafter.
    timed_drafter = TimedDrafter(drafter, device) if strategy.kind == "speculative" else None
    verifier_timer = ModuleTimer([verifier.get_encoder(), verifier], device)
    assistant_timer = None
    with contextlib.ExitStack() as hooks:
        hooks.enter_context(verifier_timer)
        if strategy.kind == "assisted":
            assistant_timer = hooks.enter_context(ModuleTimer([assistant.get_encoder(), assistant], device))
        instrumented_s, outputs = timed(
            lambda: _generate_all(verifier, batches, kwargs_with(timed_drafter), strategy.name, disable_tqdm), device
        )
    per_batch = [trim_generated(sequences, eos_token_ids) for sequences in _sequences(outputs)]
    sequences = restore_order(batches, per_batch)

    # 2. Timed passes, nothing attached.
    plain_kwargs = kwargs_with(drafter)
    times_s = time_passes(verifier, batches, plain_kwargs, repeats, device, f"{strategy.name} timed", disable_tqdm)

    # 3. Memory peak of one call on the first (with length sorting: the longest) batch.
    peak = None
    if measure_memory:
        with torch.inference_mode():
            peak = measure_peak_memory(lambda: verifier.generate(**batches[0].inputs, **plain_kwargs), device)

    drafter_s = None
    if timed_drafter is not None:
        drafter_s = timed_drafter.total_s
    elif assistant_timer is not None:
        drafter_s = assistant_timer.total_s
    recorded = {key: value for key, value in plain_kwargs.items() if isinstance(value, (int, float, str, bool))}
    return StrategyRun(
        strategy=strategy,
        batch_size=max(len(batch.rows) for batch in batches),
        sequences=sequences,
        times_s=times_s,
        instrumented_s=instrumented_s,
        verifier_s=verifier_timer.total_s,
        verifier_decoder_calls=verifier_timer.calls[1],
        drafter_s=drafter_s,
        speculative=_sum_speculative_stats(outputs) if strategy.kind == "speculative" else None,
        peak_activation_bytes=peak,
        generation_kwargs=recorded,
    )
