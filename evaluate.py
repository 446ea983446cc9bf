"""Quality and speed of Speculative Decoding side by side with greedy, beam search and transformers' drafting.

    python evaluate.py --config configs/eval/debian_en_de.yaml [--limit 100 --batch_size 8 ...]

Writes `results.json` (every figure and the environment), `results.md` (the tables printed on the console),
`generations/<strategy>.jsonl` and `latency_throughput.png` into `--output_dir`. See `specdec_hf/evaluation/`.
This file stays a thin entry point: it shares its name with the Hugging Face `evaluate` library, which the project
therefore never imports.
"""

from __future__ import annotations

import logging
import sys

import datasets
import transformers

from specdec_hf.evaluation import parse_evaluation_arguments, run_evaluation


def main(argv: list[str] | None = None) -> dict:
    """Parse `--config file.yaml` plus overrides, evaluate, and return the results."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("specdec_hf").setLevel(logging.INFO)
    datasets.disable_progress_bars()
    if not sys.stderr.isatty():
        # transformers' weight-loading bars would write carriage-return redraws into a redirected log
        transformers.utils.logging.disable_progress_bar()
    evaluation_args, data_args = parse_evaluation_arguments(argv)
    return run_evaluation(evaluation_args, data_args)


if __name__ == "__main__":
    main()
