"""Opt-in CPU kernels for small-batch inference: linear layers on weights reordered once for oneDNN.

On CPU, PyTorch runs a float32 `nn.Linear` through the BLAS library it was built with (MKL in the x86 wheels) and a
bfloat16 one through oneDNN, which lays the weight out for its kernel on every call. Decoding feeds a handful of rows
at a time, where that matters: on a weight reordered once, oneDNN's cost can barely grow from one row to the k + 1
rows of a verification, where the BLAS kernel's grows with the rows. Whether it pays depends on the CPU: on some,
each oneDNN call carries a fixed cost that makes small layers slower than PyTorch's own kernel, and prepacking every
layer slows greedy decoding (`benchmarks/bench_prepacked_linear.py`; figures in docs/RESULTS.md).
`prepack_where_faster` (linear_kernel_selection.py) keeps only the layers and row counts where it is measured faster.

A second packed kernel serves float32 layers whose weights are float16 values (a checkpoint shipped in float16 and
loaded in float32, as the demo pair is): FBGEMM's float16 GEMM (`torch.ops.quantized.linear_dynamic_fp16`, the kernel
of `torch.ao.quantization.quantize_dynamic(..., dtype=torch.float16)`) reads the weight packed in float16, half the
bytes, and multiplies in float32, so its results match `nn.Linear`'s up to summation order, as oneDNN's do. It is
chosen per layer (`PrepackedLinear.kernel`) by `prepack_where_faster` where measured faster; a weight that is not
exactly float16 values never takes it.
Intel's extension for PyTorch (`ipex.optimize`) and torch.compile's CPU freezing pass prepack weights too; this
module does only that, with oneDNN operators PyTorch ships (`torch.ops.mkldnn`, private to PyTorch: resolved lazily
and only where oneDNN is built in), for models run eagerly by `generate()`.

Those operators exist for Inductor and carry no compatibility promise, so they are looked up and tried once, on a
tiny layer, before any layer uses them (`_onednn_operators`): if one is missing, renamed or fails, or fails later on
a real layer, every layer runs `nn.Linear`'s own computation from then on, with one warning.

`prepack_linear_layers(model)` is a call the user makes on their own model; nothing here changes a model otherwise.
It turns each plain `nn.Linear` into a `PrepackedLinear` in place (its class only: parameters, hooks, state dict,
saving and tied weights unchanged). Results match `nn.Linear`'s up to summation order: in float32 about 1e-6 apart;
in bfloat16 they were bitwise equal on the project's CPU. It changes greedy decoding's speed too, so compare
speculative decoding with greedy decoding on models prepacked alike.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FP16_WEIGHTS", "KERNELS", "ONEDNN", "PrepackedLinear", "prepack_linear_layers"]


class _OneDNNOperators(NamedTuple):
    """The private operators the prepacked path calls, and the dtypes they run here (bfloat16 only on CPUs that
    support it: AVX512 and newer)."""

    reorder_linear_weight: Callable  # (weight, batch_size) -> packed weight
    linear_pointwise: Callable  # (input, packed weight, bias, attr, scalars, algorithm) -> output
    dtypes: tuple[torch.dtype, ...]


def _resolve_onednn_operators() -> _OneDNNOperators:
    """Look the operators up (an `AttributeError` or `RuntimeError` when this PyTorch lacks one)."""
    mkldnn = torch.ops.mkldnn
    bfloat16 = (torch.bfloat16,) if mkldnn._is_mkldnn_bf16_supported() else ()
    return _OneDNNOperators(
        mkldnn._reorder_linear_weight, mkldnn._linear_pointwise.default, (torch.float32, *bfloat16)
    )


# the probe's result: the operators, or None when they are not to be used; `_UNPROBED` until the first layer asks
_UNPROBED = object()
_operators: _OneDNNOperators | None | object = _UNPROBED


def _onednn_operators() -> _OneDNNOperators | None:
    """The operators, tried on first use on a tiny layer in every dtype they will serve; None without oneDNN, and
    (after one warning) when this PyTorch lacks one of them or one fails."""
    global _operators
    if _operators is _UNPROBED:
        _operators = _probe_onednn_operators()
    return _operators


def _probe_onednn_operators() -> _OneDNNOperators | None:
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        operators = _resolve_onednn_operators()
        generator = torch.Generator().manual_seed(0)
        for dtype in operators.dtypes:
            weight, bias, inputs = (torch.randn(shape, generator=generator).to(dtype) for shape in ((3, 4), 3, (2, 4)))
            packed = operators.reorder_linear_weight(weight, None)
            output = operators.linear_pointwise(inputs, packed, bias, "none", [], "")
            torch.testing.assert_close(output, F.linear(inputs, weight, bias), rtol=2e-2, atol=2e-2)
    except Exception as err:  # private operators may be renamed, removed or changed in any release
        _warn_fallback(err)
        return None
    return operators


class _Fp16WeightOperators(NamedTuple):
    """FBGEMM's float16-weight linear operators (public, those `quantize_dynamic` uses)."""

    prepack: Callable  # (float32 weight with float16 values, float32 bias or None) -> packed weight and bias
    linear: Callable  # (float32 input, packed) -> float32 output


_fp16_operators: _Fp16WeightOperators | None | object = _UNPROBED
# the quantized engines under which FBGEMM's packing runs
_FBGEMM_ENGINES = ("fbgemm", "x86")


def _fp16_weight_operators() -> _Fp16WeightOperators | None:
    """The FBGEMM operators, tried on first use on a tiny layer; None where FBGEMM is not built in or they fail."""
    global _fp16_operators
    if _fp16_operators is _UNPROBED:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            _fp16_operators = None
        elif torch.backends.quantized.engine not in _FBGEMM_ENGINES:
            return None  # the probe packs, which needs an FBGEMM engine: probed once one is set, not ruled out
        else:
            _fp16_operators = _probe_fp16_weight_operators()
    return _fp16_operators


def _probe_fp16_weight_operators() -> _Fp16WeightOperators | None:
    try:
        # the overloads' operators (`OpOverload.op`), not the overloads or their packets: the linear takes a packed
        # object (a TorchBind class), and such an overload's call looks for fake script objects among its arguments
        # (tracing, which never reaches these calls) on every call, about a microsecond of a small layer's ten
        # (`getattr`: a torch without the attribute keeps the overloads' calls, and the kernel)
        operators = _Fp16WeightOperators(
            *(
                getattr(overload, "op", overload)
                for overload in (
                    torch.ops.quantized.linear_prepack_fp16.default,
                    torch.ops.quantized.linear_dynamic_fp16.default,
                )
            )
        )
        generator = torch.Generator().manual_seed(0)
        weight, bias, inputs = (torch.randn(shape, generator=generator) for shape in ((3, 4), 3, (2, 4)))
        weight = weight.half().float()
        output = operators.linear(inputs, operators.prepack(weight, bias))
        torch.testing.assert_close(output, F.linear(inputs, weight, bias), rtol=1e-4, atol=1e-4)
    except Exception as err:  # an operator missing or failing in this build
        _warn_fallback(err, "FBGEMM's float16-weight operators")
        return None
    return operators


def _disable_after_failure(err: Exception) -> None:
    """A layer's call failed where the probe passed: warn once, and every layer takes `nn.Linear`'s path."""
    global _operators
    if _operators is not None:
        _warn_fallback(err)
    _operators = None


def _disable_fp16_weights_after_failure(err: Exception) -> None:
    """As `_disable_after_failure`, for the float16-weight kernel."""
    global _fp16_operators
    if _fp16_operators is not None:
        _warn_fallback(err, "FBGEMM's float16-weight operators")
    _fp16_operators = None


def _warn_fallback(err: Exception, operators: str = "PyTorch's private oneDNN operators") -> None:
    warnings.warn(
        f"PrepackedLinear: {operators} for prepacked linear layers are missing or failed here "
        f"({type(err).__name__}: {err}); the layers run nn.Linear's own computation instead (same results, without "
        "the speed-up).",
        RuntimeWarning,
        stacklevel=4,
    )


ONEDNN = "onednn"
FP16_WEIGHTS = "fp16_weights"
KERNELS = (ONEDNN, FP16_WEIGHTS)


class _PackedCall(NamedTuple):
    """The parameters a packed copy was made from, as the call that took it saw them, with the copy and its kernel:
    a later call on the same parameters checks only what can change between calls. Each parameter is kept as its
    object and `_tensor_state` (what an in-place change or a `.data` swap alters), the bias too (the float16 kernel
    packs it; oneDNN reads it at every call, and a new one must pass the full path's checks of its dtype and layout)."""

    weight: torch.Tensor
    weight_state: tuple
    bias: torch.Tensor | None
    bias_state: tuple | None
    packed: object
    kernel: str


def _tensor_state(tensor: torch.Tensor) -> tuple:
    """What tells a parameter's contents apart while it stays the same object: its version (in-place changes) and
    its address, dtype, shape and strides (a `.data` swap, which keeps the version)."""
    return tensor._version, tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride()


class PrepackedLinear(nn.Linear):
    """An `nn.Linear` whose CPU inference uses a copy of its weight packed once for a faster kernel.

    The kernel is the attribute `kernel`: `"onednn"` (the default: the weight reordered for oneDNN, float32 and
    bfloat16) or `"fp16_weights"` (FBGEMM's float16 GEMM, for float32 layers whose weight holds finite float16 values
    only, chosen by `prepack_where_faster`; a weight with any other value, a 1-D input, and a quantized engine other
    than FBGEMM's or x86 when the copy is to be made, run `nn.Linear`'s computation). Everything below holds for both
    kernels.

    `prepack_linear_layers` turns a model's `nn.Linear` layers into this class in place (same objects, parameters,
    hooks and attributes); `from_linear` builds a new one sharing a layer's parameters; the constructor is
    `nn.Linear`'s. The packed copy is made on first use and made again when the weight is replaced (`.to()`, a new
    parameter, a view of another shape or layout) or changed in place through autograd-visible operations (`copy_`,
    `load_state_dict`; tracked by the tensor's version counter; a tensor put in through `.data` is seen by its address,
    shape and strides). Changes made in place through `.data` (`weight.data.mul_(2)`) are invisible to that counter:
    call `reset_packed()` after them. Calls with fewer rows (input elements over `in_features`) than the
    attribute `min_rows` (1 by default; `prepack_where_faster` sets it higher where oneDNN pays only from more rows on),
    training (gradients for the weight, the bias or the input), autocast, `torch.compile` tracing,
    `torch.backends.mkldnn.enabled = False`, inference-mode weights, empty layers, other devices, other dtypes and a
    PyTorch whose oneDNN operators are missing or fail run `nn.Linear`'s own computation. Not supported:
    forward-mode AD through it (tangents are dropped under `no_grad`), `torch.fx.symbolic_trace` (not a leaf
    module), and concurrent calls from several threads (the packed copy is made lazily).
    """

    # calls with fewer rows take nn.Linear's kernel (a class default too, for layers pickled before it existed)
    min_rows: int = 1
    _kernel: str = ONEDNN
    _packed_call: _PackedCall | None = None  # also a class default: layers pickled before it existed

    @property
    def kernel(self) -> str:
        """The packed kernel: `"onednn"` or `"fp16_weights"` (any other value is refused when set)."""
        return self._kernel

    @kernel.setter
    def kernel(self, value: str) -> None:
        if value not in KERNELS:
            # an unknown name would otherwise run the oneDNN path without a word
            raise ValueError(f"`kernel` must be one of {list(KERNELS)}, got {value!r}.")
        self._kernel = value

    def __setstate__(self, state: dict) -> None:
        # layers pickled when `kernel` was a plain attribute keep their choice
        kernel = state.pop("kernel", None)
        super().__setstate__(state)
        if kernel is not None:
            self.kernel = kernel

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reset_packed()

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PrepackedLinear:
        """A new `PrepackedLinear` sharing `linear`'s weight and bias (and its train/eval mode)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer.train(linear.training)

    def to_linear(self) -> None:
        """Turn this layer back into the plain `nn.Linear` it was, in place: same object, parameters and hooks; its
        packed copy, `min_rows` and `kernel` dropped."""
        for name in ("_packed", "_packed_source", "_packed_key", "_packed_call", "min_rows", "_kernel"):
            self.__dict__.pop(name, None)
        self.__class__ = nn.Linear

    def reset_packed(self) -> None:
        """Drop the packed copy; the next call makes a new one from the current weight."""
        self._packed: torch.Tensor | None = None
        # the weight the copy was made from (a detached alias: it keeps that storage alive, so a later weight cannot
        # reuse its address and pass for it), and what identifies that weight's contents
        self._packed_source: torch.Tensor | None = None
        self._packed_key: tuple | None = None
        self._packed_call: _PackedCall | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # first: nothing below can be traced; inductor prepacks by itself
            return F.linear(input, self.weight, self.bias)
        call = self._packed_call
        if call is not None and not torch.is_grad_enabled():
            output = self._packed_call_forward(input, call)
            if output is not None:
                return output
        # runs for every linear of every decoding step: each parameter is read once (nn.Module's attribute lookup
        # of parameters is slow)
        weight, bias = self.weight, self.bias
        if self._kernel == FP16_WEIGHTS:  # not the property: this runs for every linear of every step
            return self._fp16_weights_forward(input, weight, bias)
        operators = _onednn_operators()
        if (
            operators is None
            or input.numel() < self.min_rows * self.in_features  # below the rows from which oneDNN pays
            or not self._takes_prepacked_path(input, weight, bias, operators.dtypes)
        ):
            return F.linear(input, weight, bias)
        try:
            packed = self._packed_weight(weight, operators)
            output = operators.linear_pointwise(input, packed, bias, "none", [], "")
            self._remember_packed_call(weight, bias, packed)
            return output
        except RuntimeError as err:
            output = F.linear(input, weight, bias)  # a bad input raises here, as it does in nn.Linear
            _disable_after_failure(err)  # the input was fine: the operator is at fault
            return output

    def _packed_call_forward(self, input: torch.Tensor, call: _PackedCall) -> torch.Tensor | None:
        """The output on the packed copy when this call may take it as the call that made `call` did, else None.

        Runs for every linear of every decoding step (each check costs a share of a small layer's call), so it
        checks only what can change between calls without gradients: the parameters (`_tensor_state`: what a new
        parameter, `.to()`, an in-place change or a `.data` swap alters), the kernel and its operators, the input's
        dtype and rows (and its rank for the float16 kernel), autocast and `torch.backends.mkldnn.enabled`. What the
        packing call checked of the parameters (dtype, device, inference tensors, float16 values) holds while they
        are unchanged; the quantized engine matters to FBGEMM's packing only (`_packed_fp16_weight`), not to its
        packed copy.
        """
        # unpacked once: a named field's lookup costs about what one of the checks below does
        packed_weight, weight_state, packed_bias, bias_state, packed, kernel = call
        parameters = self._parameters  # not `self.weight`: nn.Module's attribute lookup of parameters is slow
        weight, bias = parameters.get("weight"), parameters.get("bias")
        if (
            weight is not packed_weight
            or bias is not packed_bias
            or _tensor_state(weight) != weight_state
            or (bias is not None and _tensor_state(bias) != bias_state)
            or kernel != self._kernel
            or input.dtype != weight.dtype
            or input.numel() < self.min_rows * self.in_features
            or torch.is_autocast_enabled("cpu")
            or not torch.backends.mkldnn.enabled
        ):
            return None
        try:
            if kernel == FP16_WEIGHTS:
                operators = _fp16_operators
                if operators is None or operators is _UNPROBED or input.dim() < 2:
                    return None
                return operators.linear(input, packed)
            operators = _operators
            if operators is None or operators is _UNPROBED:
                return None
            return operators.linear_pointwise(input, packed, bias, "none", [], "")
        except RuntimeError:
            return None  # the full path runs the call again: a bad input raises there, a failing operator is reported

    def _remember_packed_call(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: object) -> None:
        """Keep what the packed path just ran with, for `_packed_call_forward` (the copy's source, kept alive by
        `_packed_source` until the copy is made again, which drops this record: no other tensor can take its
        address meanwhile)."""
        self._packed_call = _PackedCall(
            weight, _tensor_state(weight), bias, None if bias is None else _tensor_state(bias), packed, self._kernel
        )

    def _fp16_weights_forward(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        operators = _fp16_weight_operators()
        if (
            operators is None
            or input.dim() < 2  # the operator takes (rows, features) and more; nn.Linear also takes a vector
            or input.numel() < self.min_rows * self.in_features
            or (bias is not None and bias.is_inference())  # no version counter to key the packed copy on
            or not self._takes_prepacked_path(input, weight, bias, (torch.float32,))
        ):
            return F.linear(input, weight, bias)
        try:
            packed = self._packed_fp16_weight(weight, bias, operators)
            if packed is None:  # a weight value float16 cannot hold, or no FBGEMM engine to pack it
                return F.linear(input, weight, bias)
            output = operators.linear(input, packed)
            self._remember_packed_call(weight, bias, packed)
            return output
        except RuntimeError as err:
            output = F.linear(input, weight, bias)  # a bad input raises here, as it does in nn.Linear
            _disable_fp16_weights_after_failure(err)
            return output

    def fp16_weights_exact(self) -> bool:
        """Whether the `"fp16_weights"` kernel computes this layer as `nn.Linear` does (up to summation order):
        float32 parameters on the CPU, every weight value a finite float16 value, FBGEMM's operators here."""
        weight, bias = self.weight, self.bias
        if _fp16_weight_operators() is None or weight.dtype != torch.float32 or weight.device.type != "cpu":
            return False
        if weight.numel() == 0 or (bias is not None and bias.dtype != torch.float32):
            return False
        with torch.no_grad():
            # ±inf survives the round trip but FBGEMM saturates it to ±65504
            return bool(torch.equal(weight.to(torch.float16).to(torch.float32), weight) and weight.isfinite().all())

    def _packed_fp16_weight(
        self, weight: torch.Tensor, bias: torch.Tensor | None, operators: _Fp16WeightOperators
    ) -> torch.Tensor | None:
        key = (FP16_WEIGHTS, _tensor_state(weight), None if bias is None else _tensor_state(bias))
        if self._packed_key != key:
            if torch.backends.quantized.engine not in _FBGEMM_ENGINES:
                return None  # the packing needs an FBGEMM engine (a packed copy runs under any): not packed yet
            self._packed_call = None  # the record's source is about to be let go: its address may be reused
            # copies: the packing may write to the tensors it is given (it saturates out-of-range weights in place)
            self._packed = (
                operators.prepack(weight.detach().clone(), None if bias is None else bias.detach().clone())
                if self.fp16_weights_exact()
                else None
            )
            self._packed_source = (weight.detach(), None if bias is None else bias.detach())
            self._packed_key = key
        return self._packed

    @staticmethod
    def _takes_prepacked_path(
        input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtypes: tuple[torch.dtype, ...]
    ) -> bool:
        if weight.dtype not in dtypes or input.dtype != weight.dtype:
            return False
        if weight.device.type != "cpu" or weight.is_inference() or weight.numel() == 0:
            return False  # inference tensors have no version counter to key the copy on; oneDNN rejects empty ones
        # oneDNN reads the bias as `out_features` contiguous values: a broadcast or strided one is not
        if bias is not None and (
            bias.dtype != weight.dtype or bias.shape != weight.shape[:1] or not bias.is_contiguous()
        ):
            return False
        if torch.is_grad_enabled() and (
            weight.requires_grad or input.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return False  # the oneDNN operator has no backward
        return not torch.is_autocast_enabled("cpu") and torch.backends.mkldnn.enabled  # no autocast rule either

    def _packed_weight(self, weight: torch.Tensor, operators: _OneDNNOperators) -> torch.Tensor:
        key = (ONEDNN, _tensor_state(weight))
        if self._packed_key != key:
            self._packed_call = None  # the record's source is about to be let go: its address may be reused
            self._packed = operators.reorder_linear_weight(weight.detach(), None)
            self._packed_source = weight.detach()
            self._packed_key = key
        return self._packed

    def _apply(self, fn, recurse=True):
        # `.to()`, `.cuda()`, `.half()`, ...: the packed copy belongs to the old weight (and would hold its memory)
        self.reset_packed()
        return super()._apply(fn, recurse)

    def __getstate__(self):
        # pickling / deepcopy: the packed copy is an opaque oneDNN tensor (no storage); the copy repacks on first use
        state = self.__dict__.copy()
        state.update(_packed=None, _packed_source=None, _packed_key=None, _packed_call=None)
        return state

    def extra_repr(self) -> str:
        return super().extra_repr() + (
            ", float16 weights (FBGEMM) where exact" if self.kernel == FP16_WEIGHTS else ", prepacked for oneDNN"
        )


def prepack_linear_layers(model: nn.Module) -> nn.Module:
    """Turn every plain `nn.Linear` of `model` into a `PrepackedLinear`, in place, for small-batch CPU inference.

    For models run on CPU in float32 or bfloat16 (the verifier and the drafter alike). Each layer keeps its identity:
    only its class changes (as `torch.nn.utils.parametrize` does), so parameters, hooks, attributes, shared layers,
    the state dict, `save_pretrained` and tied weights are unchanged; the packed copies add one weight's worth of
    memory per layer. Layers managed by accelerate (`_hf_hook`, an instance-level `forward`), subclasses of
    `nn.Linear` (parametrized layers included) and layers whose weight is not a plain `nn.Parameter` (e.g. quantized
    tensor subclasses) are left as they are. Calling it twice is harmless.

    Args:
        model (`nn.Module`): E.g. a transformers `PreTrainedModel` or a `SpecDrafterModel`, on CPU.

    Returns:
        The same `model`, for chaining.

    Warns:
        RuntimeWarning: once, when PyTorch's private oneDNN operators are missing here or fail: the layers then
            run `nn.Linear`'s own computation.

    Raises:
        RuntimeError: when this PyTorch build has no oneDNN (`torch.backends.mkldnn.is_available()` is false).
        ValueError: when a linear layer's weight is not on the CPU (e.g. on a GPU, or offloaded to `meta`); the model
            is then left unchanged.
    """
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError(
            "prepack_linear_layers needs a PyTorch build with oneDNN (torch.backends.mkldnn.is_available() is "
            "False here): run the model as it is."
        )
    _onednn_operators()  # probed now, so that a missing operator is reported at this call
    layers = [(name, module) for name, module in model.named_modules() if _replaceable(module)]
    for name, layer in layers:  # every layer checked before any is changed
        if layer.weight.device.type != "cpu":
            raise ValueError(
                f"prepack_linear_layers is for CPU inference, but `{name or type(model).__name__}` has its weight on "
                f"{layer.weight.device}: move the model to the CPU first, or run it as it is."
            )
    for _, layer in layers:
        layer.__class__ = PrepackedLinear
        layer.reset_packed()
    for module in model.modules():  # every row count on oneDNN, also where `prepack_where_faster` chose otherwise
        if type(module) is PrepackedLinear:
            module.min_rows = 1
            module.kernel = ONEDNN
    return model


def _replaceable(module: nn.Module) -> bool:
    """A plain `nn.Linear` computing exactly `F.linear` on plain parameters, not dispatched by accelerate."""
    if type(module) is not nn.Linear:
        return False  # PrepackedLinear itself, and subclasses that may compute something else
    if hasattr(module, "_hf_hook") or "forward" in module.__dict__:
        return False  # accelerate moves its weights per call (and calls the old forward)
    parameters = [module.weight] + ([] if module.bias is None else [module.bias])
    return all(type(parameter) is nn.Parameter for parameter in parameters)
