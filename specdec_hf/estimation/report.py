"""The estimator's outputs: Markdown tables, one JSON file and a plot of speed-up against Tok."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["format_report", "plot_speedup_curves"]


def _millions(count: int) -> str:
    return f"{count / 1e6:.1f}M"


def format_report(results: Sequence[dict[str, Any]], tokens_grid: Sequence[float], header: str) -> str:
    """
    Markdown: a summary table (one row per shape), then per shape the cost split and speed-up per k and Tok.

    Args:
        results (`Sequence[dict]`): `estimate_shape` results.
        tokens_grid (`Sequence[float]`): The Tok. columns.
        header (`str`): Lines naming the command, machine and settings.
    """
    lines = [header, ""]
    grid_header = " | ".join(f"projected at Tok. {tokens:g}" for tokens in tokens_grid)
    lines += [
        "| verifier shape | params | greedy ms/token | best k | profile Tok. | projected | measured (min–max) "
        f"| {grid_header} | perfect drafts (k={_largest(results)}) measured / projected |",
        "|---|---|---|---|---|---|---|" + "---|" * len(tokens_grid) + "---|",
    ]
    for result in results:
        best = str(result["best_k"])
        profile = result["validation"]["profile"]
        perfect = result["validation"]["perfect"]
        # the Tok. columns at the profile's best k: what a better drafter of the same design would give there
        grid = result["grid"][result["best_k"]]
        columns = [f"{grid[str(tokens)]:.2f}×" if str(tokens) in grid else "–" for tokens in tokens_grid]
        lines.append(
            f"| {result['shape']} | {_millions(result['parameters'])} | {result['greedy_ms_per_token']:.2f} | {best} "
            f"| {profile['tokens_per_iteration']:.2f} | {profile['projected_speedup']:.2f}× "
            f"| {profile['measured_speedup']:.2f}× ({profile['measured_speedup_min']:.2f}–"
            f"{profile['measured_speedup_max']:.2f}) | {' | '.join(columns)} "
            f"| {perfect['measured_speedup']:.2f}× / {perfect['projected_speedup']:.2f}× |"
        )
    lines += [
        "",
        "Tok. columns: the projected speed-up at the best k for the profile, had the drafter that Tok. there "
        "(the per-shape tables give every k).",
    ]
    for result in results:
        lines += [
            "",
            f"### {result['shape']} ({result['model_type']}, {_millions(result['parameters'])} parameters)",
            "",
        ]
        lines += [
            "| k | verify | drafter | loop | iteration (greedy steps) | fixed ms/sentence | profile Tok. "
            f"| projected | {grid_header} | perfect (Tok. k+1) |",
            "|---|---|---|---|---|---|---|---|" + "---|" * len(tokens_grid) + "---|",
        ]
        for num_draft_tokens, row in result["costs"].items():
            steps = row["greedy_steps"]
            grid = result["grid"][num_draft_tokens]
            cells = [f"{grid[str(tokens)]:.2f}×" if str(tokens) in grid else "–" for tokens in tokens_grid]
            perfect = grid[str(float(int(num_draft_tokens) + 1))]
            lines.append(
                f"| {num_draft_tokens} | {steps['verify']:.2f} | {steps['drafter']:.2f} | {steps['loop']:.2f} "
                f"| {steps['iteration']:.2f} | {row['ms']['fixed_per_sentence']:.1f} "
                f"| {row['profile_tokens_per_iteration']:.2f} | {row['profile_speedup']:.2f}× | {' | '.join(cells)} "
                f"| {perfect:.2f}× |"
            )
        mismatches = [run["mismatches"] for run in result["validation"].values()]
        lines.append(
            f"\nOutputs differing from greedy: {result['calibration_mismatches']} in the calibration runs, "
            f"{sum(mismatches)} in the direct runs (of {result['sentences']} sentences each)."
        )
    return "\n".join(lines) + "\n"


def _largest(results: Sequence[dict[str, Any]]) -> int:
    return max((result["validation"]["perfect"]["num_draft_tokens"] for result in results), default=0)


def plot_speedup_curves(results: Sequence[dict[str, Any]], path: Path) -> Path:
    """
    A PNG of the projected speed-up against Tok., one line per shape at its best k for the profile, with the two
    direct runs of each shape as points.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for result in results:
        tokens, speedups = zip(*result["curve_at_best_k"], strict=True)
        (line,) = axes.plot(tokens, speedups, label=f"{result['shape']} (k={result['best_k']})")
        run = result["validation"]["profile"]
        axes.plot([run["tokens_per_iteration"]], [run["measured_speedup"]], "o", color=line.get_color())
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("tokens per iteration (Tok.)")
    axes.set_ylabel("speed-up over greedy")
    axes.set_title("Projected speed-up by verifier shape (dots: measured with an oracle drafter)")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
