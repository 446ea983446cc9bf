"""Training the Spec-Drafter: block examples (this package) and the `train_drafter.py` script around them."""

from .block_examples import BlockExamples, sample_block_examples
from .in_memory import distill_greedy_outputs, fit_drafter_in_memory

__all__ = ["BlockExamples", "distill_greedy_outputs", "fit_drafter_in_memory", "sample_block_examples"]
