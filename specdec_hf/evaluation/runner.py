"""`evaluate.py`'s work: quality and speed of Speculative Decoding next to greedy, beam and transformers' drafting.

Speculative Decoding (Xia et al., 2023, arXiv 2203.16487) is measured the way the paper reports it: BLEU / ROUGE
against the references, the fraction of outputs identical to greedy decoding, tokens per verifier pass (Tok.) and
wall-clock speed-up over greedy decoding in the same process, plus the latency–throughput curve over batch sizes
(Figure 5) and the drafter's memory next to the verifier's.

Order of work: every check that can fail (arguments, output directory, data, model compatibility) runs before the
first `generate()` call. Then each strategy runs once instrumented (its warm-up, outputs and statistics), and its
timed passes are interleaved with every other strategy's (`interleaved.py`): per repeat, all strategies decode each
batch back to back in a rotating order, and a speed-up is the median over repeats of the paired ratio of totals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import set_seed

from ..data.loading import DataArguments, load_text_pairs, sample_indices
from ..data.tokenization import default_source_prefix, source_length_limit
from .arguments import EvaluationArguments
from .batching import (
    Batch,
    encode_sources,
    eos_token_ids,
    make_batches,
    single_row_groups,
)
from .ctranslate2_peer import ct2_group_measure, run_ct2_strategy, start_ct2_workers
from .execution import StrategyRun, count_generated_tokens, group_runner, run_strategy
from .interleaved import interleave, time_interleaved
from .loading import EvaluationModels, load_models, resolve_device
from .machine import check_machine_load
from .metrics import corpus_quality, fraction_identical
from .preflight import check_models, check_output_dir, check_pairs
from .report import PLOT_FILE, environment_info, write_generations, write_report
from .results import (
    TIMING_SCHEME,
    config_section,
    memory_section,
    models_section,
    reference_timing,
    strategy_result,
    sweep_section,
    timing_section,
)
from .strategies import Strategy, generation_kwargs
from .sweep import plot_latency_throughput, run_sweep
from .timing import timed

__all__ = ["run_evaluation"]

logger = logging.getLogger(__name__)


def _describe_data(data_args: DataArguments, split: str) -> str:
    if data_args.data_files is not None:
        files = data_args.data_files
        paths = files.get(split, []) if isinstance(files, dict) else files
        origin = ", ".join(str(path) for path in paths)
    else:
        origin = data_args.dataset_name or data_args.data_dir
    return f"{origin} [{split}]"


def _max_source_length(args: EvaluationArguments, tokenizer, verifier) -> int:
    if args.max_source_length is not None:
        return args.max_source_length
    return source_length_limit(tokenizer, verifier)


def _source_prefix(args: EvaluationArguments, data_args: DataArguments, verifier) -> str | None:
    if args.source_prefix is not None:
        return args.source_prefix
    languages = data_args.languages or (None, None)
    return default_source_prefix(verifier.config.model_type, data_args.task, *languages)


@dataclasses.dataclass
class _Inputs:
    """The evaluated rows, tokenised once, and their batches per batch size (built on first use)."""

    encoded: list[list[int]]
    pad_token_id: int
    device: torch.device
    sort_by_length: bool
    _batches: dict[int, list[Batch]] = dataclasses.field(default_factory=dict)

    def batches(self, size: int) -> list[Batch]:
        if size not in self._batches:
            self._batches[size] = make_batches(self.encoded, size, self.pad_token_id, self.device, self.sort_by_length)
        return self._batches[size]

    def first(self, num_rows: int | None) -> _Inputs:
        """The first `num_rows` rows (data order), with their own batches."""
        return _Inputs(self.encoded[:num_rows], self.pad_token_id, self.device, self.sort_by_length)


def run_evaluation(args: EvaluationArguments, data_args: DataArguments) -> dict[str, Any]:
    """Evaluate every strategy of `args` on the data of `data_args`; write and return the results.

    Returns:
        `dict`: what `results.json` holds: `environment` (with the load average at the start, and a warning when
        the machine was shared), `config`, `models`, `data`, `timing`, `strategies` (per strategy: `quality`,
        `identical_to_greedy`, `tokens_per_iteration`, `speed`, `time_share`, `speculative`, `memory`,
        `generations_file`), `reference_timings`, `memory` and `sweep`. With `args.check_only`: only `checked`
        (True), `num_samples` and `strategies`, once every check has passed, and nothing written.
    """
    with contextlib.ExitStack() as peers:  # CTranslate2 worker processes, stopped however the run ends
        return _evaluate(args, data_args, peers)


def _evaluate(args: EvaluationArguments, data_args: DataArguments, peers: contextlib.ExitStack) -> dict[str, Any]:
    # 1. Checks that need no model: strategies (parsed with the arguments), output directory, data; the machine.
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    set_seed(args.seed)
    device = resolve_device(args.device)
    strategies = args.resolved_strategies
    ct2_strategies = [s for s in strategies if s.kind == "ctranslate2"]
    torch_threads = torch.get_num_threads()  # `num_threads` where given (set above)
    ct2_threads = args.ct2_threads or torch_threads
    # the runs take turns, so the busiest of them sets how many idle cores the timings need
    machine_load = check_machine_load(max(torch_threads, ct2_threads if ct2_strategies else 0))
    output_dir = check_output_dir(args.output_dir)
    split = data_args.test_split
    pairs = load_text_pairs(data_args, split)
    description = _describe_data(data_args, split)
    if args.limit_seed is not None and len(pairs) > args.limit:
        pairs = pairs.select(sample_indices(len(pairs), args.limit, args.limit_seed))
        description += f", {len(pairs)} rows drawn at random (seed {args.limit_seed})"
    check_pairs(pairs, description)

    # 2. Models and their compatibility.
    models = load_models(args, device)
    verifier, tokenizer = models.verifier, models.tokenizer
    check_models(
        verifier, tokenizer, models.drafters, args.drafters, models.assistant, strategies, args.max_new_tokens
    )
    if args.check_only:
        logger.info(
            "checks passed (%d rows, %d strategies): --check_only stops before decoding", len(pairs), len(strategies)
        )
        return {"checked": True, "num_samples": pairs.num_rows, "strategies": [s.name for s in strategies]}
    if ct2_strategies:
        models.ct2_workers = start_ct2_workers(
            ct2_strategies, verifier, tokenizer, args.verifier_name_or_path, output_dir, ct2_threads, peers
        )

    # 3. Inputs, tokenised once.
    source_prefix = _source_prefix(args, data_args, verifier)
    max_source_length = _max_source_length(args, tokenizer, verifier)
    pad = verifier.config.pad_token_id if verifier.config.pad_token_id is not None else tokenizer.pad_token_id
    inputs = _Inputs(
        encode_sources(tokenizer, pairs["source"], source_prefix, max_source_length), pad, device, args.sort_by_length
    )
    eos_ids = eos_token_ids(verifier)

    # 4. Every strategy on the same inputs, instrumented (also its warm-up); greedy first (the reference).
    logger.info("evaluating %s on %d rows of %s", [s.name for s in strategies], pairs.num_rows, description)
    runs = {s.name: _run(s, args, models, inputs, eos_ids, device, args.measure_memory) for s in strategies}
    reference_runs = {"greedy": runs["greedy"]}
    if args.batch_size != 1 and any(s.batch_one_only for s in strategies):
        logger.info("greedy at batch size 1: the reference of the batch-size-1 strategies")
        greedy = Strategy("greedy", "greedy")
        reference_runs["greedy_batch_size_1"] = _run(
            greedy, args, models, inputs, eos_ids, device, args.measure_memory, size=1
        )

    # 5. Timed passes: every strategy interleaved with the others on each batch.
    times = _time_interleaved(args, models, inputs, {**runs, **reference_runs}, device)

    # 6. Quality, agreement with greedy, speed-up; the generated texts.
    results = {}
    for name, run in runs.items():
        results[name], hypotheses = _score(run, runs["greedy"], reference_runs, times, pairs, models, args)
        path = output_dir / "generations" / f"{name}.jsonl"
        write_generations(
            [
                {"id": row_id, "source": source, "reference": target, "hypothesis": hypothesis, "num_tokens": len(ids)}
                for row_id, source, target, hypothesis, ids in zip(
                    pairs["id"], pairs["source"], pairs["target"], hypotheses, run.sequences, strict=True
                )
            ],
            path,
        )
        results[name]["generations_file"] = str(path.relative_to(output_dir))

    # 7. Batch-size sweep: the latency-throughput curve.
    sweep = (
        _sweep(args, models, inputs.first(args.sweep_max_samples), eos_ids, device, output_dir) if args.sweep else None
    )

    # 8. Everything into results.json (the sections of `results.py`), results.md and the console.
    data = {
        "environment": {**environment_info(device, args.dtype), **machine_load},
        "config": config_section(args, data_args),
        "models": models_section(args, models),
        "data": {
            "description": description,
            "split": split,
            "num_samples": pairs.num_rows,
            "task": data_args.task,
            "source_prefix": source_prefix,
            "max_source_length": max_source_length,
        },
        "timing": timing_section(args, len(inputs.batches(args.batch_size))),
        "strategies": results,
        "reference_timings": {name: reference_timing(run, times[name]) for name, run in reference_runs.items()},
        "memory": memory_section(device, models, runs["greedy"]),
        "sweep": sweep,
    }
    write_report(data, args, output_dir)
    return data


def _run(
    strategy: Strategy,
    args: EvaluationArguments,
    models: EvaluationModels,
    inputs: _Inputs,
    eos_ids: list[int],
    device: torch.device,
    measure_memory: bool,
    size: int | None = None,
) -> StrategyRun:
    logger.info("strategy %s", strategy.name)
    size = size or (1 if strategy.batch_one_only else args.batch_size)
    if strategy.kind == "ctranslate2":
        worker = models.ct2_workers[strategy.name]
        return run_ct2_strategy(strategy, worker, models.tokenizer, inputs.batches(size), args.max_new_tokens)
    return run_strategy(
        strategy,
        models.verifier,
        inputs.batches(size),
        _generation_kwargs(strategy, args, models),
        device=device,
        eos_token_ids=eos_ids,
        measure_memory=measure_memory,
        disable_tqdm=args.disable_tqdm,
    )


def _generation_kwargs(strategy: Strategy, args: EvaluationArguments, models: EvaluationModels) -> dict[str, Any]:
    return generation_kwargs(
        strategy,
        max_new_tokens=args.max_new_tokens,
        num_beams=args.num_beams,
        drafter=models.drafters[strategy.drafter_index] if strategy.kind == "speculative" else None,
        assistant_model=models.assistant,
        prompt_lookup_num_tokens=args.prompt_lookup_num_tokens,
        max_matching_ngram_size=args.max_matching_ngram_size,
    )


def _time_interleaved(
    args: EvaluationArguments,
    models: EvaluationModels,
    inputs: _Inputs,
    runs: dict[str, StrategyRun],
    device: torch.device,
) -> dict[str, list[float]]:
    """The timed passes of every run, interleaved on the batches of the main batch size: per run, one total a repeat.

    A run at batch size 1 (assisted, prompt lookup, greedy as their reference) decodes each group's rows one at a
    time, so that every strategy is timed on the same rows at the same moments.
    """
    groups = inputs.batches(args.batch_size)
    row_groups = single_row_groups(groups, inputs.batches(1))
    measures = {}
    for name, run in runs.items():
        run_groups = row_groups if run.batch_size == 1 else [[group] for group in groups]
        if run.strategy.kind == "ctranslate2":  # the worker's own seconds: the pipe to its process left out
            worker = models.ct2_workers[name]
            measures[name] = ct2_group_measure(worker, models.tokenizer, run_groups, args.max_new_tokens)
        else:
            runner = group_runner(models.verifier, run_groups, _generation_kwargs(run.strategy, args, models))
            measures[name] = functools.partial(_wall_time, runner, device)
    logger.info("timed passes: %s", TIMING_SCHEME.format(repeats=args.repeats))
    return interleave(measures, len(groups), args.repeats, "timed passes", args.disable_tqdm)


def _wall_time(run, device: torch.device, group: int) -> float:
    return timed(lambda: run(group), device)[0]


def _score(
    run: StrategyRun,
    greedy_run: StrategyRun,
    reference_runs: dict[str, StrategyRun],
    times: dict[str, list[float]],
    pairs,
    models: EvaluationModels,
    args: EvaluationArguments,
) -> tuple[dict[str, Any], list[str]]:
    """The figures of one strategy, and its decoded outputs."""
    hypotheses = models.tokenizer.batch_decode(run.sequences, skip_special_tokens=True)
    reference_name = "greedy"
    if run.strategy.batch_one_only and "greedy_batch_size_1" in reference_runs:
        reference_name = "greedy_batch_size_1"
    result = strategy_result(
        run,
        corpus_quality(hypotheses, pairs["target"], bleu_tokenize=args.bleu_tokenize),
        fraction_identical(run.sequences, greedy_run.sequences),
        times[run.strategy.name],
        times[reference_name],
        reference_name,
        reference_runs[reference_name].peak_activation_bytes,
        models,
        args.drafters,
        args.repeats,
        pairs.num_rows,
    )
    return result, hypotheses


def _sweep(
    args: EvaluationArguments,
    models: EvaluationModels,
    inputs: _Inputs,
    eos_ids: list[int],
    device: torch.device,
    output_dir: Path,
) -> dict[str, Any]:
    """Latency and throughput of the sweep's strategies at each batch size; the points and the plot.

    At each batch size every strategy makes one untimed pass (its warm-up, which counts its tokens), then all are
    timed interleaved on the batches of that size, as in the main comparison.
    """
    strategies = args.resolved_sweep_strategies

    def measure(batches: list[Batch]) -> dict[str, tuple[list[float], int]]:
        size = len(batches[0].rows)
        kwargs = {strategy.name: _generation_kwargs(strategy, args, models) for strategy in strategies}
        tokens = {
            name: count_generated_tokens(
                models.verifier, batches, kw, eos_ids, f"sweep {name} batch size {size} warm-up", args.disable_tqdm
            )
            for name, kw in kwargs.items()
        }
        runners = {name: group_runner(models.verifier, [[b] for b in batches], kw) for name, kw in kwargs.items()}
        desc = f"sweep batch size {size}"
        times = time_interleaved(runners, len(batches), args.repeats, device, desc, args.disable_tqdm)
        return {name: (times[name], tokens[name]) for name in kwargs}

    points = run_sweep(strategies, args.sweep_batch_sizes, len(inputs.encoded), inputs.batches, measure)
    title = f"{Path(args.verifier_name_or_path).name}: latency vs throughput (labels: batch size)"
    plot_latency_throughput(points, output_dir / PLOT_FILE, title=title)
    return sweep_section(args, [strategy.name for strategy in strategies], len(inputs.encoded), points)
