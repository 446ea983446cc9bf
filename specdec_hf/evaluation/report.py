"""Reporting: the environment record, the Markdown tables, and the JSON / JSONL files of an evaluation run."""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import transformers

from ..files import write_json_atomic
from .interleaved import format_spread
from .machine import cpu_model

__all__ = [
    "PLOT_FILE",
    "RESULTS_FILE",
    "TABLE_FILE",
    "environment_info",
    "markdown_tables",
    "write_generations",
    "write_report",
]

RESULTS_FILE = "results.json"
TABLE_FILE = "results.md"
PLOT_FILE = "latency_throughput.png"
_MIB = 1024 * 1024


def environment_info(device: torch.device, dtype: str) -> dict[str, Any]:
    """Versions, hardware and date: what a reader needs to compare timings across runs."""
    from .. import __version__

    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = cpu_model()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sacrebleu": sacrebleu.__version__,
        "specdec_hf": __version__,
        "device": str(device),
        "device_name": device_name,
        "cuda": torch.version.cuda,
        "num_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "dtype": dtype,
    }


def _number(value: float | None, digits: int = 2, scale: float = 1.0) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / _MIB:.1f}"


def markdown_tables(results: dict[str, dict], metrics: Sequence[str]) -> str:
    """The console/`results.md` tables: quality and speed, then time shares, acceptance and memory.

    Args:
        results (`dict[str, dict]`): The `strategies` section of the JSON (strategy name → figures).
        metrics (`Sequence[str]`): Which of `bleu`, `chrf`, `rouge` to show.
    """
    quality_columns: list[tuple[str, str, float]] = []
    if "bleu" in metrics:
        quality_columns.append(("BLEU", "bleu", 1.0))
    if "chrf" in metrics:
        quality_columns.append(("chrF", "chrf", 1.0))
    if "rouge" in metrics:
        quality_columns += [("R-1", "rouge1", 100.0), ("R-2", "rouge2", 100.0), ("R-L", "rougeL", 100.0)]
    header = (
        ["strategy", "batch"]
        + [name for name, _, _ in quality_columns]
        + ["= greedy", "Tok.", "time (s)", "tok/s", "sent/s", "speed-up"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, result in results.items():
        speed = result["speed"]
        cells = [name, str(result["batch_size"])]
        cells += [_number(result["quality"][key], 2, scale) for _, key, scale in quality_columns]
        cells += [
            _number(result["identical_to_greedy"], 3),
            _number(result["tokens_per_iteration"], 2),
            format_spread(speed["time_s"], speed["time_s_min"], speed["time_s_max"], 3),
            _number(speed["tokens_per_s"], 1),
            _number(speed["sentences_per_s"], 2),
            format_spread(speed["speedup"], speed["speedup_min"], speed["speedup_max"], 2, "×"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if "rouge" in metrics:
        lines.append("\nROUGE: mean F1 × 100 (rouge-score, stemmed).")
    lines.append(
        "Time: median over repeats of the total over all rows (min–max in brackets); tok/s and sent/s from the "
        "median. Speed-up: median over repeats of greedy's total / the strategy's total in the same repeat, greedy at "
        "the same batch size; every strategy timed interleaved with the others, batch by batch, in a rotating order."
    )

    header = [
        "strategy",
        "verifier share",
        "drafter share",
        "acceptance by position",
        "peak act. (MiB)",
        "extra (MiB)",
    ]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, result in results.items():
        share = result["time_share"]
        by_position = (result.get("speculative") or {}).get("acceptance_by_position")
        acceptance = (
            " ".join("–" if a is None else f"{a:.2f}" for a in by_position[:10])
            + (" …" if len(by_position) > 10 else "")
            if by_position
            else "–"
        )
        memory = result["memory"]
        cells = [
            name,
            _number(share["verifier"], 2),
            _number(share["drafter"], 2),
            acceptance,
            _mib(memory["peak_activation_bytes"]),
            _mib(memory["extra_total_bytes"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        "Shares: fraction of the instrumented pass's wall time inside the verifier's forward passes and inside the "
        "drafter (`propose`, `init_drafting_state`) or the AR assistant. Extra memory: drafter/assistant parameters "
        "plus the activation peak above greedy's at the same batch size."
    )
    return "\n".join(lines)


def write_generations(rows: Sequence[dict], path: str | Path) -> Path:
    """Write one JSON object per line (`id`, `source`, `reference`, `hypothesis`, ...)."""
    path = Path(path)
    with path.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_report(data: dict[str, Any], args, output_dir: Path) -> None:
    """Write `results.json` and `results.md` of an evaluation run (`data`, as `run_evaluation` returns it, and its
    `EvaluationArguments`); print the tables."""
    environment = data["environment"]
    header = (
        f"# {args.verifier_name_or_path} on {data['data']['description']}: {data['data']['num_samples']} rows, "
        f"batch size {args.batch_size}, max_new_tokens {args.max_new_tokens}, {environment['device']} "
        f"({environment['device_name']}, {environment['num_threads']} threads, {environment['dtype']}"
        f"{', linear layers on the packed kernels measured faster' if args.prepack_linear else ''}); "
        f"timing: {data['timing']['scheme']}\n"
    )
    footer = ""
    reference = data["reference_timings"].get("greedy_batch_size_1")
    if reference is not None:
        seconds = format_spread(reference["time_s"], reference["time_s_min"], reference["time_s_max"], 3)
        footer += f"\nBatch-size-1 strategies are compared with greedy at batch size 1: {seconds} s."
    if environment["shared_machine_warning"] is not None:
        footer += f"\nWarning: {environment['shared_machine_warning']}"
    quality = data["strategies"]["greedy"]["quality"]
    footer += f"\nsacrebleu: BLEU {quality['bleu_signature']} ; chrF {quality['chrf_signature']}"
    if args.measure_memory:
        footer += f"\nMemory: {data['memory']['method']}."
    text = header + "\n" + markdown_tables(data["strategies"], args.metrics) + "\n" + footer + "\n"
    (output_dir / TABLE_FILE).write_text(text)
    write_json_atomic(output_dir / RESULTS_FILE, data)
    print(text)
    print(f"Results: {output_dir / RESULTS_FILE}, {output_dir / TABLE_FILE}, {output_dir / 'generations'}/")
    if data["sweep"] is not None:
        print(f"Latency-throughput plot: {output_dir / PLOT_FILE}")
