"""Batch-size sweep: latency and throughput of greedy and speculative decoding at several batch sizes.

This is the latency–throughput trade-off of Xia et al. (2023, arXiv 2203.16487, Figure 5): larger batches raise
throughput and latency; speculative decoding should move the curve down and to the right. At each batch size the
strategies are timed interleaved (`interleaved.py`), so that each point's speed-up pairs repeats measured together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from .batching import Batch
from .interleaved import timing_summary
from .strategies import Strategy

__all__ = ["plot_latency_throughput", "run_sweep"]

logger = logging.getLogger(__name__)


def run_sweep(
    strategies: Sequence[Strategy],
    batch_sizes: Sequence[int],
    num_samples: int,
    make_batches: Callable[[int], list[Batch]],
    measure: Callable[[list[Batch]], dict[str, tuple[list[float], int]]],
) -> list[dict]:
    """Measure every (strategy, batch size) pair; at each batch size all strategies together.

    Args:
        strategies (`Sequence[Strategy]`): What to sweep (batch-capable strategies).
        batch_sizes (`Sequence[int]`): Batch sizes; those above `num_samples` are skipped (logged).
        num_samples (`int`): Rows the sweep decodes.
        make_batches (`Callable[[int], list[Batch]]`): The batches of the sweep's rows for a batch size.
        measure (`Callable`): `batches -> {strategy name: (totals of the interleaved repeats, generated tokens per
            pass)}`, every strategy timed on `batches` in the same repeats.

    Returns:
        `list[dict]`: one point per pair with `strategy`, `batch_size`, `num_batches`, `num_samples`, the
        `timing_summary` figures (`time_s` the median total, its range, `speedup` the median paired ratio over
        greedy at the same batch size with its range and per-repeat `speedups`; `None` when greedy was not swept),
        `latency_s` (median time per batch: how long a request waits for its batch), `sentences_per_s`,
        `tokens_per_s` and `generated_tokens`.
    """
    sizes = [size for size in dict.fromkeys(batch_sizes) if size <= num_samples]
    skipped = [size for size in batch_sizes if size > num_samples]
    if skipped:
        logger.warning("sweep: skipping batch sizes %s, above the %d rows evaluated", skipped, num_samples)
    greedy = next((strategy.name for strategy in strategies if strategy.kind == "greedy"), None)
    points = []
    for size in sizes:
        batches = make_batches(size)
        measured = measure(batches)
        reference = measured[greedy][0] if greedy is not None else None
        for strategy in strategies:
            times_s, tokens = measured[strategy.name]
            timing = timing_summary(times_s, reference)
            time_s = timing["time_s"]
            points.append(
                {
                    "strategy": strategy.name,
                    "batch_size": size,
                    "num_batches": len(batches),
                    "num_samples": num_samples,
                    **timing,
                    "latency_s": time_s / len(batches),
                    "sentences_per_s": num_samples / time_s,
                    "tokens_per_s": tokens / time_s,
                    "generated_tokens": tokens,
                }
            )
    return points


def plot_latency_throughput(points: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Save the latency–throughput curve (one line per strategy, points labelled with the batch size) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.8))
    for name in dict.fromkeys(point["strategy"] for point in points):
        mine = sorted((p for p in points if p["strategy"] == name), key=lambda p: p["batch_size"])
        throughput = [p["tokens_per_s"] for p in mine]
        latency = [p["latency_s"] * 1000 for p in mine]
        axes.plot(throughput, latency, marker="o", label=name)
        for p, x, y in zip(mine, throughput, latency, strict=True):
            axes.annotate(f"{p['batch_size']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xlabel("throughput (generated tokens / s)")
    axes.set_ylabel("latency per batch (ms)")
    axes.set_title(title or "latency vs throughput (labels: batch size)")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
