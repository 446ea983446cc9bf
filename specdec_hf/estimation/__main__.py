"""`python -m specdec_hf.estimation`: what speculative decoding would buy on a verifier, measured on this machine.

    python -m specdec_hf.estimation --verifier opus-mt-en-de bart-base --threads 2
    python -m specdec_hf.estimation --verifier path/to/checkpoint --acceptance 0.8,0.6,0.5,0.4
    python -m specdec_hf.estimation --verifier t5-small --acceptance_from outputs/run/results.json

See `specdec_hf.estimation` for what is measured and how.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers

from ..config_parsing import parse_yaml_and_cli
from ..evaluation.machine import cpu_model, load_average
from ..evaluation.progress import progress_bar
from .estimator import estimate_shape
from .measurement import MeasurementSettings
from .profile import AcceptanceProfile
from .report import format_report, plot_speedup_curves
from .shapes import BUILTIN_SHAPES

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EstimateArguments:
    """What to measure and how; every field is also a command-line flag."""

    verifier: list[str] = field(
        default_factory=lambda: list(BUILTIN_SHAPES),
        metadata={
            "help": f"Verifier shapes: built-in names ({', '.join(BUILTIN_SHAPES)}), directories with a config.json, "
            "or Hub ids (only config.json is read; weights are random).",
            "nargs": "+",
        },
    )
    num_draft_tokens: str = field(default="2,4,8", metadata={"help": "The k to measure, comma-separated."})
    acceptance: str | None = field(
        default=None,
        metadata={
            "help": "The drafter's per-position acceptance: comma-separated P(draft i accepted | drafts before it "
            "accepted), e.g. '0.8,0.6,0.5'; the last rate repeats. Default: a constant rate giving Tok. 2.5 at k=4."
        },
    )
    acceptance_from: str | None = field(
        default=None,
        metadata={
            "help": "Read the acceptance profile from a JSON file: evaluate.py's results.json or speculative_stats "
            "(`to_dict()`) of a trained drafter's run."
        },
    )
    acceptance_strategy: str | None = field(
        default=None, metadata={"help": "With --acceptance_from a results.json: the speculative strategy to read."}
    )
    tokens_per_iteration: str = field(
        default="2,2.5,3,3.5,4", metadata={"help": "The Tok. values at which speed-ups are projected."}
    )
    sentences: int = field(default=3, metadata={"help": "Random source sentences per shape (batch size 1)."})
    source_length: int = field(default=24, metadata={"help": "Source tokens per sentence."})
    max_new_tokens: int = field(default=48, metadata={"help": "Tokens generated per sentence (EOS is off)."})
    rounds: int = field(default=3, metadata={"help": "Interleaved timing rounds of the direct runs."})
    calibration_rounds: int = field(default=1, metadata={"help": "Instrumented runs per k (median)."})
    threads: int | None = field(default=None, metadata={"help": "torch threads (default: torch's)."})
    device: str = field(default="cuda" if torch.cuda.is_available() else "cpu", metadata={"help": "cpu or cuda."})
    dtype: str = field(default="float32", metadata={"help": f"Weights: {', '.join(_DTYPES)}."})
    prepack_linear: bool = field(
        default=True,
        metadata={
            "help": "On CPU, run linear layers on packed weights (oneDNN, FBGEMM float16) where measured faster, as "
            "evaluate.py can (`specdec_hf.prepack_where_faster`)."
        },
    )
    drafter_config: dict | None = field(
        default=None,
        metadata={
            "help": "Another drafter design: SpecDrafterConfig fields replacing the recommended one's, e.g. "
            '\'{"decoder_layers": 2, "draft_vocab_size": 0}\' (0: the full vocabulary).'
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of the weights, the sources and the acceptance draws."})
    output_dir: str = field(default="outputs/estimate", metadata={"help": "Where report.md, results.json go."})
    plot: bool = field(default=True, metadata={"help": "Write speedup_by_tokens.png."})

    def __post_init__(self):
        self.num_draft_tokens_list = _numbers(self.num_draft_tokens, int, "num_draft_tokens")
        if min(self.num_draft_tokens_list) < 1:
            raise ValueError(f"--num_draft_tokens: each k must be at least 1, got {self.num_draft_tokens!r}")
        self.tokens_grid = _numbers(self.tokens_per_iteration, float, "tokens_per_iteration")
        if min(self.tokens_grid) < 1:
            raise ValueError(f"--tokens_per_iteration: Tok. is at least 1, got {self.tokens_per_iteration!r}")
        if self.acceptance is not None and self.acceptance_from is not None:
            raise ValueError("give the acceptance profile once: --acceptance or --acceptance_from, not both")
        if self.dtype not in _DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here; use --device cpu")
        for name in ("sentences", "source_length", "max_new_tokens", "rounds", "calibration_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")

    def profile(self) -> AcceptanceProfile:
        """The acceptance profile the arguments name."""
        if self.acceptance_from is not None:
            return AcceptanceProfile.from_file(self.acceptance_from, self.acceptance_strategy)
        if self.acceptance is not None:
            rates = tuple(_numbers(self.acceptance, float, "acceptance"))
            return AcceptanceProfile(rates, source="--acceptance")
        return AcceptanceProfile.constant_for_tokens(2.5, 4)

    def settings(self) -> MeasurementSettings:
        """The measurement settings the arguments name."""
        return MeasurementSettings(
            sentences=self.sentences,
            source_length=self.source_length,
            max_new_tokens=self.max_new_tokens,
            rounds=self.rounds,
            calibration_rounds=self.calibration_rounds,
            device=self.device,
            dtype=_DTYPES[self.dtype],
            prepack_linear=self.prepack_linear,
            seed=self.seed,
            drafter_overrides=self.drafter_config,
        )


def _numbers(text: str, kind: type, name: str) -> list:
    try:
        values = [kind(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated {kind.__name__}s, got {text!r}") from None
    if not values:
        raise ValueError(f"--{name} is empty")
    return values


def header(args: EstimateArguments, profile: AcceptanceProfile) -> str:
    """The lines that say how the figures were measured."""
    load = load_average()
    return "\n".join(
        [
            f"command: python -m specdec_hf.estimation {shlex.join(sys.argv[1:])}",
            f"machine: {cpu_model()}, {os.cpu_count()} logical cores, load average "
            f"{'unknown' if load is None else f'{load:.2f}'} at start; {platform.platform()}; device {args.device}",
            f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} thread(s), "
            f"{args.dtype}, linear layers prepacked where measured faster: "
            f"{args.prepack_linear and args.device == 'cpu'}",
            f"random weights; batch 1; {args.sentences} random sources of {args.source_length} tokens, "
            f"{args.max_new_tokens} new tokens each (EOS off); a random Spec-Drafter of the recommended design "
            "really called, its tokens set by an oracle; greedy and the two direct runs interleaved over "
            f"{args.rounds} rounds (median of the per-round ratios, min–max); costs from {args.calibration_rounds} "
            "instrumented runs per k",
            f"acceptance profile: {profile.describe(4)}",
        ]
    )


def main(argv: list[str] | None = None) -> list[dict]:
    """Parse the arguments, measure every shape, print and save the report; returns the per-shape results."""
    (args,) = parse_yaml_and_cli([EstimateArguments], argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    profile = args.profile()
    settings = args.settings()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = []
    for name in progress_bar(args.verifier, "verifier shapes"):
        results.append(estimate_shape(name, profile, args.num_draft_tokens_list, args.tokens_grid, settings))
    report = format_report(results, args.tokens_grid, header(args, profile))
    report += f"\nWall time of the run: {time.perf_counter() - start:.0f} s.\n"
    print(report)
    (output_dir / "report.md").write_text(report, encoding="utf-8")
    payload = {"arguments": asdict(args), "profile": list(profile.rates), "results": results}
    (output_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot_speedup_curves(results, output_dir / "speedup_by_tokens.png")
    return results


if __name__ == "__main__":
    main()
