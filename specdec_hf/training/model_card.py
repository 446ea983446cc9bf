"""The model card (README.md) written next to a trained drafter, built with `huggingface_hub`'s `ModelCard`.

Its metadata follows the Hub's model-card spec: `library_name`, tags, `base_model` (the verifier, when it is a Hub
id: a local path is named in the text instead) and the evaluation as `model-index` results (`eval_results`), so that
`ModelCard.load` and the Hub read them back.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..auto_draft_length import AUTO

__all__ = ["drafter_card_data", "write_model_card"]

_TAGS = ["speculative-decoding", "spec-drafter", "specdec_hf"]
# the held-out data is the verifier's own outputs, not a Hub dataset: this id says what it is
_DISTILLED_DATASET = "distilled-verifier-outputs"


def drafter_card_data(verifier_name: str, metrics: dict, data: str, model_name: str) -> ModelCardData:
    """The card metadata of a drafter: library, tags, `base_model` when the verifier is a Hub id, evaluation results.

    Args:
        verifier_name (`str`): Hub id or local path of the verifier it drafts for.
        metrics (`dict`): The last evaluation (`tokens_per_iteration`, `accuracy_by_position`); may be empty.
        data (`str`): What it was trained and evaluated on (a description).
        model_name (`str`): The drafter's name in the results (`model-index`), e.g. its Hub id or directory name.
    """
    results = []
    common = {
        "task_type": "text2text-generation",
        "task_name": "Speculative decoding (draft acceptance at beta = 1)",
        "dataset_type": _DISTILLED_DATASET,
        "dataset_name": data or "held-out distilled sources",
        "dataset_split": "held-out",
    }
    if metrics.get("tokens_per_iteration") is not None:
        tok = round(float(metrics["tokens_per_iteration"]), 4)
        results.append(
            EvalResult(
                metric_type="tokens_per_iteration",
                metric_name="Tok. (tokens per iteration)",
                metric_value=tok,
                **common,
            )
        )
    for position, accuracy in enumerate(metrics.get("accuracy_by_position", []), start=1):
        results.append(
            EvalResult(
                metric_type=f"draft_accuracy_position_{position}",
                metric_name=f"Draft accuracy at draft position {position}",
                metric_value=round(float(accuracy), 4),
                **common,
            )
        )
    return ModelCardData(
        library_name="specdec_hf",
        base_model=verifier_name if _is_hub_id(verifier_name) else None,
        tags=list(_TAGS),
        model_name=model_name,
        eval_results=results or None,
    )


def _is_hub_id(name: str) -> bool:
    """A Hub repository id (`owner/name`), not a directory here (`models/demo-en-de/verifier` is one)."""
    if Path(name).expanduser().exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def write_model_card(
    output_dir: str | Path,
    drafter,
    verifier_name: str,
    data: str,
    steps: int,
    metrics: dict,
    objective: str | None = None,
    model_name: str | None = None,
) -> ModelCard:
    """Write `output_dir/README.md`: Hub metadata, what the drafter is for, how to use it, how it was trained.

    Args:
        output_dir: The directory the drafter was saved to.
        drafter (`SpecDrafterModel`): The trained drafter (its config is described).
        verifier_name (`str`): Hub id or path of the verifier it drafts for.
        data (`str`): What it was trained on.
        steps (`int`): Optimizer steps trained.
        metrics (`dict`): The last evaluation (`tokens_per_iteration`, `accuracy_by_position`, ...).
        objective (`str`, *optional*): What the training minimised (`DrafterLossSettings.describe`).
        model_name (`str`, *optional*): Its name in the results (e.g. the Hub id it is pushed to); default: the
            directory's name.

    Returns:
        The `ModelCard` written.
    """
    config = drafter.config
    tok = metrics.get("tokens_per_iteration")
    by_position = ", ".join(f"{a:.2f}" for a in metrics.get("accuracy_by_position", []))
    encoder = "the verifier's encoder output" if config.use_verifier_encoder else f"{config.encoder_layers} layers"
    layers = f"{config.decoder_layers} decoder layer" + ("" if config.decoder_layers == 1 else "s")
    objective = objective or f"cross-entropy on the next k = {config.max_draft_tokens} verifier tokens"
    reads = ""
    if config.verifier_state_layers:
        reads += f", reads the verifier's decoder states of layers {config.verifier_state_layers} (EAGLE-style)"
    if config.draft_vocab_size:
        reads += f", LM head over the {config.draft_vocab_size} most frequent target tokens"
    default_k = config.num_draft_tokens or config.max_draft_tokens
    default_k = "a number chosen at every iteration" if default_k == AUTO else default_k
    text = f"""# Spec-Drafter for `{verifier_name}`

A non-autoregressive drafter for Speculative Decoding (Xia et al., 2023, arXiv 2203.16487): it proposes up to
{config.max_draft_tokens} next tokens of `{verifier_name}` in one call ({default_k} unless `generate()` gets another
`num_draft_tokens`), and the verifier checks them in one forward pass. With `beta=1` the output is exactly the verifier's
greedy output.

```python
import specdec_hf
from specdec_hf import SpecDrafterModel, enable_speculative_decoding
from transformers import AutoModelForSeq2SeqLM

verifier = AutoModelForSeq2SeqLM.from_pretrained("{verifier_name}")
drafter = SpecDrafterModel.from_pretrained("<this repository or directory>")
out = enable_speculative_decoding(verifier).generate(**inputs, drafter=drafter)
```

## Training

- verifier: `{verifier_name}`
- data: {data or "distilled verifier outputs"}
- objective: {objective}
- optimizer steps: {steps}
- drafter: d_model {config.d_model}, encoder {encoder}, {layers},
  prefix attention `{config.prefix_attention}`{reads}

## Evaluation (held-out distilled sources, β = 1, k = {config.max_draft_tokens})

- tokens per iteration (Tok.): {f"{tok:.2f}" if tok is not None else "not measured"}
- draft accuracy by draft position: {by_position or "not measured"}
"""
    model_name = model_name or Path(output_dir).resolve().name
    card = ModelCard(f"---\n{drafter_card_data(verifier_name, metrics, data, model_name).to_yaml()}\n---\n\n{text}")
    card.save(Path(output_dir, "README.md"))
    return card
