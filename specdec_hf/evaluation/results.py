"""The results schema of an evaluation run: what `results.json` holds, section by section.

`run_evaluation` (`runner.py`) measures; the functions here turn its measurements into the JSON sections (every
figure with the setting it was measured under), and `report.py` writes them out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..data.loading import DataArguments
from ..generation import as_drafter
from ..linear_kernel_selection import kernel_choices_to_json
from .arguments import EvaluationArguments
from .execution import StrategyRun
from .interleaved import spread, timing_summary
from .loading import EvaluationModels, drafter_module
from .memory import memory_method, parameter_bytes
from .report import PLOT_FILE

__all__ = [
    "TIMING_SCHEME",
    "config_section",
    "memory_section",
    "models_section",
    "reference_timing",
    "strategy_result",
    "sweep_section",
    "timing_section",
]

TIMING_SCHEME = "interleaved, rotating order, median of {repeats} repeats, range in brackets"


def drafter_parameter_bytes(drafter) -> int:
    """Bytes of the weights a drafter runs (0 for one without weights, such as the source-copy drafter alone)."""
    module = drafter_module(drafter)
    return 0 if module is None else parameter_bytes(module)


def strategy_result(
    run: StrategyRun,
    quality: dict,
    identical: float,
    times_s: list[float],
    reference_times_s: list[float],
    reference_name: str,
    reference_peak: int | None,
    models: EvaluationModels,
    drafter_paths: list[str],
    repeats: int,
    num_samples: int,
) -> dict[str, Any]:
    """One strategy's entry of `strategies`: its settings, `quality`, `identical_to_greedy`, `tokens_per_iteration`,
    `speed` (against `reference_name`'s times of the same repeats), `time_share`, `speculative` and `memory`."""
    strategy = run.strategy
    timing = timing_summary(times_s, reference_times_s)
    time_s = timing["time_s"]
    extra_parameters = 0
    settings: dict[str, Any] = {}
    if strategy.kind == "speculative":
        drafter = models.drafters[strategy.drafter_index]
        extra_parameters = drafter_parameter_bytes(drafter)
        settings = {
            "drafter": drafter_paths[strategy.drafter_index],
            "num_draft_tokens": strategy.num_draft_tokens,
            "beta": strategy.beta,
            "tau": strategy.tau,
            "draft_confidence_threshold": strategy.confidence_threshold,
        }
    elif strategy.kind == "assisted":
        extra_parameters = parameter_bytes(models.assistant)
    extra_activation = None
    if run.peak_activation_bytes is not None and reference_peak is not None:
        # over greedy at the same batch size; greedy itself is the reference
        extra_activation = max(0, run.peak_activation_bytes - reference_peak) if strategy.kind != "greedy" else 0
    share_base = run.instrumented_s
    verifier_share = run.verifier_s / share_base if share_base > 0 else None
    drafter_share = run.drafter_s / share_base if run.drafter_s is not None and share_base > 0 else None
    other_share = None
    if verifier_share is not None:
        other_share = max(0.0, 1.0 - verifier_share - (drafter_share or 0.0))
    return {
        "kind": strategy.kind,
        "settings": settings,
        "batch_size": run.batch_size,
        "generation_kwargs": run.generation_kwargs,
        "quality": quality,
        "identical_to_greedy": identical,
        "tokens_per_iteration": run.tokens_per_iteration,
        "speed": {
            **timing,
            "repeats": repeats,
            "generated_tokens": run.generated_tokens,
            "tokens_per_s": run.generated_tokens / time_s,
            "sentences_per_s": num_samples / time_s,
            "speedup_reference": reference_name,
        },
        "time_share": {
            "instrumented_pass_s": run.instrumented_s,
            "verifier_s": run.verifier_s,
            "drafter_s": run.drafter_s,
            "verifier": verifier_share,
            "drafter": drafter_share,
            "other": other_share,
            "verifier_decoder_calls": run.verifier_decoder_calls,
        },
        "speculative": run.speculative,
        "memory": {
            "peak_activation_bytes": run.peak_activation_bytes,
            "extra_parameter_bytes": extra_parameters,
            "extra_activation_bytes": extra_activation,
            "extra_total_bytes": extra_parameters + (extra_activation or 0),
        },
    }


def reference_timing(run: StrategyRun, times_s: list[float]) -> dict[str, Any]:
    """An entry of `reference_timings`: a greedy run's batch size, median total and range, and peak memory."""
    time_s, time_min, time_max = spread(times_s)
    return {
        "batch_size": run.batch_size,
        "time_s": time_s,
        "time_s_min": time_min,
        "time_s_max": time_max,
        "times_s": times_s,
        "peak_activation_bytes": run.peak_activation_bytes,
    }


def config_section(args: EvaluationArguments, data_args: DataArguments) -> dict[str, Any]:
    """`config`: every argument of the run, as given."""
    return {"evaluation": dataclasses.asdict(args), "data": dataclasses.asdict(data_args)}


def models_section(args: EvaluationArguments, models: EvaluationModels) -> dict[str, Any]:
    """`models`: the verifier, tokenizer, drafters (with their k and size) and assistant evaluated."""
    return {
        "verifier": args.verifier_name_or_path,
        "verifier_model_type": models.verifier.config.model_type,
        "tokenizer": args.tokenizer_name_or_path or args.verifier_name_or_path,
        "drafters": [
            {
                "path": path,
                "num_draft_tokens": as_drafter(drafter).num_draft_tokens,
                "max_draft_tokens": getattr(as_drafter(drafter), "max_draft_tokens", None),
                "parameter_bytes": drafter_parameter_bytes(drafter),
            }
            for path, drafter in zip(args.drafters, models.drafters, strict=True)
        ],
        "assistant_model": args.assistant_model if models.assistant is not None else None,
        # with `prepack_linear`: per model, each linear layer signature's kernel as measured on this machine
        "linear_kernels": kernel_choices_to_json(models.kernel_choices),
    }


def timing_section(args: EvaluationArguments, num_groups: int) -> dict[str, Any]:
    """`timing`: how the timed passes were run and how a speed-up is computed."""
    return {
        "scheme": TIMING_SCHEME.format(repeats=args.repeats),
        "repeats": args.repeats,
        "groups": num_groups,
        "group": f"a batch of batch size {args.batch_size} (batch-size-1 strategies decode its rows one by one)",
        "speedup": "median over repeats of reference total / strategy total of the same repeat",
    }


def memory_section(device: torch.device, models: EvaluationModels, greedy_run: StrategyRun) -> dict[str, Any]:
    """`memory`: how memory was measured, and the verifier's, drafters' and assistant's parameters."""
    return {
        "method": memory_method(device),
        "measured_on": "one generate() call on the first batch (the longest sources when sort_by_length)",
        "verifier_parameter_bytes": parameter_bytes(models.verifier),
        "verifier_activation_peak_bytes": greedy_run.peak_activation_bytes,
        "drafter_parameter_bytes": [drafter_parameter_bytes(drafter) for drafter in models.drafters],
        "assistant_parameter_bytes": parameter_bytes(models.assistant) if models.assistant is not None else None,
    }


def sweep_section(args: EvaluationArguments, strategy_names: list[str], num_samples: int, points: list[dict]):
    """`sweep`: the latency-throughput points of the batch-size sweep and how they were timed."""
    return {
        "batch_sizes": args.sweep_batch_sizes,
        "strategies": strategy_names,
        "num_samples": num_samples,
        "timing": TIMING_SCHEME.format(repeats=args.repeats) + ", per batch size",
        "latency": "median total of a repeat over the rows divided by its number of batches (s per batch)",
        "points": points,
        "plot": PLOT_FILE,
    }
