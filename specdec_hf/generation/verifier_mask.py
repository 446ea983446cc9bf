"""The verifier decoder's causal self-attention mask for the loop's verify forwards, built once and sliced.

Left to itself, a decoder fed q > 1 tokens on a cache of C builds its `(batch, 1, q, C + q)` causal mask at every call
(`transformers.masking_utils.create_causal_mask`: a dozen small tensor operations and their Python; with one token,
as in greedy decoding, SDPA builds none). The pattern depends only on positions, so [`CausalMaskTable`] builds it once
for many positions, with transformers' own mask function for the verifier's attention implementation (a boolean mask
for SDPA, an additive float mask for eager attention), and each verify forward receives a slice of it as a prepared 4D
mask, which `create_causal_mask` passes through as it is. The values are those transformers would build, so the
forward computes the same.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function

__all__ = ["CausalMaskTable"]

# the implementations whose mask functions return a plain 4D tensor that a decoder can take prepared (flash
# attention takes no 4D mask, flex attention a BlockMask): any other keeps building its own
_TENSOR_MASK_IMPLEMENTATIONS = ("sdpa", "eager")

# the supported families, whose decoders pass `decoder_attention_mask` through `create_causal_mask` (read in their
# modeling code; re-check on a transformers upgrade); another encoder-decoder may read a 4D mask differently, and
# builds its own
_PREPARED_MASK_MODEL_TYPES = ("bart", "mbart", "marian", "pegasus", "t5")

# positions the table covers at first; it doubles when a forward reaches past them, up to the largest, beyond which
# the decoder builds its own (the table grows with the square of its length)
_INITIAL_POSITIONS = 128
_MAX_POSITIONS = 1024


class CausalMaskTable:
    """The causal mask of every `(query position, key position)` pair up to some length, in the format the
    verifier's decoder attention takes, sliced per verify forward.

    Every slice is a view of one tensor, shared by the forwards of a `generate()` call: attention code reads masks
    and does not write them.

    Args:
        verifier (`PreTrainedModel`): The encoder-decoder verifier; its family, its decoder's attention
            implementation and its dtype decide whether and in which format a mask is prepared.
    """

    def __init__(self, verifier: PreTrainedModel):
        decoder = verifier.get_decoder()
        self.config = decoder.config
        # the dtype transformers builds an eager mask in: its input embeddings'
        self.dtype = decoder.get_input_embeddings().weight.dtype
        implementation = getattr(self.config, "_attn_implementation", None)
        self.supported = (
            implementation in _TENSOR_MASK_IMPLEMENTATIONS
            and getattr(verifier.config, "model_type", None) in _PREPARED_MASK_MODEL_TYPES
            and getattr(self.config, "sliding_window", None) is None
        )
        self.table: torch.Tensor | None = None
        self.device: torch.device | None = None

    def mask(self, batch_size: int, cache_length: int, num_fed: int, device: torch.device) -> torch.Tensor | None:
        """The mask of a forward that feeds `num_fed` tokens on a cache of `cache_length`, or `None` where the decoder
        should build its own: a verifier without support (above), an empty cache or a single token fed (where SDPA
        skips the mask altogether), or more positions than the table may hold.

        Returns:
            `torch.Tensor` of shape `(batch_size, 1, num_fed, cache_length + num_fed)`: a view of the table.
        """
        length = cache_length + num_fed
        if not self.supported or cache_length == 0 or num_fed == 1 or length > _MAX_POSITIONS:
            return None
        device = torch.device(device)
        # keyed by the device asked for, not the table's own: `cuda` and `cuda:0` name one device
        reusable = self.table is not None and self.device == device
        if not reusable or self.table.shape[-1] < length:
            known = self.table.shape[-1] if reusable else 0
            positions = min(max(length, 2 * known, _INITIAL_POSITIONS), _MAX_POSITIONS)
            self.table, self.device = self._build(positions, device), device
        return self.table[:, :, cache_length:length, :length].expand(batch_size, -1, -1, -1)

    def _build(self, positions: int, device: torch.device) -> torch.Tensor:
        """The `(1, 1, positions, positions)` causal mask, by transformers' mask function for this implementation
        (the keyword arguments of `create_causal_mask`'s own call, the same since transformers 5.20)."""
        mask_function = ALL_MASK_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        return mask_function(
            batch_size=1,
            q_length=positions,
            kv_length=positions,
            mask_function=causal_mask_function,
            allow_is_causal_skip=False,
            dtype=self.dtype,
            config=self.config,
            device=device,
        )
