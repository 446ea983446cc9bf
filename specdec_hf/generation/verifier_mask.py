"""The verifier decoder's causal self-attention mask for the loop's verify forwards, built once and sliced.

Left to itself, a decoder fed q tokens on a cache of C builds its `(batch, 1, q, C + q)` causal mask at every call
(`transformers.masking_utils.create_causal_mask`: a dozen small tensor operations and their Python). With one token
(greedy decoding) it skips the mask; a verify forward feeds k + 1 or more and cannot. The pattern depends only on
positions, so [`CausalMaskTable`] builds it once for many positions, with transformers' own mask function for the
verifier's attention implementation (a boolean mask for SDPA, an additive float mask for eager attention), and each
forward receives a slice of it as a prepared 4D mask, which `create_causal_mask` passes through as it is. The values
are those transformers would build, so the forward computes the same.
"""

from __future__ import annotations

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function

__all__ = ["CausalMaskTable"]

# the implementations whose mask functions return a plain 4D tensor that a decoder can take prepared (flash
# attention takes no 4D mask, flex attention a BlockMask): any other keeps building its own
_TENSOR_MASK_IMPLEMENTATIONS = ("sdpa", "eager")

# positions the table covers at first; it doubles when a forward reaches past them
_INITIAL_POSITIONS = 128


class CausalMaskTable:
    """The causal mask of every `(query position, key position)` pair up to some length, in the format the
    verifier's decoder attention takes, sliced per verify forward.

    Args:
        verifier (`PreTrainedModel`): The encoder-decoder verifier; its decoder's attention implementation and dtype
            decide the mask's format.
    """

    def __init__(self, verifier):
        self.config = verifier.get_decoder().config
        self.table: torch.Tensor | None = None

    @property
    def supported(self) -> bool:
        """Whether this verifier's attention takes a prepared 4D mask (SDPA and eager attention, without a sliding
        window)."""
        implementation = getattr(self.config, "_attn_implementation", None)
        return implementation in _TENSOR_MASK_IMPLEMENTATIONS and getattr(self.config, "sliding_window", None) is None

    def mask(
        self, batch_size: int, cache_length: int, num_fed: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        """The mask of a forward that feeds `num_fed` tokens on a cache of `cache_length`, or `None` where the decoder
        should build its own (an unsupported attention implementation, or an empty cache, where it may skip the mask
        altogether).

        Returns:
            `torch.Tensor` of shape `(batch_size, 1, num_fed, cache_length + num_fed)`: a view of the table.
        """
        if cache_length == 0 or not self.supported:
            return None
        length = cache_length + num_fed
        table = self.table
        stale = table is not None and (table.dtype != _mask_dtype(self.config, dtype) or table.device != device)
        if table is None or stale or table.shape[-1] < length:
            known = 0 if table is None or stale else table.shape[-1]
            table = self.table = self._build(max(length, 2 * known, _INITIAL_POSITIONS), dtype, device)
        return table[:, :, cache_length:length, :length].expand(batch_size, -1, -1, -1)

    def _build(self, positions: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The `(1, 1, positions, positions)` causal mask, by transformers' mask function for this implementation."""
        mask_function = ALL_MASK_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        return mask_function(
            batch_size=1,
            q_length=positions,
            kv_length=positions,
            mask_function=causal_mask_function,
            allow_is_causal_skip=False,
            dtype=dtype,
            config=self.config,
            device=device,
        )


def _mask_dtype(config, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the mask transformers builds: boolean for SDPA, the model's dtype for eager attention."""
    return torch.bool if config._attn_implementation == "sdpa" else dtype
