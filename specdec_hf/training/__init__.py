"""Training the Spec-Drafter: examples, batching, checkpoints, evaluation; `train_drafter.py` drives them."""

from .arguments import DrafterTrainingArguments, parse_yaml_and_cli
from .block_examples import BlockExamples, sample_block_examples
from .checkpointing import find_latest_checkpoint, read_training_state, save_checkpoint_atomically
from .collator import DistilledBatchCollator
from .drafter_evaluation import evaluate_drafter
from .encoder_states import verifier_encoder_states
from .glancing import glancing_targets
from .in_memory import distill_greedy_outputs, fit_drafter_in_memory
from .length_grouping import LengthGroupedSampler
from .model_card import write_model_card

__all__ = [
    "BlockExamples",
    "DistilledBatchCollator",
    "DrafterTrainingArguments",
    "LengthGroupedSampler",
    "distill_greedy_outputs",
    "evaluate_drafter",
    "find_latest_checkpoint",
    "fit_drafter_in_memory",
    "glancing_targets",
    "parse_yaml_and_cli",
    "read_training_state",
    "sample_block_examples",
    "save_checkpoint_atomically",
    "verifier_encoder_states",
    "write_model_card",
]
