"""specdec_hf: Speculative Decoding (Xia et al., 2023, arXiv 2203.16487) for Hugging Face encoder-decoder models.

`import specdec_hf` registers the Spec-Drafter with `AutoConfig` / `AutoModel`.
"""

from .acceptance import accept_drafts, count_accepted
from .drafters import NgramStoreDrafter, SourceCopyDrafter
from .drafting import Drafter, DraftProposal
from .generation import (
    SpecDrafterAdapter,
    SpeculativeDecodingStats,
    SpeculativeGenerateOutput,
    enable_speculative_decoding,
    speculative_generate,
)
from .linear_kernel_selection import KernelChoice, prepack_where_faster
from .models import SpecDrafterConfig, SpecDrafterModel, SpecDrafterOutput
from .prepacked_linear import PrepackedLinear, prepack_linear_layers

__version__ = "0.1.0"

__all__ = [
    "DraftProposal",
    "Drafter",
    "KernelChoice",
    "NgramStoreDrafter",
    "PrepackedLinear",
    "SpecDrafterAdapter",
    "SpecDrafterConfig",
    "SpecDrafterModel",
    "SourceCopyDrafter",
    "SpecDrafterOutput",
    "SpeculativeDecodingStats",
    "SpeculativeGenerateOutput",
    "accept_drafts",
    "count_accepted",
    "enable_speculative_decoding",
    "prepack_linear_layers",
    "prepack_where_faster",
    "speculative_generate",
]
