"""specdec_hf: Speculative Decoding (Xia et al., 2023, arXiv 2203.16487) for Hugging Face encoder-decoder models.

`import specdec_hf` registers the Spec-Drafter with `AutoConfig` / `AutoModel`.
"""

from .acceptance import accept_drafts, count_accepted
from .drafting import Drafter, DraftProposal
from .generation import (
    SpeculativeDecodingStats,
    SpeculativeGenerateOutput,
    enable_speculative_decoding,
    speculative_generate,
)
from .models import SpecDrafterConfig, SpecDrafterModel, SpecDrafterOutput

__version__ = "0.1.0"

__all__ = [
    "DraftProposal",
    "Drafter",
    "SpecDrafterConfig",
    "SpecDrafterModel",
    "SpecDrafterOutput",
    "SpeculativeDecodingStats",
    "SpeculativeGenerateOutput",
    "accept_drafts",
    "count_accepted",
    "enable_speculative_decoding",
    "speculative_generate",
]
