"""The main job's β=1 speed-up at two revisions of the code, their runs alternating, on the same machine.

A change that should not cost speed (a redesign, fewer host synchronisations) is checked by running `evaluate.py`
at both revisions in turn, `rounds` times: each run's speed-up is a ratio of greedy and speculative decoding timed
interleaved in one process, so drift within a run cancels; alternating the revisions spreads the machine's drift
over both. Each revision is checked out into a temporary git worktree and imported from there (its directory comes
first on `sys.path`), with this environment's packages.

    python -m lab.compare_revisions --before f880a85 --after HEAD --rounds 3 --limit 60
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_revision(worktree: Path, args: argparse.Namespace, output_dir: Path) -> dict:
    """One `evaluate.py` run of the main job's greedy and β=1 strategies at the revision checked out in `worktree`."""
    command = [
        sys.executable, "evaluate.py", "--config", args.config, "--strategies", "greedy", args.strategy,
        "--limit", str(args.limit), "--repeats", str(args.repeats), "--sweep", "false", "--measure_memory", "false",
        "--disable_tqdm", "true", "--output_dir", str(output_dir),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(worktree), "HF_HUB_OFFLINE": "1"}
    completed = subprocess.run(command, cwd=worktree, env=env, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} in {worktree} failed:\n{completed.stderr[-3000:]}")
    results = json.loads((output_dir / "results.json").read_text())["strategies"]
    speculative = results[args.strategy]
    return {
        "speedup": speculative["speed"]["speedup"],
        "greedy_s": results["greedy"]["speed"]["time_s"],
        "speculative_s": speculative["speed"]["time_s"],
        "identical": speculative["identical_to_greedy"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="The earlier revision (any git revision).")
    parser.add_argument("--after", default="HEAD", help="The later revision.")
    parser.add_argument("--config", default="configs/eval/demo_en_de.yaml", help="Relative to the repository.")
    parser.add_argument("--strategy", default="spec_k2_b1_t0")
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="Interleaved repeats inside each run.")
    parser.add_argument("--rounds", type=int, default=3, help="Runs per revision, alternating.")
    args = parser.parse_args(argv)
    print(f"command: python {shlex.join(sys.argv)}")
    with tempfile.TemporaryDirectory() as scratch:
        worktrees = {}
        for label in ("before", "after"):
            revision = getattr(args, label)
            worktrees[label] = Path(scratch) / label
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(worktrees[label]), revision], cwd=ROOT, check=True
            )
        try:
            rows = {"before": [], "after": []}
            for round_index in range(args.rounds):
                order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
                for label in order:
                    result = run_revision(worktrees[label], args, Path(scratch) / f"{label}-{round_index}")
                    rows[label].append(result)
                    print(f"round {round_index} {label}: {result}", flush=True)
        finally:
            for worktree in worktrees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    print("\n| revision | speed-up per round | median | greedy s (median) | = greedy |\n|---|---|---|---|---|")
    for label in ("before", "after"):
        speedups = [row["speedup"] for row in rows[label]]
        greedy = statistics.median(row["greedy_s"] for row in rows[label])
        identical = min(row["identical"] for row in rows[label])
        values = ", ".join(f"{value:.3f}" for value in speedups)
        print(
            f"| {label} ({getattr(args, label)}) | {values} | {statistics.median(speedups):.3f} | {greedy:.3f} | {identical:.3f} |"
        )


if __name__ == "__main__":
    main()
