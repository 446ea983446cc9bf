"""The model card (README.md) written next to a trained drafter."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_model_card"]


def write_model_card(
    output_dir: str | Path,
    drafter,
    verifier_name: str,
    data: str,
    steps: int,
    metrics: dict,
    objective: str | None = None,
):
    """Write `output_dir/README.md`: Hub metadata, what the drafter is for, how to use it, how it was trained.

    Args:
        output_dir: The directory the drafter was saved to.
        drafter (`SpecDrafterModel`): The trained drafter (its config is described).
        verifier_name (`str`): Hub id or path of the verifier it drafts for.
        data (`str`): What it was trained on.
        steps (`int`): Optimizer steps trained.
        metrics (`dict`): The last evaluation (`tokens_per_iteration`, `accuracy_by_position`, ...).
        objective (`str`, *optional*): What the training minimised (`DrafterLossSettings.describe`).
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
    text = f"""---
library_name: specdec_hf
base_model: {verifier_name}
tags:
- speculative-decoding
- spec-drafter
---

# Spec-Drafter for `{verifier_name}`

A non-autoregressive drafter for Speculative Decoding (Xia et al., 2023, arXiv 2203.16487): it proposes up to
{config.max_draft_tokens} next tokens of `{verifier_name}` in one call ({config.num_draft_tokens or config.max_draft_tokens} unless `generate()` gets another
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

## Evaluation (held-out distilled sources, β = 1)

- tokens per iteration (Tok.): {f"{tok:.2f}" if tok is not None else "not measured"}
- draft accuracy by block position: {by_position or "not measured"}
"""
    Path(output_dir, "README.md").write_text(text)
