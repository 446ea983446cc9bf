"""What speculative ``generate()`` returns with ``return_dict_in_generate=True``."""

from __future__ import annotations

from dataclasses import dataclass

from transformers.generation.utils import GenerateEncoderDecoderOutput

from .stats import SpeculativeDecodingStats

__all__ = ["SpeculativeGenerateOutput"]


@dataclass
class SpeculativeGenerateOutput(GenerateEncoderDecoderOutput):
    """[`~transformers.generation.GenerateEncoderDecoderOutput`] plus the speculative decoding statistics.

    Args:
        speculative_stats (`SpeculativeDecodingStats`):
            Verifier passes, drafted / accepted counts and tokens per iteration, per row and in total.

    The other fields are those of `GenerateEncoderDecoderOutput`. `scores` / `logits` hold, for every generated
    position, the verifier's processed scores / raw logits for that position (rows that already finished get zeros,
    where plain `generate()` would hold scores for the padding it appends).
    """

    speculative_stats: SpeculativeDecodingStats | None = None
