"""The verifier's encoder output for drafters that read it instead of running an encoder of their own."""

from __future__ import annotations

import torch

__all__ = ["verifier_encoder_states"]


@torch.no_grad()
def verifier_encoder_states(verifier, drafter, input_ids: torch.LongTensor, attention_mask: torch.LongTensor):
    """`(batch_size, source_length, verifier_d_model)` states for a `use_verifier_encoder` drafter, else `None`.

    The verifier is frozen, so no gradient flows into it.
    """
    if not drafter.config.use_verifier_encoder:
        return None
    return verifier.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)[0]
