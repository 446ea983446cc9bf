"""Opt-in CPU kernels for small-batch inference: linear layers on weights reordered once for oneDNN.

On CPU, PyTorch runs a float32 `nn.Linear` through the BLAS library it was built with (MKL in the x86 wheels) and a
bfloat16 one through oneDNN, which lays the weight out for its kernel on every call. Decoding feeds a handful of rows
at a time, where that matters: on the project's 2-core AMD EPYC, oneDNN on a weight reordered once ran the demo
verifier's float32 8,000 x 256 LM head over 5 rows in 76 us instead of 320 us, and the bfloat16 one in 52 us instead
of 96 us (`benchmarks/bench_prepacked_linear.py`); inside greedy decoding, where the weights are cache-cold, the
float32 head went from 0.54 to 0.16 ms per step. Intel's extension for PyTorch (`ipex.optimize`) and torch.compile's
CPU freezing pass prepack weights the same way; this module does only that, with the oneDNN operators PyTorch ships
(`torch.ops.mkldnn`), for models run eagerly by `generate()`.

`prepack_linear_layers(model)` is a call the user makes on their own model; nothing here changes a model otherwise.
It replaces each `nn.Linear` by a `PrepackedLinear` sharing the same parameters (state dict, saving, tied weights
unchanged). In bfloat16 the result is bitwise that of `nn.Linear` (the same oneDNN kernel); in float32 it sums in
another order (differences of about 1e-6). Greedy decoding gains from it as much as speculative decoding does, so
compare the two on models prepacked alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PrepackedLinear", "prepack_linear_layers"]

# bfloat16 only where oneDNN has kernels for it on this CPU (AVX512 and newer): elsewhere nn.Linear's own path
_PREPACKED_DTYPES = (torch.float32,) + ((torch.bfloat16,) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ())


class PrepackedLinear(nn.Linear):
    """An `nn.Linear` whose CPU inference uses a copy of its weight reordered once for oneDNN.

    The parameters are those of the linear it replaces (same objects). The packed copy is made on first use and
    made again whenever the weight changes (in place, e.g. by loading a state dict, or by `.to()`). Training (grad
    enabled on the weight or the input), other devices and other dtypes use `nn.Linear`'s own computation.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight = linear.weight
        self.bias = linear.bias
        self._packed: torch.Tensor | None = None
        self._packed_from: tuple | None = None
        self._linear_pointwise = torch.ops.mkldnn._linear_pointwise.default  # resolved once, not per call

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PrepackedLinear:
        """A `PrepackedLinear` sharing `linear`'s weight and bias."""
        return cls(linear)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # runs for every linear of every decoding step: each parameter is read once (nn.Module's attribute lookup
        # of parameters is slow)
        weight, bias = self.weight, self.bias
        if (
            weight.dtype not in _PREPACKED_DTYPES
            or input.dtype != weight.dtype
            or weight.device.type != "cpu"
            or (bias is not None and bias.dtype != weight.dtype)
            or (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad))  # no oneDNN backward
        ):
            return F.linear(input, weight, bias)
        return self._linear_pointwise(input, self._packed_weight(weight), bias, "none", [], "")

    def _packed_weight(self, weight: torch.Tensor) -> torch.Tensor:
        # the version counter moves with every in-place change: a stale packed copy is never used
        source = (weight.data_ptr(), weight.dtype, weight._version)
        if self._packed_from != source:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self._packed_from = source
        return self._packed

    def extra_repr(self) -> str:
        return super().extra_repr() + ", prepacked for oneDNN"


def prepack_linear_layers(model: nn.Module) -> nn.Module:
    """Replace every `nn.Linear` of `model` by a `PrepackedLinear` for faster small-batch CPU inference.

    For models run on CPU in float32 or bfloat16 (the verifier and the drafter alike). Parameters are shared, so the
    state dict, `save_pretrained` and tied weights are unchanged; the packed copies add one weight's worth of memory
    per layer. Calling it twice is harmless. Compare speeds only between models that are both prepacked or both not:
    greedy `generate()` gains from it too.

    Args:
        model (`nn.Module`): E.g. a transformers `PreTrainedModel` or a `SpecDrafterModel`, on CPU.

    Returns:
        The same `model`, for chaining.

    Raises:
        RuntimeError: when this PyTorch build has no oneDNN (`torch.backends.mkldnn.is_available()` is false).
    """
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError(
            "prepack_linear_layers needs a PyTorch build with oneDNN (torch.backends.mkldnn.is_available() is "
            "False here): run the model as it is."
        )
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:  # subclasses may compute something else: left alone
                setattr(parent, name, PrepackedLinear.from_linear(child))
    return model
