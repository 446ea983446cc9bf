"""The quality-speed picture of decoding settings: BLEU against sentences per second, one point per strategy.

Quality and speed may come from two `evaluate.py` runs of the same strategies (quality on a whole split at a
large batch size, speed at batch size 1 on fewer rows, as the demo pair's settings are chosen); strategies are
matched by name, and those in only one run are left out.

    python scripts/plot_quality_speed.py --quality outputs/demo_en_de_beam_tuning \\
        --speed outputs/demo_en_de_tuning --output docs/quality_speed.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # a file, no screen
import matplotlib.pyplot as plt  # noqa: E402

from specdec_hf.evaluation.summary import strategy_label  # noqa: E402


def load(directory: str) -> dict:
    """A run's `results.json`."""
    path = Path(directory) / "results.json"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found: run evaluate.py with output_dir {directory} first")
    return json.loads(path.read_text())


def points(quality: dict, speed: dict) -> list[tuple[str, float, float]]:
    """(label, sentences per second, BLEU) of every strategy in both runs."""
    evaluation = quality["config"]["evaluation"]
    drafters, num_beams = evaluation.get("drafters") or [], evaluation.get("num_beams")
    found = []
    for name, result in quality["strategies"].items():
        timed = speed["strategies"].get(name)
        if timed is None:
            continue
        found.append(
            (strategy_label(name, drafters, num_beams), timed["speed"]["sentences_per_s"], result["quality"]["bleu"])
        )
    return found


def main(argv: list[str] | None = None) -> Path:
    """Draw the picture; return its path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quality", required=True, help="The run whose BLEU is plotted (an output directory).")
    parser.add_argument("--speed", required=True, help="The run whose sentences per second are plotted.")
    parser.add_argument("--output", required=True, help="The PNG to write.")
    args = parser.parse_args(argv)
    quality, speed = load(args.quality), load(args.speed)
    found = points(quality, speed)
    if not found:
        raise SystemExit("error: the two runs share no strategy name")
    figure, axes = plt.subplots(figsize=(8, 5.5))
    # labels above and below their points in turn, by speed: settings of equal quality sit side by side
    for index, (label, x, y) in enumerate(sorted(found, key=lambda point: point[1])):
        kind = "beam" if label.startswith("beam") or label == "greedy" else "spec"
        axes.scatter(x, y, marker="s" if kind == "beam" else "o", color="tab:gray" if kind == "beam" else "tab:blue")
        offset = (4, 4) if index % 2 == 0 else (4, -11)
        axes.annotate(label, (x, y), textcoords="offset points", xytext=offset, fontsize=7)
    beams = sorted((x, y) for label, x, y in found if label.startswith("beam") or label == "greedy")
    if len(beams) > 1:
        axes.plot(*zip(*beams, strict=True), color="tab:gray", linewidth=0.8, linestyle="--")
    environment = speed["environment"]
    axes.set_xlabel(
        f"sentences per second (batch {speed['config']['evaluation']['batch_size']}, {speed['data']['num_samples']} rows, "
        f"{environment['num_threads']} threads, {environment['device_name']})"
    )
    axes.set_ylabel(f"BLEU ({quality['data']['num_samples']} rows of {quality['data']['description']})")
    axes.set_title("Quality against speed: beam widths (squares) and speculative settings (circles)", fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    print(f"Written: {output} ({len(found)} strategies)")
    return output


if __name__ == "__main__":
    main()
