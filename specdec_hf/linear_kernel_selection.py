"""Prepack a model's linear layers only where oneDNN is measured faster on this machine.

Whether a prepacked oneDNN call beats `nn.Linear`'s own kernel depends on the CPU, the layer's shape and the rows fed
at once: on one 2-core machine prepacking every layer made float32 greedy decoding of the demo verifier faster, on
another (an Intel Xeon with AMX, in a virtual machine) every oneDNN call carried a fixed cost several times that of
PyTorch's kernel for a small layer, and the same prepacking made greedy decoding slower (`benchmarks/bench_prepacked_linear.py`; figures in
docs/RESULTS.md). A speed-up measured against greedy decoding on such models compares with a handicapped baseline.
`prepack_where_faster` therefore times each distinct layer signature both ways, at the row counts decoding feeds
(one row per greedy step, k + 1 per verification, more with batches), and keeps a layer prepacked only from the row
count on where oneDNN wins at that count and at every larger one measured; a signature where it never wins goes back
to `nn.Linear`. Greedy and speculative decoding then run on the faster kernel at every row count, each.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .prepacked_linear import PrepackedLinear, _onednn_operators, prepack_linear_layers

__all__ = ["DEFAULT_ROWS", "KernelChoice", "prepack_where_faster"]

# a greedy step, verifications of k = 1, 4 and 8, and batched calls (the rows of every call are batch x positions)
DEFAULT_ROWS = (1, 2, 5, 9, 16, 32)

# (layer, rows) -> (seconds per call of nn.Linear's kernel, seconds per call of the prepacked one)
Measure = Callable[[PrepackedLinear, int], tuple[float, float]]


@dataclass(frozen=True)
class KernelChoice:
    """What `prepack_where_faster` chose for the layers of one signature.

    Attributes:
        in_features, out_features (`int`), bias (`bool`), dtype (`torch.dtype`): The signature.
        layers (`int`): How many of the model's layers have it.
        rows (`tuple[int]`): The row counts measured.
        plain_seconds, prepacked_seconds (`tuple[float]`): Seconds per call at each row count (empty when nothing
            was measured: a dtype oneDNN does not serve here).
        min_rows (`int` or `None`): Prepacked from this many rows on; `None`: the layers are `nn.Linear` again.
    """

    in_features: int
    out_features: int
    bias: bool
    dtype: torch.dtype
    layers: int
    rows: tuple[int, ...]
    plain_seconds: tuple[float, ...]
    prepacked_seconds: tuple[float, ...]
    min_rows: int | None

    def describe(self) -> str:
        """One line: the signature, the layer count and the choice."""
        choice = "nn.Linear" if self.min_rows is None else f"prepacked from {self.min_rows} row(s)"
        return f"{self.in_features} -> {self.out_features} ({str(self.dtype).removeprefix('torch.')}, {self.layers} layers): {choice}"


def prepack_where_faster(
    model: nn.Module, rows: Sequence[int] = DEFAULT_ROWS, measure: Measure | None = None
) -> list[KernelChoice]:
    """Prepack `model`'s linear layers (`prepack_linear_layers`), then keep each signature prepacked only from the
    row count on where it is measured faster than `nn.Linear` here.

    Call it after `torch.set_num_threads`, on the device and in the dtype the model will run in: the choice is made
    for them. A layer kept prepacked has its `min_rows` set (calls with fewer rows take `nn.Linear`'s kernel); a
    layer of a signature that never wins becomes a plain `nn.Linear` again (same object, parameters and hooks).

    Args:
        model (`nn.Module`): On CPU, as for `prepack_linear_layers`.
        rows (`Sequence[int]`): Row counts to measure, increasing; calls with more rows than the last follow its
            choice.
        measure (`Callable`, *optional*): `(layer, rows) -> (plain seconds, prepacked seconds)` per call; by default
            both kernels are timed on a random input in interleaved rounds (a few milliseconds per signature).

    Returns:
        `list[KernelChoice]`: one per signature, in the order the model's modules first show it.

    Raises:
        ValueError: when `rows` is empty, not increasing or holds a count below 1; and as `prepack_linear_layers`.
    """
    rows = tuple(rows)
    if not rows or any(count < 1 for count in rows) or list(rows) != sorted(set(rows)):
        raise ValueError(f"`rows` must be increasing row counts of at least 1, got {rows}")
    measure = measure or _time_both_kernels
    prepack_linear_layers(model)
    operators = _onednn_operators()
    groups: dict[tuple, list[PrepackedLinear]] = {}
    for module in model.modules():
        if isinstance(module, PrepackedLinear):
            key = (module.in_features, module.out_features, module.bias is not None, module.weight.dtype)
            groups.setdefault(key, []).append(module)
    choices = []
    for (in_features, out_features, bias, dtype), layers in groups.items():
        plain, prepacked, min_rows = (), (), None
        if operators is not None and dtype in operators.dtypes:
            layers[0].min_rows = 1  # measured on every row count, also when a previous choice raised it
            with torch.no_grad():  # the prepacked path serves inference only
                seconds = [measure(layers[0], count) for count in rows]
            plain, prepacked = tuple(s[0] for s in seconds), tuple(s[1] for s in seconds)
            min_rows = _first_of_winning_tail(rows, plain, prepacked)
        for layer in layers:
            if min_rows is None:
                _to_plain_linear(layer)
            else:
                layer.min_rows = min_rows
        choices.append(
            KernelChoice(in_features, out_features, bias, dtype, len(layers), rows, plain, prepacked, min_rows)
        )
    return choices


def _first_of_winning_tail(
    rows: tuple[int, ...], plain: tuple[float, ...], prepacked: tuple[float, ...]
) -> int | None:
    """The smallest row count from which the prepacked kernel is faster at every measured count; None if at none."""
    first = None
    for count, plain_seconds, prepacked_seconds in zip(
        reversed(rows), reversed(plain), reversed(prepacked), strict=True
    ):
        if prepacked_seconds >= plain_seconds:
            break
        first = count
    return first


def _to_plain_linear(layer: PrepackedLinear) -> None:
    """Turn a `PrepackedLinear` back into the `nn.Linear` it was (its packed copy and attributes dropped)."""
    layer.reset_packed()
    for name in ("_packed", "_packed_source", "_packed_key", "min_rows"):
        layer.__dict__.pop(name, None)
    layer.__class__ = nn.Linear


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
