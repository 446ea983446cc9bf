"""Prepack a model's linear layers only where oneDNN is measured faster on this machine.

Whether a prepacked oneDNN call beats `nn.Linear`'s own kernel depends on the CPU, the layer's shape and the rows fed
at once: on one 2-core machine prepacking every layer made float32 greedy decoding of the demo verifier faster, on
another (an Intel Xeon with AMX, in a virtual machine) every oneDNN call carried a fixed cost several times that of
PyTorch's kernel for a small layer, and the same prepacking made greedy decoding slower
(`benchmarks/bench_prepacked_linear.py`; figures in docs/RESULTS.md). A speed-up measured against greedy decoding on
such models compares with a handicapped baseline. `prepack_where_faster` therefore times each distinct layer
signature both ways, alone and with its weight warm in the caches, at a few row counts (one row per greedy step,
k + 1 per verification, more with batches), and keeps it prepacked from the smallest measured row count from which
oneDNN wins at every larger measured count; calls with fewer rows take `nn.Linear`'s kernel (also at a smaller count
where oneDNN happened to win), calls with more rows than the last measured count follow its choice, and a signature
where oneDNN does not win at the last count goes back to `nn.Linear`. Float32 layers whose weights hold float16 values
only are measured on FBGEMM's float16-weight kernel as well (`PrepackedLinear.kernel`); of the packed kernels that
win, a signature keeps the one whose calls cost least over the measured row counts (`nn.Linear`'s below its rows).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .prepacked_linear import FP16_WEIGHTS, ONEDNN, PrepackedLinear, _onednn_operators, prepack_linear_layers

__all__ = ["DEFAULT_ROWS", "KernelChoice", "kernel_choices_to_json", "prepack_where_faster"]

# a greedy step, verifications of k = 1, 4 and 8, and batched calls (the rows of every call are batch x positions)
DEFAULT_ROWS = (1, 2, 5, 9, 16, 32)

# (layer, rows) -> (seconds per call of nn.Linear's kernel, seconds per call of the layer's packed `kernel`)
Measure = Callable[[PrepackedLinear, int], tuple[float, float]]


@dataclass(frozen=True)
class KernelChoice:
    """What `prepack_where_faster` chose for the layers of one signature.

    Attributes:
        in_features, out_features (`int`), bias (`bool`), dtype (`torch.dtype`): The signature.
        num_layers (`int`): How many of the model's layers have it.
        rows (`tuple[int]`): The row counts measured.
        plain_seconds, prepacked_seconds (`tuple[float]`): Seconds per call at each row count of `nn.Linear`'s
            kernel and of the chosen packed kernel (empty when nothing was measured: no packed kernel here for the
            layer's dtype, or a layer none would run).
        min_rows (`int` or `None`): Prepacked from this many rows on; `None`: the layers are `nn.Linear` again.
        kernel (`str` or `None`): The packed kernel (`"onednn"` or `"fp16_weights"`); `None` with `min_rows`.
    """

    in_features: int
    out_features: int
    bias: bool
    dtype: torch.dtype
    num_layers: int
    rows: tuple[int, ...]
    plain_seconds: tuple[float, ...]
    prepacked_seconds: tuple[float, ...]
    min_rows: int | None
    kernel: str | None = None

    def describe(self) -> str:
        """One line: the signature, the layer count and the choice."""
        if self.min_rows is not None:
            name = "float16 weights (FBGEMM)" if self.kernel == FP16_WEIGHTS else "prepacked for oneDNN"
            choice = f"{name} from {self.min_rows} row(s)"
        else:
            choice = "nn.Linear" + ("" if self.plain_seconds else " (not measured: no packed kernel for it here)")
        dtype = str(self.dtype).removeprefix("torch.")
        bias = "" if self.bias else ", no bias"
        return f"{self.in_features} -> {self.out_features} ({dtype}{bias}, {self.num_layers} layer(s)): {choice}"

    def to_dict(self) -> dict:
        """JSON-ready: the signature, the row counts, the microseconds per call both ways and the choice."""
        return {
            "in_features": self.in_features,
            "out_features": self.out_features,
            "bias": self.bias,
            "dtype": str(self.dtype).removeprefix("torch."),
            "num_layers": self.num_layers,
            "rows": list(self.rows),
            "plain_us": [round(seconds * 1e6, 2) for seconds in self.plain_seconds],
            "prepacked_us": [round(seconds * 1e6, 2) for seconds in self.prepacked_seconds],
            "min_rows": self.min_rows,
            "kernel": self.kernel,
        }


def kernel_choices_to_json(choices_by_model: dict[str, list[KernelChoice]]) -> dict[str, list[dict]]:
    """`{model name: [KernelChoice.to_dict(), ...]}`: the choices of several models, for a results file."""
    return {name: [choice.to_dict() for choice in choices] for name, choices in choices_by_model.items()}


def prepack_where_faster(
    model: nn.Module, rows: Sequence[int] = DEFAULT_ROWS, measure: Measure | None = None
) -> list[KernelChoice]:
    """Prepack `model`'s linear layers (`prepack_linear_layers`), then keep each signature on the packed kernel
    (oneDNN, or float16 weights where the weights are float16 values) measured faster than `nn.Linear` here, from
    the row count on where it wins.

    Call it after `torch.set_num_threads`, on the device and in the dtype the model will run in: the choice is made
    for them. A layer kept prepacked has its `kernel` and `min_rows` set (calls with fewer rows take `nn.Linear`'s
    kernel); a layer of a signature where no packed kernel wins becomes a plain `nn.Linear` again (same object,
    parameters and hooks). Of several kernels that win, the one with the smallest cost relative to `nn.Linear`,
    summed over the measured row counts, is kept.
    The choice rests on timings: two calls can choose differently where both kernels cost about the same. A later
    `prepack_linear_layers(model)` prepacks every layer again, at every row count.

    Args:
        model (`nn.Module`): On CPU, as for `prepack_linear_layers`.
        rows (`Sequence[int]`): Row counts to measure, increasing; calls with more rows than the last follow its
            choice.
        measure (`Callable`, *optional*): `(layer, rows) -> (plain seconds, packed seconds)` per call, called once
            per row count and packed kernel with the layer's `kernel` set to it; by default both are timed on a
            random input, under `torch.inference_mode`, in interleaved rounds (about 850 calls per signature and
            kernel: well under a second for the demo pair's layers, longer for large ones).

    Returns:
        `list[KernelChoice]`: one per signature, in the order the model's modules first show it.

    Raises:
        ValueError: when `rows` is empty, not increasing or holds a count below 1; and as `prepack_linear_layers`
            (a layer's weight off the CPU).
        RuntimeError: as `prepack_linear_layers`, when this PyTorch build has no oneDNN.
    """
    rows = tuple(rows)
    if not rows or any(count < 1 for count in rows) or list(rows) != sorted(set(rows)):
        raise ValueError(f"`rows` must be increasing row counts of at least 1, got {rows}")
    measure = measure or _time_both_kernels
    prepack_linear_layers(model)
    groups: dict[tuple, list[PrepackedLinear]] = {}
    for module in model.modules():
        if type(module) is PrepackedLinear:  # not subclasses, which may compute something else
            # layers of one shape whose weights are float16 values and layers whose are not choose apart
            key = (
                module.in_features,
                module.out_features,
                module.bias is not None,
                module.weight.dtype,
                module.fp16_weights_exact(),
            )
            groups.setdefault(key, []).append(module)
    # every signature decided before any layer changes: a measurement that raises leaves the model as prepacked
    decided = [(key, layers, *_measure_signature(layers[0], rows, measure)) for key, layers in groups.items()]
    choices = []
    for (in_features, out_features, bias, dtype, _), layers, plain, prepacked, min_rows, kernel in decided:
        for layer in layers:
            if min_rows is None:
                layer.to_linear()
            else:
                layer.min_rows, layer.kernel = min_rows, kernel
        choices.append(
            KernelChoice(in_features, out_features, bias, dtype, len(layers), rows, plain, prepacked, min_rows, kernel)
        )
    return choices


def _measure_signature(
    layer: PrepackedLinear, rows: tuple[int, ...], measure: Measure
) -> tuple[tuple[float, ...], tuple[float, ...], int | None, str | None]:
    """`nn.Linear`'s and the chosen packed kernel's seconds per call at each row count, the chosen `min_rows` and
    kernel; nothing measured (and `None`) where no packed kernel would run this layer, before or after the
    measurement. Each kernel that runs the layer is measured (oneDNN, then float16 weights); of those that win at
    the last count, the one costing least over the measured counts is chosen (oneDNN on a tie)."""
    measured = []
    try:
        with torch.inference_mode():  # as evaluate.py decodes
            for kernel in [kernel for kernel in (ONEDNN, FP16_WEIGHTS) if _runs(layer, kernel)]:
                layer.kernel = kernel
                seconds = [measure(layer, count) for count in rows]
                measured.append((kernel, tuple(s[0] for s in seconds), tuple(s[1] for s in seconds)))
            layer.kernel = ONEDNN
            # a kernel whose operator failed on a real call meanwhile runs no layer now
            measured = [entry for entry in measured if _runs(layer, entry[0])]
    finally:
        layer.kernel = ONEDNN
    if not measured:
        return (), (), None, None
    # one nn.Linear baseline for every kernel (each was timed beside it), so that their comparison shares it
    plain = tuple(min(entry[1][index] for entry in measured) for index in range(len(rows)))
    best = None
    for kernel, _, packed in measured:
        min_rows = _first_of_winning_tail(rows, plain, packed)
        if min_rows is None:
            continue
        # relative cost per row count, so that the largest counts (the slowest calls) do not outweigh the few-row
        # calls decoding makes most
        cost = sum(1.0 if count < min_rows else k / p for count, p, k in zip(rows, plain, packed, strict=True))
        if best is None or cost < best[0]:
            best = (cost, kernel, packed, min_rows)
    if best is None:  # no packed kernel wins: report the first measured
        return plain, measured[0][2], None, None
    _, kernel, packed, min_rows = best
    return plain, packed, min_rows, kernel


def _runs(layer: PrepackedLinear, kernel: str) -> bool:
    """Whether `kernel` would compute `layer` (on a one-row input of its dtype, without gradients)."""
    if kernel == FP16_WEIGHTS:
        return layer.fp16_weights_exact() and PrepackedLinear._takes_prepacked_path(
            torch.zeros(1, layer.in_features), layer.weight, layer.bias, (torch.float32,)
        )
    operators = _onednn_operators()
    sample = torch.zeros(1, layer.in_features, dtype=layer.weight.dtype)
    return operators is not None and layer._takes_prepacked_path(sample, layer.weight, layer.bias, operators.dtypes)


def _first_of_winning_tail(
    rows: tuple[int, ...], plain: tuple[float, ...], prepacked: tuple[float, ...]
) -> int | None:
    """The smallest row count from which the prepacked kernel is faster at every measured count; None if at none."""
    first = None
    for count, plain_seconds, prepacked_seconds in zip(
        reversed(rows), reversed(plain), reversed(prepacked), strict=True
    ):
        if not prepacked_seconds < plain_seconds:  # a NaN timing is no win
            break
        first = count
    return first


def _time_both_kernels(layer: PrepackedLinear, rows: int, rounds: int = 7, calls: int = 10) -> tuple[float, float]:
    """Median seconds per call of `nn.Linear`'s forward and the prepacked forward on a `(1, rows, in_features)`
    input, in `rounds` interleaved rounds of `calls` calls each (the order alternating per round)."""
    generator = torch.Generator().manual_seed(rows)
    inputs = torch.randn(1, rows, layer.in_features, generator=generator).to(layer.weight.dtype)
    kernels = (lambda: nn.Linear.forward(layer, inputs), lambda: PrepackedLinear.forward(layer, inputs))
    for kernel in kernels:  # the warm-up also packs the weight
        kernel()
    totals: tuple[list[float], list[float]] = ([], [])
    for round_index in range(rounds):
        order = (0, 1) if round_index % 2 == 0 else (1, 0)
        for which in order:
            start = time.perf_counter()
            for _ in range(calls):
                kernels[which]()
            totals[which].append((time.perf_counter() - start) / calls)
    return statistics.median(totals[0]), statistics.median(totals[1])
