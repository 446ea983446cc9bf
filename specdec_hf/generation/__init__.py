"""Speculative decoding inside transformers' ``generate()``: the `custom_generate` entry point (`api.py`), the
draft → verify → accept loop (`speculative_loop.py`) and drafting with a `SpecDrafterModel`
(`spec_drafter_adapter.py`)."""

from .api import enable_speculative_decoding, speculative_generate
from .outputs import SpeculativeGenerateOutput
from .spec_drafter_adapter import ReducedHeadProposal, SpecDrafterAdapter, SpecDrafterState, as_drafter
from .stats import SpeculativeDecodingStats

__all__ = [
    "ReducedHeadProposal",
    "SpecDrafterAdapter",
    "SpecDrafterState",
    "SpeculativeDecodingStats",
    "SpeculativeGenerateOutput",
    "as_drafter",
    "enable_speculative_decoding",
    "speculative_generate",
]
