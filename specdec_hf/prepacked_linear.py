"""Opt-in CPU kernels for small-batch inference: linear layers on weights reordered once for oneDNN.

On CPU, PyTorch runs a float32 `nn.Linear` through the BLAS library it was built with (MKL for the x86 wheels) and
a bfloat16 one through oneDNN, which reorders the weight into its blocked layout on every call. Decoding feeds a few
rows at a time, where both costs dominate: on a 2-core AMD EPYC (AVX512-BF16) a float32 8,000 x 256 LM head over 5
rows took 420 us and over 1 row 130 us, and oneDNN on a weight reordered once took 114 and 108 us; in bfloat16 the
reorder alone is about a third of every small linear (`benchmarks/bench_prepacked_linear.py`). Intel's extension for
PyTorch (`ipex.optimize`) and torch.compile's CPU freezing pass prepack weights the same way; this module does only
that, with the oneDNN operators PyTorch ships (`torch.ops.mkldnn`), for models run eagerly by `generate()`.

`prepack_linear_layers(model)` is a call the user makes on their own model; nothing here changes a model otherwise.
It replaces each `nn.Linear` by a `PrepackedLinear` sharing the same parameters (state dict, saving, tied weights
unchanged). In bfloat16 the result is bitwise that of `nn.Linear` (the same oneDNN kernel); in float32 it is a
different summation order (differences of about 1e-6), used only where it is faster: for calls of at least 2**19
multiply-adds (the LM head from 1 row, the feed-forward layers from 2, small attention projections hardly ever).
Compare greedy and speculative decoding on models prepacked alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PrepackedLinear", "prepack_linear_layers"]

# When oneDNN on a prepacked weight beats PyTorch's own kernel (benchmarks/bench_prepacked_linear.py, 2-core AMD
# EPYC): in bfloat16 always; in float32 once the layer's work, input rows (all dimensions but the last, multiplied)
# x in_features x out_features multiply-adds, reaches 2**19: so a 256 -> 256 layer is prepacked from 8 rows (where
# the two kernels tie), 256 -> 1024 from 2 rows, and an 8,000 x 256 LM head from 1 row (131 -> 69 us)
FLOAT32_MIN_WORK = 2**19


class PrepackedLinear(nn.Linear):
    """An `nn.Linear` whose CPU inference uses a copy of its weight reordered once for oneDNN.

    The parameters are those of the linear it replaces (same objects). The packed copy is made on first use and
    made again whenever the weight changes (in place, e.g. by loading a state dict, or by `.to()`). Training (grad
    enabled on the weight or the input), other devices and other dtypes use `nn.Linear`'s own computation.
    """

    def __init__(self, linear: nn.Linear, float32_min_work: int = FLOAT32_MIN_WORK):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight = linear.weight
        self.bias = linear.bias
        self._packed: torch.Tensor | None = None
        self._packed_from: tuple | None = None
        self._linear_pointwise = torch.ops.mkldnn._linear_pointwise.default  # resolved once, not per call
        # per dtype, the fewest input elements from which this layer takes the prepacked path
        self._min_input_numel = {torch.bfloat16: 1, torch.float32: max(1, -(-float32_min_work // self.out_features))}

    @classmethod
    def from_linear(cls, linear: nn.Linear, **thresholds) -> PrepackedLinear:
        """A `PrepackedLinear` sharing `linear`'s weight and bias (`thresholds`: see `prepack_linear_layers`)."""
        return cls(linear, **thresholds)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # runs for every linear of every decoding step: each parameter is read once (nn.Module's attribute lookup
        # of parameters is slow), and a small float32 layer's case is decided in two lookups
        weight, bias = self.weight, self.bias
        min_numel = self._min_input_numel.get(weight.dtype)
        if (
            min_numel is None
            or input.numel() < min_numel
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


def prepack_linear_layers(model: nn.Module, float32_min_work: int = FLOAT32_MIN_WORK) -> nn.Module:
    """Replace every `nn.Linear` of `model` by a `PrepackedLinear` for faster small-batch CPU inference.

    For models run on CPU in float32 or bfloat16 (the verifier and the drafter alike). Parameters are shared, so the
    state dict, `save_pretrained` and tied weights are unchanged; the packed copies add one weight's worth of memory
    per layer. Calling it twice is harmless. Compare speeds only between models that are both prepacked or both not:
    greedy `generate()` gains from it too.

    Args:
        model (`nn.Module`): E.g. a transformers `PreTrainedModel` or a `SpecDrafterModel`, on CPU.
        float32_min_work (`int`, *optional*, defaults to 2**19): In float32, a call takes the prepacked path when
            its input rows (all dimensions but the last, multiplied) x `in_features` x `out_features` reach this;
            smaller calls use PyTorch's own kernel. bfloat16 always takes it. The default was measured on one CPU
            (`benchmarks/bench_prepacked_linear.py` shows where the crossover lies on yours).

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
                setattr(
                    parent,
                    name,
                    PrepackedLinear.from_linear(child, float32_min_work=float32_min_work),
                )
    return model
