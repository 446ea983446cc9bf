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

Timing a layer alone, warm in the caches, misses what the model's weights cost together: a verifier whose float32
decoder overflows the CPU's last-level cache but whose float16 copy fits it runs every layer faster on the float16
kernel, although each layer alone, warm, is faster on `nn.Linear`; a drafter called right after the verifier finds
its weights evicted. So the per-layer choice is then checked against the whole model, under two assignments of the
layers a decoding step runs (`_step_layers`: the decoder's and the output embeddings'): the per-layer choice, and
every signature among them that can take it on the float16 kernel from one row. A transformers encoder-decoder model
is timed on its own decoder forward of that many new tokens over a cache (as a greedy step or a verification runs
it); a model that runs between another's steps (`runs_after`: a drafter after its verifier) on a sweep of its step
layers right after a sweep of that model's. Both are interleaved at each row count, and the float16 assignment is
kept where its cost relative to the per-layer choice's, summed over the row counts, is below their number. A signature moved so moves all its layers,
those of an encoder that shares its shape too (they run once per call, on the source's rows, and are not timed).
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache

from .models import SpecDrafterModel
from .prepacked_linear import (
    FP16_WEIGHTS,
    ONEDNN,
    PrepackedLinear,
    _fp16_weight_operators,
    _onednn_operators,
    prepack_linear_layers,
)

__all__ = ["DEFAULT_ROWS", "KernelChoice", "kernel_choices_to_json", "prepack_where_faster"]

# a greedy step, verifications of k = 1, 4 and 8, and batched calls (the rows of every call are batch x positions)
DEFAULT_ROWS = (1, 2, 5, 9, 16, 32)

# (layer, rows) -> (seconds per call of nn.Linear's kernel, seconds per call of the layer's packed `kernel`)
Measure = Callable[[PrepackedLinear, int], tuple[float, float]]
# a layer's kernel and the rows from which it runs; (ONEDNN, _NEVER): nn.Linear's kernel at any row count
LayerSetting = tuple[str, int]
# (the model's step layers in module order, rows, assignments: one setting per layer each) -> seconds of a step
# (a decoder forward or a sweep of the layers) under each assignment
SweepMeasure = Callable[[list[PrepackedLinear], int, Sequence[list[LayerSetting]]], list[float]]

_NEVER = sys.maxsize


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
        chosen_by (`str`): `"layer"` (the signature's layers timed alone) or `"whole model"` (the float16 kernel kept
            because the model's decoding steps, or its step layers after its partner's, ran faster with it).
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
    chosen_by: str = "layer"

    def describe(self) -> str:
        """One line: the signature, the layer count and the choice."""
        if self.min_rows is not None:
            name = "float16 weights (FBGEMM)" if self.kernel == FP16_WEIGHTS else "prepacked for oneDNN"
            choice = f"{name} from {self.min_rows} row(s)"
            if self.chosen_by != "layer":
                choice += f" (chosen by timing the {self.chosen_by})"
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
            "chosen_by": self.chosen_by,
        }


def kernel_choices_to_json(choices_by_model: dict[str, list[KernelChoice]]) -> dict[str, list[dict]]:
    """`{model name: [KernelChoice.to_dict(), ...]}`: the choices of several models, for a results file."""
    return {name: [choice.to_dict() for choice in choices] for name, choices in choices_by_model.items()}


def prepack_where_faster(
    model: nn.Module,
    rows: Sequence[int] = DEFAULT_ROWS,
    measure: Measure | None = None,
    measure_sweeps: SweepMeasure | None = None,
    runs_after: nn.Module | None = None,
) -> list[KernelChoice]:
    """Prepack `model`'s linear layers (`prepack_linear_layers`), then keep each signature on the packed kernel
    (oneDNN, or float16 weights where the weights are float16 values) measured faster than `nn.Linear` here, from
    the row count on where it wins; then, where some signatures of the layers a decoding step runs could take the
    float16 kernel, move them all to it from one row if the model's steps cost less so (the module docstring says
    how it is timed and why).

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
        measure_sweeps (`Callable`, *optional*): `(layers, rows, assignments) -> seconds under each assignment`, the
            step layers in module order and each assignment one `(kernel, min_rows)` per layer (it replaces the
            default timing, `runs_after` included). By default, a transformers encoder-decoder model without
            `runs_after` is timed on its own decoder forwards over a cache (7 rounds of 5 timed forwards per assignment
            and row count: about 2 to 4 s for the demo verifier at the default row counts, more for larger models),
            any other on sweeps of its step layers.
        runs_after (`nn.Module`, *optional*): The model whose steps alternate with this one's in decoding (for a
            drafter, its verifier, prepacked first): its step layers run before each timed sweep, as its forward
            runs before each drafter call, and leave in the caches what it does.

    Returns:
        `list[KernelChoice]`: one per signature, in the order the model's modules first show it.

    Raises:
        ValueError: when `rows` is empty, not increasing or holds a count below 1; and as `prepack_linear_layers`
            (a layer's weight off the CPU).
        RuntimeError: as `prepack_linear_layers`, when this PyTorch build has no oneDNN.

    A measurement that raises leaves every layer prepacked, on oneDNN, from one row (as `prepack_linear_layers`).
    """
    rows = tuple(rows)
    if not rows or any(count < 1 for count in rows) or list(rows) != sorted(set(rows)):
        raise ValueError(f"`rows` must be increasing row counts of at least 1, got {rows}")
    measure = measure or _time_both_kernels
    if measure_sweeps is None and runs_after is None and _runs_decoder_steps(model):
        measure_sweeps = functools.partial(_time_decoder_steps, model)
    elif measure_sweeps is None:
        partner_layers = None if runs_after is None else _step_layers(runs_after)
        measure_sweeps = functools.partial(_time_sweeps, partner_layers=partner_layers)
    prepack_linear_layers(model)
    groups: dict[tuple, list[PrepackedLinear]] = {}  # by signature, each in the model's module order
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
    decided = {key: _measure_signature(layers[0], rows, measure) for key, layers in groups.items()}
    swept = [module for module in _step_layers(model) if type(module) is PrepackedLinear]
    whole_model = _fp16_everywhere_if_faster(swept, groups, decided, rows, measure_sweeps)
    choices = []
    for key, layers in groups.items():
        in_features, out_features, bias, dtype, _ = key
        plain, prepacked, min_rows, kernel, _ = decided[key]
        chosen_by = "layer"
        if key in whole_model:
            prepacked, min_rows, kernel, chosen_by = whole_model[key], 1, FP16_WEIGHTS, "whole model"
        for layer in layers:
            if min_rows is None:
                layer.to_linear()
            else:
                layer.min_rows, layer.kernel = min_rows, kernel
        choices.append(
            KernelChoice(
                in_features,
                out_features,
                bias,
                dtype,
                len(layers),
                rows,
                plain,
                prepacked,
                min_rows,
                kernel,
                chosen_by,
            )
        )
    return choices


def _fp16_everywhere_if_faster(
    swept: list[PrepackedLinear],
    groups: dict[tuple, list[PrepackedLinear]],
    decided: dict[tuple, tuple],
    rows: tuple[int, ...],
    measure_sweeps: SweepMeasure,
) -> dict[tuple, tuple[float, ...]]:
    """The signatures to move to the float16 kernel from one row, each with its per-layer seconds on it: those of the
    step layers that can take it, when the model's steps (decoder forwards or sweeps of the step layers) cost less
    under that assignment than under the per-signature choice (relative costs summed over `rows`, below their
    number); none when no signature would change."""
    key_of = {id(layer): key for key, group in groups.items() for layer in group}
    # only signatures a step runs: the sweep says nothing about the others
    stepping = {key_of[id(layer)] for layer in swept}
    movable = {
        key: fp16_seconds
        for key, (*_, min_rows, kernel, fp16_seconds) in decided.items()
        if key in stepping and fp16_seconds and (kernel, min_rows) != (FP16_WEIGHTS, 1)
    }
    if not movable:
        return {}
    chosen, everywhere = [], []
    for layer in swept:
        key = key_of[id(layer)]
        _, _, min_rows, kernel, _ = decided[key]
        setting = (ONEDNN, _NEVER) if min_rows is None else (kernel, min_rows)
        chosen.append(setting)
        everywhere.append((FP16_WEIGHTS, 1) if key in movable else setting)
    try:
        with torch.inference_mode():
            seconds = [measure_sweeps(swept, count, (chosen, everywhere)) for count in rows]
    finally:
        for layer in swept:  # as prepacked: the caller applies the choice
            layer.kernel, layer.min_rows = ONEDNN, 1
    if _fp16_weight_operators() is None:  # failed meanwhile, or the engine was switched: the sweeps ran nn.Linear
        return {}
    relative = sum(fp16 / per_layer for per_layer, fp16 in seconds)
    return movable if relative < len(rows) else {}


def _measure_signature(
    layer: PrepackedLinear, rows: tuple[int, ...], measure: Measure
) -> tuple[tuple[float, ...], tuple[float, ...], int | None, str | None, tuple[float, ...]]:
    """`nn.Linear`'s and the chosen packed kernel's seconds per call at each row count, the chosen `min_rows` and
    kernel, and the float16 kernel's seconds (empty where it does not run the layer); nothing measured (and `None`)
    where no packed kernel would run this layer, before or after the measurement. Each kernel that runs the layer is
    measured (oneDNN, then float16 weights); of those that win at the last count, the one costing least over the
    measured counts is chosen (oneDNN on a tie)."""
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
        return (), (), None, None, ()
    fp16_seconds = next((entry[2] for entry in measured if entry[0] == FP16_WEIGHTS), ())
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
        return plain, measured[0][2], None, None, fp16_seconds
    _, kernel, packed, min_rows = best
    return plain, packed, min_rows, kernel, fp16_seconds


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


def _step_layers(model: nn.Module) -> list[nn.Linear]:
    """The linear layers of `model`'s decoding steps, in module order: its decoder's and its output embeddings' where
    it has a decoder (`get_decoder()`), else every linear layer; for a [`SpecDrafterModel`], also its projection of
    the verifier's states (`feature_proj`), which every drafter call runs on the new prefix rows. Not exactly what a
    step runs: the encoder of an encoder-decoder model (once per `generate()` call) is left out, and the decoder's
    cross-attention key and value projections (once per call too, cached) are in."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if not isinstance(decoder, nn.Module) or decoder is model:
        return [module for module in model.modules() if isinstance(module, nn.Linear)]
    parts = [decoder]
    if isinstance(model, SpecDrafterModel) and model.feature_proj is not None:
        parts.insert(0, model.feature_proj)  # it runs before the decoder
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(output_embeddings, nn.Module):
        parts.append(output_embeddings)
    seen: set[int] = set()
    layers = []
    for part in parts:
        for module in part.modules():
            if isinstance(module, nn.Linear) and id(module) not in seen:
                seen.add(id(module))
                layers.append(module)
    return layers


def _time_sweeps(
    layers: list[PrepackedLinear],
    rows: int,
    assignments: Sequence[list[LayerSetting]],
    partner_layers: list[nn.Linear] | None = None,
    rounds: int = 7,
) -> list[float]:
    """Median seconds of one pass over `layers` (each on a `(1, rows, in_features)` input) under each assignment, in
    `rounds` interleaved rounds (the order rotating per round), each pass right after one over `partner_layers` (the
    layers of the model that runs between this one's steps) where given, else right after an untimed pass of its own
    (which also packs the weights of a kernel the assignment changed)."""
    generator = torch.Generator().manual_seed(rows)

    def inputs_of(modules: list[nn.Linear]) -> list[torch.Tensor]:
        return [
            torch.randn(1, rows, module.in_features, generator=generator).to(module.weight.dtype) for module in modules
        ]

    partner_layers = partner_layers or []
    inputs, partner_inputs = inputs_of(layers), inputs_of(partner_layers)

    def one_pass(modules: list[nn.Linear], features: list[torch.Tensor]) -> None:
        for module, batch in zip(modules, features, strict=True):
            type(module).forward(module, batch)  # without hooks, as the layers' own kernels alone

    def sweep(assignment: list[LayerSetting]) -> float:
        for layer, (kernel, min_rows) in zip(layers, assignment, strict=True):
            layer.kernel, layer.min_rows = kernel, min_rows
        one_pass(layers, inputs)  # packs a kernel's weights anew where the assignment changed it (one copy per layer)
        one_pass(partner_layers, partner_inputs)
        start = time.perf_counter()
        one_pass(layers, inputs)
        return time.perf_counter() - start

    return _interleaved_medians(sweep, assignments, rounds)


def _runs_decoder_steps(model: nn.Module) -> bool:
    """Whether `_time_decoder_steps` can time `model`: a transformers encoder-decoder language model reading token ids
    (its forward takes `encoder_outputs`, `decoder_input_ids` and a `cache`, as the speculative loop calls it); speech
    and vision encoders, which read no ids, are swept instead."""
    config = getattr(model, "config", None)
    return (
        bool(getattr(config, "is_encoder_decoder", False))
        and getattr(model, "main_input_name", None) == "input_ids"
        and callable(getattr(model, "get_encoder", None))
        and callable(getattr(model, "get_output_embeddings", None))
        and model.get_output_embeddings() is not None
    )


def _time_decoder_steps(
    model: nn.Module,
    layers: list[PrepackedLinear],
    rows: int,
    assignments: Sequence[list[LayerSetting]],
    rounds: int = 7,
    calls: int = 5,
) -> list[float]:
    """Median seconds of one decoder forward of `rows` new tokens over a cache of up to 16 (the model's own forward, LM
    head included, as a greedy step or a verification runs it) under each assignment of `layers`, on a random
    32-token source, in `rounds` interleaved rounds of `calls` forwards after an untimed one (the order rotating per
    round; the untimed forward packs the weights of a kernel the assignment changed)."""
    generator = torch.Generator().manual_seed(rows)
    device = next(model.parameters()).device

    def ids(embeddings: nn.Module, length: int) -> torch.LongTensor:
        size = embeddings.num_embeddings
        # ordinary pieces: low ids are often special tokens
        return torch.randint(min(4, size - 1), size, (1, length), generator=generator).to(device)

    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and rows >= max_positions:  # no step of that many tokens after one cached
        return _time_sweeps(layers, rows, assignments, rounds=rounds)
    encoder, decoder = model.get_encoder(), model.get_decoder()
    cached, source = (16, 32) if max_positions is None else (min(16, max_positions - rows), min(32, max_positions))
    encoder_outputs = encoder(input_ids=ids(encoder.get_input_embeddings(), source))
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    decoder_embeddings = decoder.get_input_embeddings()
    model(
        encoder_outputs=encoder_outputs, decoder_input_ids=ids(decoder_embeddings, cached), cache=cache, use_cache=True
    )
    step_ids = ids(decoder_embeddings, rows)

    def forward() -> None:
        model(encoder_outputs=encoder_outputs, decoder_input_ids=step_ids, cache=cache, use_cache=True)
        cache.crop(-rows)

    def timed(assignment: list[LayerSetting]) -> float:
        for layer, (kernel, min_rows) in zip(layers, assignment, strict=True):
            layer.kernel, layer.min_rows = kernel, min_rows
        forward()
        start = time.perf_counter()
        for _ in range(calls):
            forward()
        return (time.perf_counter() - start) / calls

    return _interleaved_medians(timed, assignments, rounds)


def _interleaved_medians(
    run: Callable[[list[LayerSetting]], float], assignments: Sequence[list[LayerSetting]], rounds: int
) -> list[float]:
    """The median of `run(assignment)`'s seconds per assignment: one warm-up each, then `rounds` rounds running
    every assignment once, the order rotating per round."""
    for assignment in assignments:
        run(assignment)
    totals: list[list[float]] = [[] for _ in assignments]
    for round_index in range(rounds):
        shift = round_index % len(assignments)
        for which in [*range(shift, len(assignments)), *range(shift)]:
            totals[which].append(run(assignments[which]))
    return [statistics.median(values) for values in totals]
