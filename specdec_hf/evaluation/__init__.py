"""Evaluation of Speculative Decoding against greedy, beam search and transformers' assisted generation.

`python evaluate.py --config configs/eval/<task>.yaml` runs `run_evaluation`; the pieces are usable on their own:
`corpus_quality` (sacrebleu BLEU/chrF, rouge-score ROUGE), `measure_peak_memory`, `ModuleTimer`, `TimedDrafter`,
and the interleaved timing of `interleaved.py` (`time_interleaved`, `timing_summary`), which the benchmarks share.
"""

from .arguments import EvaluationArguments, parse_evaluation_arguments
from .memory import measure_peak_memory, parameter_bytes
from .metrics import corpus_quality, fraction_identical
from .runner import run_evaluation
from .strategies import Strategy, parse_strategy, resolve_strategies
from .timing import ModuleTimer, TimedDrafter

__all__ = [
    "EvaluationArguments",
    "ModuleTimer",
    "Strategy",
    "TimedDrafter",
    "corpus_quality",
    "fraction_identical",
    "measure_peak_memory",
    "parameter_bytes",
    "parse_evaluation_arguments",
    "parse_strategy",
    "resolve_strategies",
    "run_evaluation",
]
