"""Opt-in CPU kernels for small-batch inference: linear layers on weights reordered once for oneDNN.

On CPU, PyTorch runs a float32 `nn.Linear` through the BLAS library it was built with (MKL in the x86 wheels) and a
bfloat16 one through oneDNN, which lays the weight out for its kernel on every call. Decoding feeds a handful of rows
at a time, where that matters: on the project's 2-core AMD EPYC, oneDNN on a weight reordered once ran the demo
verifier's float32 8,000 x 256 LM head over 5 rows in 76 us instead of 320 us, and the bfloat16 one in 52 us instead
of 96 us (`benchmarks/bench_prepacked_linear.py`); inside greedy decoding, where the weights are cache-cold, the
float32 head went from 0.54 to 0.16 ms per step. Intel's extension for PyTorch (`ipex.optimize`) and torch.compile's
CPU freezing pass prepack weights too; this module does only that, with oneDNN operators PyTorch ships
(`torch.ops.mkldnn`, private to PyTorch: resolved lazily and only where oneDNN is built in), for models run eagerly
by `generate()`.

`prepack_linear_layers(model)` is a call the user makes on their own model; nothing here changes a model otherwise.
It replaces each plain `nn.Linear` by a `PrepackedLinear` sharing the same parameters (state dict, saving, tied
weights unchanged). Results match `nn.Linear`'s up to summation order: in float32 about 1e-6 apart; in bfloat16 they
were bitwise equal on the project's CPU. Greedy decoding gains from it too, so compare it with speculative decoding on
models prepacked alike.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PrepackedLinear", "prepack_linear_layers"]


@functools.cache
def _prepacked_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN runs here: none without oneDNN; bfloat16 only on CPUs it supports (AVX512 and newer)."""
    if not torch.backends.mkldnn.is_available():
        return ()
    bfloat16 = (torch.bfloat16,) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ()
    return (torch.float32, *bfloat16)


class PrepackedLinear(nn.Linear):
    """An `nn.Linear` whose CPU inference uses a copy of its weight reordered once for oneDNN.

    Build one from an existing layer with `from_linear` (the parameters are then that layer's, the same objects), or
    as an `nn.Linear` with the same arguments. The packed copy is made on first use and made again when the weight is
    replaced (`.to()`, assigning a new parameter) or changed in place through autograd-visible operations
    (`copy_`, `load_state_dict`; tracked by the tensor's version counter). Changes made through `.data` are invisible
    to that counter: call `reset_packed()` after them. Training (gradients), autocast, `torch.compile` tracing, other
    devices and other dtypes run `nn.Linear`'s own computation. Not for concurrent calls from several threads (the
    packed copy is made lazily).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reset_packed()

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PrepackedLinear:
        """A `PrepackedLinear` sharing `linear`'s weight and bias (and its train/eval mode)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer.train(linear.training)

    def reset_packed(self) -> None:
        """Drop the packed copy; the next call makes a new one from the current weight."""
        self._packed: torch.Tensor | None = None
        # the weight the copy was made from (a detached alias: it keeps that storage alive, so a later weight cannot
        # reuse its address and pass for it) and that weight's version counter at the time
        self._packed_source: torch.Tensor | None = None
        self._packed_version = -1

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # runs for every linear of every decoding step: each parameter is read once (nn.Module's attribute lookup
        # of parameters is slow)
        weight, bias = self.weight, self.bias
        if (
            weight.dtype not in _prepacked_dtypes()
            or input.dtype != weight.dtype
            or weight.device.type != "cpu"
            or (bias is not None and bias.dtype != weight.dtype)
            or (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad))  # no oneDNN backward
            or torch.is_autocast_enabled("cpu")  # the oneDNN operator has no autocast rule
            or torch.compiler.is_compiling()  # nor fake-tensor support; inductor prepacks by itself
        ):
            return F.linear(input, weight, bias)
        return torch.ops.mkldnn._linear_pointwise.default(input, self._packed_weight(weight), bias, "none", [], "")

    def _packed_weight(self, weight: torch.Tensor) -> torch.Tensor:
        source = self._packed_source
        if (
            source is None
            or source.data_ptr() != weight.data_ptr()
            or source.dtype != weight.dtype
            or self._packed_version != weight._version
        ):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self._packed_source = weight.detach()
            self._packed_version = weight._version
        return self._packed

    def _apply(self, fn, recurse=True):
        # `.to()`, `.cuda()`, `.half()`, ...: the packed copy belongs to the old weight (and may hold its memory)
        self.reset_packed()
        return super()._apply(fn, recurse)

    def __getstate__(self):
        # pickling / deepcopy: the packed copy is an opaque oneDNN tensor (no storage); the copy repacks on first use
        state = self.__dict__.copy()
        state.update(_packed=None, _packed_source=None, _packed_version=-1)
        return state

    def extra_repr(self) -> str:
        return super().extra_repr() + ", prepacked for oneDNN"


def prepack_linear_layers(model: nn.Module) -> nn.Module:
    """Replace every plain `nn.Linear` of `model` by a `PrepackedLinear` for faster small-batch CPU inference.

    For models run on CPU in float32 or bfloat16 (the verifier and the drafter alike). Parameters are shared, so the
    state dict, `save_pretrained` and tied weights are unchanged; the packed copies add one weight's worth of memory
    per layer. Layers that carry forward hooks or an accelerate hook (`_hf_hook`), subclasses of `nn.Linear` and
    layers whose weight is not a plain `nn.Parameter` (e.g. quantized tensor subclasses) are left as they are. A
    layer registered under several names is replaced by one `PrepackedLinear`. Calling it twice is harmless.

    Args:
        model (`nn.Module`): E.g. a transformers `PreTrainedModel` or a `SpecDrafterModel`, on CPU.

    Returns:
        The same `model`, for chaining.

    Raises:
        RuntimeError: when this PyTorch build has no oneDNN (`torch.backends.mkldnn.is_available()` is false).
        ValueError: when a linear layer's weight is not on the CPU (e.g. on a GPU, or offloaded to `meta`).
    """
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError(
            "prepack_linear_layers needs a PyTorch build with oneDNN (torch.backends.mkldnn.is_available() is "
            "False here): run the model as it is."
        )
    replacements: dict[int, PrepackedLinear] = {}
    # every name a layer is registered under (named_modules would yield a shared layer once)
    for path, child in list(model.named_modules(remove_duplicate=False)):
        if not _replaceable(child):
            continue
        if not path:
            raise ValueError(
                "prepack_linear_layers replaces the layers inside a model; `model` is itself an nn.Linear: use "
                "`PrepackedLinear.from_linear(layer)`."
            )
        if child.weight.device.type != "cpu":
            raise ValueError(
                f"prepack_linear_layers is for CPU inference, but `{path}` has its weight on "
                f"{child.weight.device}: move the model to the CPU first, or run it as it is."
            )
        if id(child) not in replacements:
            replacements[id(child)] = PrepackedLinear.from_linear(child)
        parent_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent_path), name, replacements[id(child)])
    return model


def _replaceable(module: nn.Module) -> bool:
    """A plain `nn.Linear` whose computation is exactly `F.linear` on plain parameters, with nothing attached."""
    if type(module) is not nn.Linear:
        return False  # PrepackedLinear itself, and subclasses that may compute something else
    if module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook"):
        return False  # hooks and accelerate's dispatch would be lost with the module
    if "forward" in module.__dict__:
        return False  # an instance-level forward (e.g. set by accelerate) would be lost too
    parameters = [module.weight] + ([] if module.bias is None else [module.bias])
    return all(type(parameter) is nn.Parameter for parameter in parameters)
