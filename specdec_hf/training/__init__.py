"""Training the Spec-Drafter: examples, batching, checkpoints, evaluation; `train_drafter.py` drives them."""

from .arguments import DrafterTrainingArguments
from .checkpointing import (
    check_checkpoint_files,
    check_data_order,
    find_latest_checkpoint,
    is_checkpoint_writer,
    load_checkpoint,
    read_training_state,
    save_checkpoint_atomically,
)
from .collator import DistilledBatchCollator
from .draft_examples import DraftExamples, choose_split_lengths, every_split_labels, sample_draft_examples
from .drafter_evaluation import evaluate_drafter
from .glancing import glancing_targets
from .in_memory import distill_greedy_outputs, fit_drafter_in_memory
from .length_grouping import LengthGroupedSampler
from .loss import DrafterLossSettings, VerifierTeacherOutputs, drafter_training_loss, verifier_teacher_outputs
from .model_card import drafter_card_data, write_model_card
from .output_dir import earlier_run_files, prepare_output_dir
from .vocabulary import frequent_token_ids, token_counts, token_coverage

__all__ = [
    "DraftExamples",
    "DistilledBatchCollator",
    "DrafterLossSettings",
    "DrafterTrainingArguments",
    "LengthGroupedSampler",
    "VerifierTeacherOutputs",
    "check_checkpoint_files",
    "check_data_order",
    "choose_split_lengths",
    "drafter_training_loss",
    "distill_greedy_outputs",
    "drafter_card_data",
    "earlier_run_files",
    "evaluate_drafter",
    "every_split_labels",
    "find_latest_checkpoint",
    "frequent_token_ids",
    "is_checkpoint_writer",
    "fit_drafter_in_memory",
    "glancing_targets",
    "load_checkpoint",
    "prepare_output_dir",
    "read_training_state",
    "sample_draft_examples",
    "save_checkpoint_atomically",
    "token_counts",
    "token_coverage",
    "verifier_teacher_outputs",
    "write_model_card",
]
