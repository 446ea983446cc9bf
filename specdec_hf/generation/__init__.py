"""Speculative decoding inside transformers' ``generate()``."""

from .api import enable_speculative_decoding, speculative_generate
from .outputs import SpeculativeGenerateOutput
from .stats import SpeculativeDecodingStats

__all__ = [
    "SpeculativeDecodingStats",
    "SpeculativeGenerateOutput",
    "enable_speculative_decoding",
    "speculative_generate",
]
