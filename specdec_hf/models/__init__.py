"""The Spec-Drafter model (Xia et al., 2023, arXiv 2203.16487), registered with transformers' Auto classes.

Importing this package registers `model_type="spec_drafter"`, so that `AutoConfig.from_pretrained(path)` and
`AutoModel.from_pretrained(path)` load a saved drafter. Nothing here depends on the decoding loop: drafting with the
model lives in `specdec_hf.generation`.
"""

from transformers import AutoConfig, AutoModel

from .configuration_spec_drafter import SpecDrafterConfig
from .modeling_spec_drafter import SpecDrafterModel, SpecDrafterOutput

AutoConfig.register(SpecDrafterConfig.model_type, SpecDrafterConfig, exist_ok=True)
AutoModel.register(SpecDrafterConfig, SpecDrafterModel, exist_ok=True)

__all__ = ["SpecDrafterConfig", "SpecDrafterModel", "SpecDrafterOutput"]
