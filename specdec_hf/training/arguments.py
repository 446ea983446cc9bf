"""Configuration of `train_drafter.py`: a dataclass read from a YAML file, with command-line overrides
(`specdec_hf.config_parsing.parse_yaml_and_cli`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from .loss import DrafterLossSettings

__all__ = ["DrafterTrainingArguments"]


@dataclass
class DrafterTrainingArguments:
    """What `train_drafter.py` trains, on what, and how.

    The training data is a distilled dataset written by `python -m specdec_hf.distillation` (the verifier's own
    outputs, `target_ids`, for each source, `input_ids`): the drafter learns what the verifier says.
    """

    # --- models ---
    verifier_name_or_path: str = field(metadata={"help": "The verifier: a Hub id or a local directory."})
    train_data: str = field(
        metadata={"help": "Distilled training data (directory written by specdec_hf.distillation)."}
    )
    output_dir: str = field(metadata={"help": "Where checkpoints, logs and the final drafter go."})
    drafter_name_or_path: str | None = field(
        default=None, metadata={"help": "Continue from this drafter instead of building one with from_verifier."}
    )
    max_draft_tokens: int = field(
        default=10,
        metadata={"help": "k trained: mask slots of a new drafter, the most tokens it drafts per iteration."},
    )
    drafter_config: dict = field(
        default_factory=dict,
        metadata={
            "help": "SpecDrafterConfig overrides for from_verifier (e.g. decoder_layers, prefix_attention, "
            "verifier_state_layers, num_draft_tokens)."
        },
    )
    eval_data: str | None = field(
        default=None, metadata={"help": "Distilled held-out data; default: hold out `eval_samples` training rows."}
    )
    dataset_description: str = field(default="", metadata={"help": "What the data is, for the model card."})

    # --- optimisation ---
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Examples per device and micro-step."})
    group_by_length: bool = field(
        default=False,
        metadata={"help": "Batch examples of similar length together (less padding, faster steps on varied data)."},
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-steps per optimizer step."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak learning rate (Adam)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "Adam beta2."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    lr_scheduler_type: str = field(
        default="inverse_sqrt", metadata={"help": "transformers scheduler name: inverse_sqrt, linear, cosine, ..."}
    )
    warmup_steps: int = field(default=1000, metadata={"help": "Learning-rate warm-up steps."})
    max_steps: int = field(default=10000, metadata={"help": "Optimizer steps to train."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 disables)."})
    label_smoothing: float = field(default=0.1, metadata={"help": "Label smoothing of the cross-entropy."})
    glancing_ratio: float = field(
        default=0.0,
        metadata={"help": "GLAT: reveal this fraction of wrongly predicted slots in a second pass (0 disables)."},
    )
    split_points: str = field(
        default="random",
        metadata={
            "help": "'random': one split of each sequence per step (the paper); 'all': every split point of every "
            "sequence in one forward pass (needs prefix_attention: causal)."
        },
    )
    max_splits: int | None = field(
        default=None, metadata={"help": "With split_points 'all': at most this many split points per batch."}
    )
    soft_label_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of KL(verifier || drafter) at every drafted position (soft labels; 0 disables)."},
    )
    draft_vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "Reduced-vocabulary head: the drafter scores only the N most frequent target tokens of "
            "train_data (a new drafter only)."
        },
    )
    mixed_precision: str | None = field(
        default=None, metadata={"help": "no / fp16 / bf16; default: what `accelerate launch` was configured with."}
    )
    seed: int = field(default=0, metadata={"help": "Seed for initialisation, data order and split points."})

    # --- checkpoints, evaluation, logging ---
    checkpointing_steps: int = field(default=1000, metadata={"help": "Save a resumable checkpoint every N steps."})
    checkpoints_total_limit: int = field(default=2, metadata={"help": "Checkpoints kept (oldest deleted first)."})
    save_on_each_node: bool = field(
        default=False,
        metadata={
            "help": "Write checkpoints on every machine (each in its own output_dir), for several machines without a "
            "shared filesystem; leave off when they share output_dir."
        },
    )
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "A checkpoint directory, or 'latest' for the newest in output_dir."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace an earlier run in output_dir (its checkpoints and drafter are removed first)."},
    )
    eval_steps: int = field(default=1000, metadata={"help": "Evaluate tokens per iteration every N steps."})
    eval_samples: int = field(default=64, metadata={"help": "Held-out examples used by the periodic evaluation."})
    eval_batch_size: int = field(default=16, metadata={"help": "Batch size of the evaluation's generate() calls."})
    eval_max_new_tokens: int = field(default=128, metadata={"help": "Generation length limit during evaluation."})
    logging_steps: int = field(default=50, metadata={"help": "Log loss, lr and tokens/s every N steps."})
    report_to: str | None = field(
        default=None, metadata={"help": "Accelerate tracker: tensorboard, wandb, ... (None: console only)."}
    )
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads per process."})

    # --- hub ---
    push_to_hub: bool = field(default=False, metadata={"help": "Push the final drafter to the Hub (HF_TOKEN)."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repository id for --push_to_hub."})

    def __post_init__(self):
        positive = ("max_draft_tokens", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps")
        for name in positive + ("checkpointing_steps", "eval_steps", "logging_steps", "checkpoints_total_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        self.loss_settings()  # validates the loss's fields
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("`push_to_hub` needs `hub_model_id` (e.g. your-name/bart-base-spec-drafter).")
        if isinstance(self.drafter_config, str):
            self.drafter_config = yaml.safe_load(self.drafter_config) or {}

    def loss_settings(self) -> DrafterLossSettings:
        """What each training batch's loss is made of (see `specdec_hf.training.loss`)."""
        return DrafterLossSettings(
            split_points=self.split_points,
            max_splits=self.max_splits,
            label_smoothing=self.label_smoothing,
            glancing_ratio=self.glancing_ratio,
            soft_label_weight=self.soft_label_weight,
        )
