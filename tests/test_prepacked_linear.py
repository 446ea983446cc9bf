"""`prepack_linear_layers`: the same results as `nn.Linear`, the same parameters, and greedy output kept at β=1."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import build_verifier, make_source_batch
from torch import nn

from specdec_hf import (
    PrepackedLinear,
    SpecDrafterModel,
    enable_speculative_decoding,
    prepack_linear_layers,
    speculative_generate,
)
from specdec_hf import prepacked_linear as prepacked_linear_module

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch build has no oneDNN")


def _pair(dtype: torch.dtype, bias: bool = True) -> tuple[nn.Linear, PrepackedLinear]:
    torch.manual_seed(0)
    linear = nn.Linear(48, 40, bias=bias).to(dtype)
    return linear, PrepackedLinear.from_linear(linear)


def _prepacked_here(dtype: torch.dtype) -> bool:
    operators = prepacked_linear_module._onednn_operators()
    return operators is not None and dtype in operators.dtypes


@pytest.fixture
def unprobed(monkeypatch):
    """The operators probed anew in this test (and the probe's result of the other tests restored after it)."""
    monkeypatch.setattr(prepacked_linear_module, "_operators", prepacked_linear_module._UNPROBED)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (2, 7, 48), (3, 1, 48)])
def test_results_match_nn_linear(shape, bias):
    """Both dtypes to their rounding (another summation order at most), on the oneDNN path wherever it exists."""
    for dtype, tolerance in ((torch.bfloat16, 2e-2), (torch.float32, 1e-5)):
        linear, packed = _pair(dtype, bias)
        inputs = torch.randn(shape).to(dtype)
        with torch.no_grad():
            expected, got = linear(inputs), packed(inputs)
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
        assert (packed._packed is not None) == _prepacked_here(dtype)
    strided = torch.randn(4, 96)[:, ::2]  # a non-contiguous view
    linear, packed = _pair(torch.float32, bias)
    with torch.no_grad():
        torch.testing.assert_close(packed(strided), linear(strided), rtol=1e-5, atol=1e-5)


def test_other_dtypes_keep_nn_linear_computation():
    linear, packed = _pair(torch.float16)
    inputs = torch.randn(5, 48).half()
    with torch.no_grad():
        assert torch.equal(packed(inputs), linear(inputs))
    assert packed._packed is None


def test_packed_copy_follows_in_place_changes_and_dtype_moves():
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(6, 48)
    with torch.no_grad():
        packed(inputs)  # packs
        linear.weight.mul_(2.0)  # the parameters are shared: the packed copy is now stale and must be remade
        torch.testing.assert_close(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
        packed.load_state_dict({"weight": torch.zeros(40, 48), "bias": torch.ones(40)})
        assert torch.equal(packed(inputs), torch.ones(6, 40))
        packed.to(torch.bfloat16)
        assert torch.equal(packed(inputs.bfloat16()), torch.ones(6, 40, dtype=torch.bfloat16))


def test_dtype_round_trips_views_and_data_edits_never_leave_a_stale_copy():
    """A round trip through another dtype frees and reallocates the weight (its address may come back); a view of
    the old weight starts at the same address; `.data` edits bypass the version counter and need `reset_packed()`."""
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(6, 48)
    with torch.no_grad():
        for step in range(5):
            packed(inputs)
            packed.weight.mul_(1.5)
            packed.half().float()  # new storage, rounded values: the result must follow
            torch.testing.assert_close(packed(inputs), F.linear(inputs, packed.weight, packed.bias), msg=str(step))
        packed(inputs)
        packed.weight = nn.Parameter(packed.weight[:20])  # same address, fewer rows
        packed.bias = nn.Parameter(packed.bias[:20])
        assert packed(inputs).shape == (6, 20)
        square = PrepackedLinear.from_linear(nn.Linear(48, 48))
        square(inputs)
        square.weight = nn.Parameter(square.weight.t())  # same address, another layout
        torch.testing.assert_close(square(inputs), F.linear(inputs, square.weight, square.bias))
        packed.weight.data.mul_(3.0)
        packed.reset_packed()
        torch.testing.assert_close(packed(inputs), F.linear(inputs, packed.weight, packed.bias))


def test_trainable_bias_with_a_frozen_weight_gets_its_gradient():
    linear, packed = _pair(torch.float32)
    packed.weight.requires_grad_(False)
    packed(torch.randn(5, 48)).sum().backward()
    assert packed.bias.grad is not None and torch.equal(packed.bias.grad, torch.full((40,), 5.0))


def test_inference_mode_weights_and_empty_layers_fall_back():
    with torch.inference_mode():
        linear = nn.Linear(48, 40)
        packed = PrepackedLinear.from_linear(linear)
        inputs = torch.randn(5, 48)
        torch.testing.assert_close(packed(inputs), linear(inputs))
    empty = PrepackedLinear.from_linear(nn.Linear(48, 40))
    empty.weight = nn.Parameter(torch.empty(0, 48))
    empty.bias = nn.Parameter(torch.empty(0))
    with torch.no_grad():
        assert empty(torch.randn(5, 48)).shape == (5, 0)


def test_compiles_as_nn_linear_in_one_graph():
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(5, 48)
    compiled = torch.compile(packed, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(inputs), linear(inputs))


def test_without_onednn_nothing_is_prepacked(monkeypatch, unprobed):
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(5, 48)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with torch.no_grad():
        assert torch.equal(packed(inputs), linear(inputs))  # nn.Linear's own computation
    assert packed._packed is None
    with pytest.raises(RuntimeError, match="oneDNN"):
        prepack_linear_layers(nn.Sequential(nn.Linear(4, 4)))


def _missing_operator():
    raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_reorder_linear_weight'")


def _failing_operators():
    def fail(*args):
        raise RuntimeError("oneDNN: unsupported")

    return prepacked_linear_module._OneDNNOperators(fail, fail, (torch.float32,))


@pytest.mark.parametrize("resolver", [_missing_operator, _failing_operators], ids=["missing", "failing"])
def test_a_missing_or_failing_operator_falls_back_to_nn_linear_with_one_warning(monkeypatch, unprobed, resolver):
    """The operators are private to PyTorch: a rename must not make every prepacked forward raise."""
    monkeypatch.setattr(prepacked_linear_module, "_resolve_onednn_operators", resolver)
    model = nn.Sequential(nn.Linear(48, 40), nn.Linear(40, 8))
    expected = model(inputs := torch.randn(5, 48))
    with pytest.warns(RuntimeWarning, match=r"oneDNN operators .* missing or failed.*nn\.Linear's own computation"):
        prepack_linear_layers(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, from any layer or call
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(model(inputs), expected)
    assert all(isinstance(layer, PrepackedLinear) and layer._packed is None for layer in model)


def test_speculative_decoding_on_models_prepacked_without_the_operators_equals_greedy(monkeypatch, unprobed):
    monkeypatch.setattr(prepacked_linear_module, "_resolve_onednn_operators", _missing_operator)
    verifier = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1).eval()
    inputs = make_source_batch(4)
    greedy = verifier.generate(**inputs, do_sample=False, max_new_tokens=12)
    with pytest.warns(RuntimeWarning, match=r"oneDNN operators .* missing"):
        prepack_linear_layers(verifier)
    prepack_linear_layers(drafter)
    output = enable_speculative_decoding(verifier).generate(
        **inputs, drafter=drafter, do_sample=False, max_new_tokens=12
    )
    assert torch.equal(output, greedy)
    assert all(
        m._packed is None for model in (verifier, drafter) for m in model.modules() if isinstance(m, PrepackedLinear)
    )


def test_an_operator_failing_after_the_probe_falls_back_with_one_warning(monkeypatch, unprobed):
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(5, 48)
    operators = prepacked_linear_module._onednn_operators()
    if operators is None:
        pytest.skip("the oneDNN operators do not run here")

    def failing_linear(*args):
        raise RuntimeError("oneDNN: primitive creation failed")

    monkeypatch.setattr(prepacked_linear_module, "_operators", operators._replace(linear_pointwise=failing_linear))
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):  # a bad input: nn.Linear's error
                packed(torch.randn(5, 7))
        assert prepacked_linear_module._onednn_operators() is not None  # the input was at fault, not the operator
        with pytest.warns(RuntimeWarning, match="primitive creation failed"):
            torch.testing.assert_close(packed(inputs), linear(inputs))
        assert prepacked_linear_module._onednn_operators() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.testing.assert_close(packed(inputs), linear(inputs))


def test_deepcopy_and_pickle_after_use():
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(6, 48)
    with torch.no_grad():
        expected = packed(inputs)  # now holds an opaque oneDNN tensor
        copied = copy.deepcopy(packed)
        buffer = io.BytesIO()
        torch.save(packed, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        for layer in (copied, loaded):
            torch.testing.assert_close(layer(inputs), expected)


def test_autocast_keeps_nn_linear_semantics():
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(6, 48)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = packed(inputs), linear(inputs)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)


def test_training_takes_nn_linear_gradients():
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(5, 48)
    linear(inputs).square().sum().backward()
    expected = linear.weight.grad.clone()
    linear.weight.grad = None
    packed(inputs).square().sum().backward()  # the same parameter: its gradient must be nn.Linear's
    torch.testing.assert_close(packed.weight.grad, expected)


def test_prepacking_a_verifier_keeps_parameters_ties_and_saved_weights(tmp_path):
    verifier = build_verifier("bart").eval()
    state = {name: tensor.clone() for name, tensor in verifier.state_dict().items()}
    linears = [m for m in verifier.modules() if type(m) is nn.Linear]
    assert prepack_linear_layers(verifier) is verifier
    assert prepack_linear_layers(verifier) is verifier  # a second call changes nothing
    packed = [m for m in verifier.modules() if isinstance(m, PrepackedLinear)]
    assert len(packed) == len(linears) and all(a is b for a, b in zip(packed, linears, strict=True))  # same objects
    assert not any(type(m) is nn.Linear for m in verifier.modules())
    assert not any(m.training for m in packed)  # eval mode kept
    assert verifier.get_output_embeddings().weight is verifier.get_input_embeddings().weight  # still tied
    assert verifier.state_dict().keys() == state.keys()
    verifier.save_pretrained(tmp_path)
    reloaded = type(verifier).from_pretrained(tmp_path)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_layers_keep_identity_hooks_and_sharing_and_subclasses_are_left_alone():
    class Scaled(nn.Linear):
        pass

    shared = nn.Linear(8, 8)
    hooked = nn.Linear(8, 8)
    hooked.register_forward_hook(lambda module, args, output: output * 0)
    backward_calls = []
    hooked.register_full_backward_hook(lambda module, grad_input, grad_output: backward_calls.append(1))
    hooked.note = "kept"
    model = nn.ModuleDict({"a": shared, "b": shared, "hooked": hooked, "subclass": Scaled(8, 8)})
    prepack_linear_layers(model)
    assert model["a"] is shared and model["b"] is shared and isinstance(shared, PrepackedLinear)
    assert model["hooked"] is hooked and isinstance(hooked, PrepackedLinear) and hooked.note == "kept"
    assert type(model["subclass"]) is Scaled
    with torch.no_grad():
        assert torch.equal(hooked(torch.randn(2, 8)), torch.zeros(2, 8))  # its forward hook still runs
    hooked(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert backward_calls == [1]  # and its backward hook


def test_weights_off_the_cpu_are_refused_and_the_model_left_unchanged():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8, device="meta"))
    with pytest.raises(ValueError, match="CPU"):
        prepack_linear_layers(model)
    assert all(type(layer) is nn.Linear for layer in model)


def test_standard_constructor_builds_a_working_layer():
    torch.manual_seed(0)
    layer = PrepackedLinear(48, 40)
    inputs = torch.randn(3, 48)
    with torch.no_grad():
        torch.testing.assert_close(layer(inputs), F.linear(inputs, layer.weight, layer.bias))


@pytest.mark.parametrize("batch_size", [1, 4])
def test_beta_one_on_prepacked_models_equals_greedy_on_the_same_model(family, batch_size):
    """The verifier and an EAGLE-style drafter both prepacked: speculative output is the prepacked greedy output."""
    verifier = build_verifier(family).eval()
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", verifier_state_layers=[-1]
    ).eval()
    prepack_linear_layers(verifier)
    prepack_linear_layers(drafter)
    inputs = make_source_batch(batch_size, pad_token_id=verifier.config.pad_token_id)
    greedy = verifier.generate(**inputs, do_sample=False, max_new_tokens=20)
    output = verifier.generate(
        **inputs, do_sample=False, max_new_tokens=20, custom_generate=speculative_generate, drafter=drafter
    )
    assert torch.equal(output, greedy)
    for model in (verifier, drafter):  # the oneDNN path ran (a packed copy exists), not only nn.Linear's fallback
        assert any(m._packed is not None for m in model.modules() if isinstance(m, PrepackedLinear))


# ---------------------------------------------------------------------------------------------------------------
# the float16-weight kernel (FBGEMM)
# ---------------------------------------------------------------------------------------------------------------


def _fp16_valued_pair(bias: bool = True) -> tuple[nn.Linear, PrepackedLinear]:
    """A layer whose weight holds float16 values (its bias, float32, does not) on the float16-weight kernel."""
    linear, packed = _pair(torch.float32, bias)
    with torch.no_grad():
        linear.weight.copy_(linear.weight.half().float())
    packed.kernel = prepacked_linear_module.FP16_WEIGHTS
    return linear, packed


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (2, 7, 48)])
def test_fp16_weights_match_nn_linear_on_float16_valued_weights(counted_fp16_calls, shape, bias):
    """Float32 inputs, float16-valued weights: nn.Linear's results up to summation order, also on a strided view."""
    linear, packed = _fp16_valued_pair(bias)
    inputs, strided = torch.randn(shape), torch.randn(4, 96)[:, ::2]
    with torch.no_grad():
        torch.testing.assert_close(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed(strided), linear(strided), rtol=1e-5, atol=1e-5)
    assert len(counted_fp16_calls) == 2 and packed.fp16_weights_exact()


def test_fp16_weights_never_round_a_weight(counted_fp16_calls):
    """A weight value float16 cannot hold keeps nn.Linear's computation, bitwise, also after an in-place change
    makes a float16-valued weight inexact (and the other way round)."""
    linear, packed = _pair(torch.float32)
    packed.kernel = prepacked_linear_module.FP16_WEIGHTS
    inputs = torch.randn(3, 48)
    with torch.no_grad():
        assert not packed.fp16_weights_exact() and torch.equal(packed(inputs), linear(inputs))
        assert counted_fp16_calls == []
        linear.weight.copy_(linear.weight.half().float())  # shared: now float16-valued
        torch.testing.assert_close(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
        assert len(counted_fp16_calls) == 1
        linear.weight.add_(1e-4)  # inexact again: repacked, so the kernel is left
        assert torch.equal(packed(inputs), linear(inputs)) and len(counted_fp16_calls) == 1
        linear.weight.copy_(linear.weight.half().float())
        torch.testing.assert_close(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
        linear.bias.add_(1.0)  # the bias alone changed in place: repacked with it
        torch.testing.assert_close(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
        packed.bias = nn.Parameter(torch.randn(40))  # a new bias (the layer's own now, not the linear's)
        torch.testing.assert_close(packed(inputs), F.linear(inputs, linear.weight, packed.bias), rtol=1e-5, atol=1e-5)
    assert len(counted_fp16_calls) == 4


def test_fp16_weights_keep_nn_linear_for_gradients_and_few_rows(counted_fp16_calls):
    _, packed = _fp16_valued_pair()
    packed.min_rows = 3
    with torch.no_grad():
        packed(torch.randn(2, 48))  # below min_rows
    inputs = torch.randn(4, 48, requires_grad=True)
    packed(inputs).sum().backward()  # training: nn.Linear's kernel, which has a backward
    assert counted_fp16_calls == [] and inputs.grad is not None
    with torch.no_grad():
        packed(torch.randn(4, 48))
    assert len(counted_fp16_calls) == 1


def test_a_failing_fp16_weight_operator_falls_back_with_one_warning(monkeypatch):
    operators = prepacked_linear_module._fp16_weight_operators()
    if operators is None:
        pytest.skip("FBGEMM's float16-weight operators do not run here")

    def failing(inputs, packed):
        raise RuntimeError("kernel gone")

    monkeypatch.setattr(prepacked_linear_module, "_fp16_operators", operators._replace(linear=failing))
    linear, packed = _fp16_valued_pair()
    inputs = torch.randn(3, 48)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="FBGEMM's float16-weight operators"):
        torch.testing.assert_close(packed(inputs), linear(inputs))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(packed(inputs), linear(inputs))  # no second warning
    assert prepacked_linear_module._fp16_operators is None


def test_prepack_linear_layers_puts_every_layer_back_on_onednn():
    _, packed = _fp16_valued_pair()
    packed.min_rows = 9
    model = nn.Sequential(packed)
    prepack_linear_layers(model)
    assert model[0].kernel == prepacked_linear_module.ONEDNN and model[0].min_rows == 1


def test_an_unknown_kernel_is_refused_and_to_linear_drops_the_choice():
    layer = PrepackedLinear(8, 4)
    with pytest.raises(ValueError, match=r"`kernel` must be one of \['onednn', 'fp16_weights'\], got 'fp16'"):
        layer.kernel = "fp16"
    assert layer.kernel == "onednn"
    layer.kernel = "fp16_weights"
    old_pickle = {**layer.__getstate__(), "kernel": "fp16_weights"}  # before `kernel` was a property
    del old_pickle["_kernel"]
    restored = PrepackedLinear.__new__(PrepackedLinear)
    restored.__setstate__(old_pickle)
    assert restored.kernel == "fp16_weights" and "kernel" not in restored.__dict__
    layer.to_linear()
    assert type(layer) is torch.nn.Linear and "_kernel" not in layer.__dict__


def test_fp16_weights_leave_infinite_weights_and_the_parameters_alone(counted_fp16_calls):
    """±inf survives a float16 round trip but FBGEMM saturates it: such a layer keeps nn.Linear's computation, and
    its parameters are never written."""
    linear, packed = _fp16_valued_pair()
    with torch.no_grad():
        linear.weight[0, 0] = float("inf")
        before = linear.weight.clone()
        inputs = torch.randn(3, 48)
        assert not packed.fp16_weights_exact()
        assert torch.equal(packed(inputs), linear(inputs)) and counted_fp16_calls == []
        assert torch.equal(linear.weight, before)


def test_fp16_weights_fall_back_quietly_for_vectors_and_other_engines(counted_fp16_calls):
    """A 1-D input (nn.Linear takes one, the operator does not) and a quantized engine FBGEMM's packing does not
    serve take nn.Linear's computation, without disabling the kernel or warning."""
    linear, packed = _fp16_valued_pair()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(packed(torch.ones(48)), linear(torch.ones(48)))
        previous = torch.backends.quantized.engine
        if "qnnpack" in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = "qnnpack"
            try:
                torch.testing.assert_close(packed(torch.ones(2, 48)), linear(torch.ones(2, 48)))
            finally:
                torch.backends.quantized.engine = previous
        assert counted_fp16_calls == []
        packed(torch.ones(2, 48))
    assert len(counted_fp16_calls) == 1 and prepacked_linear_module._fp16_operators is not None


# ---------------------------------------------------------------------------------------------------------------
# later calls on the packed copy (the checks kept between calls)
# ---------------------------------------------------------------------------------------------------------------


def _counted_kernel_calls(monkeypatch, kernel: str) -> list:
    """The calls that ran `kernel`'s packed operator (wrapped, its results kept); skips where it does not run."""
    calls = []
    if kernel == prepacked_linear_module.FP16_WEIGHTS:
        operators = prepacked_linear_module._fp16_weight_operators()
        if operators is None:
            pytest.skip("FBGEMM's float16-weight operators do not run here")

        def counting(inputs, packed):
            calls.append(inputs.shape)
            return operators.linear(inputs, packed)

        monkeypatch.setattr(prepacked_linear_module, "_fp16_operators", operators._replace(linear=counting))
        return calls
    operators = prepacked_linear_module._onednn_operators()
    if operators is None or torch.float32 not in operators.dtypes:
        pytest.skip("the oneDNN operators do not run here")

    def counting_onednn(*args):
        calls.append(args[0].shape)
        return operators.linear_pointwise(*args)

    monkeypatch.setattr(prepacked_linear_module, "_operators", operators._replace(linear_pointwise=counting_onednn))
    return calls


@pytest.mark.parametrize("kernel", [prepacked_linear_module.ONEDNN, prepacked_linear_module.FP16_WEIGHTS])
def test_calls_after_the_packing_one_see_every_change_it_checked(monkeypatch, kernel):
    """A call on unchanged parameters checks less than the call that packed them; what it skips cannot change
    between calls, and each change that can is seen at the next call: the parameters (in place, through `.data`, a
    new parameter, a bias removed), the rows, the kernel, autocast, gradients, oneDNN switched off and the
    operator's failure."""
    calls = _counted_kernel_calls(monkeypatch, kernel)
    linear, packed = _fp16_valued_pair()
    packed.kernel = kernel
    inputs = torch.randn(4, 48)

    def check(expected_calls: int, exact: bool = False) -> None:
        with torch.no_grad():
            got, expected = packed(inputs), F.linear(inputs, packed.weight, packed.bias)
        if exact:  # nn.Linear's own computation, bitwise
            assert torch.equal(got, expected)
        else:
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert len(calls) == expected_calls

    check(1)  # packs
    check(2)  # the same parameters: the packed copy, through the shorter checks
    assert packed._packed_call is not None
    with torch.no_grad():
        linear.weight.mul_(2.0)  # in place (shared with `linear`): float16 values still, repacked
    check(3)
    packed.weight.data = torch.randn(40, 48).half().float()  # another storage through `.data`: seen by its address
    check(4)
    packed.bias = nn.Parameter(torch.randn(40))  # a new parameter
    check(5)
    packed.min_rows = 5
    check(5, exact=True)
    packed.min_rows = 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert packed(inputs).dtype == torch.bfloat16 == linear(inputs).dtype
    with torch.backends.mkldnn.flags(enabled=False):
        check(5, exact=True)
    gradient_inputs = inputs.clone().requires_grad_()
    packed(gradient_inputs).sum().backward()  # gradients: nn.Linear's kernel, which has a backward
    assert gradient_inputs.grad is not None and len(calls) == 5
    other = next(name for name in prepacked_linear_module.KERNELS if name != kernel)
    packed.kernel = other  # the other kernel's copy (or nn.Linear's computation where it does not run here)
    check(5)
    packed.kernel = kernel
    check(6)  # back on this kernel: packed again for it
    packed.bias = None  # no bias now: packed again, without one
    check(7)
    global_name = "_fp16_operators" if kernel == prepacked_linear_module.FP16_WEIGHTS else "_operators"
    monkeypatch.setattr(prepacked_linear_module, global_name, None)  # the kernel switched off after a failure
    check(7, exact=True)


@pytest.mark.parametrize("kernel", [prepacked_linear_module.ONEDNN, prepacked_linear_module.FP16_WEIGHTS])
def test_calls_after_the_packing_one_see_data_swaps_and_bad_inputs_as_nn_linear_does(monkeypatch, kernel):
    """`.data` swaps that keep a parameter's address (a transposed or narrowed view) or reuse a freed one, the
    bias changed in place or swapped, inputs the operator refuses, and the operator failing on a later call."""
    calls = _counted_kernel_calls(monkeypatch, kernel)
    _, packed = _fp16_valued_pair()
    packed.kernel = kernel
    square = PrepackedLinear.from_linear(nn.Linear(48, 48))
    square.kernel = kernel
    inputs = torch.randn(4, 48)

    def same_as_nn_linear(layer: PrepackedLinear, batch: torch.Tensor = inputs) -> None:
        with torch.no_grad():
            torch.testing.assert_close(layer(batch), F.linear(batch, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)

    with torch.no_grad():
        square.weight.copy_(torch.randn(48, 48).half().float())
    same_as_nn_linear(square)
    square.weight.data = square.weight.data.t()  # same object, version and address: another layout
    same_as_nn_linear(square)
    same_as_nn_linear(packed)
    assert packed._packed_call is not None
    packed.weight.data = packed.weight.data[:20]  # same address, fewer rows (the bias too)
    packed.bias.data = packed.bias.data[:20]
    same_as_nn_linear(packed)
    with torch.no_grad():
        packed.bias.add_(1.0)  # the bias alone, in place
    same_as_nn_linear(packed)
    packed.bias.data = torch.randn(20)  # the bias alone, swapped
    same_as_nn_linear(packed)
    packed.weight.data = torch.randn(20, 48)  # float16 cannot hold these: nn.Linear's computation, copy let go
    same_as_nn_linear(packed)
    if kernel == prepacked_linear_module.FP16_WEIGHTS:
        # the record went with the copy it was made for: a later weight at that copy's source's address cannot
        # pass for it
        assert packed._packed_call is None
    for _ in range(3):  # new weights, some perhaps at a freed address
        packed.weight.data = torch.randn(20, 48).half().float()
        same_as_nn_linear(packed)
        same_as_nn_linear(packed)
    taken = len(calls)
    assert taken > 0
    with torch.no_grad():
        with pytest.raises(RuntimeError):  # the wrong width: nn.Linear's own error
            packed(torch.randn(4, 40))
        with pytest.raises(RuntimeError):  # another dtype, as nn.Linear refuses it
            packed(inputs.bfloat16())
    same_as_nn_linear(packed, torch.randn(48))  # a vector: nn.Linear takes it
    operators_name = "_fp16_operators" if kernel == prepacked_linear_module.FP16_WEIGHTS else "_operators"
    operators = getattr(prepacked_linear_module, operators_name)
    # the inputs were at fault, not this kernel's operators: still in use
    assert operators not in (None, prepacked_linear_module._UNPROBED)

    def failing(*args):
        raise RuntimeError("kernel gone")

    field = "linear" if kernel == prepacked_linear_module.FP16_WEIGHTS else "linear_pointwise"
    monkeypatch.setattr(prepacked_linear_module, operators_name, operators._replace(**{field: failing}))
    with pytest.warns(RuntimeWarning, match="kernel gone"):
        same_as_nn_linear(packed)  # a later call's failure: reported once, nn.Linear's result
    assert getattr(prepacked_linear_module, operators_name) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same_as_nn_linear(packed)


def test_the_float16_kernel_is_probed_once_an_fbgemm_engine_is_set(monkeypatch):
    """A process that starts on another quantized engine does not rule the kernel out for good."""
    if not {"qnnpack", "fbgemm"} <= set(torch.backends.quantized.supported_engines):
        pytest.skip("needs the qnnpack and FBGEMM engines")
    monkeypatch.setattr(prepacked_linear_module, "_fp16_operators", prepacked_linear_module._UNPROBED)
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    try:
        assert prepacked_linear_module._fp16_weight_operators() is None
        assert prepacked_linear_module._fp16_operators is prepacked_linear_module._UNPROBED
    finally:
        torch.backends.quantized.engine = previous
    assert prepacked_linear_module._fp16_weight_operators() is not None


@pytest.mark.parametrize("kernel", [prepacked_linear_module.ONEDNN, prepacked_linear_module.FP16_WEIGHTS])
def test_a_strided_expanded_or_broadcast_bias_keeps_nn_linear_results(monkeypatch, kernel):
    """oneDNN reads the bias as `out_features` contiguous values: a column of a matrix, an expanded scalar and a
    broadcast `(1,)` bias take nn.Linear's computation, on a first call and after a `.data` swap, without a warning
    and without switching the kernel off."""
    _counted_kernel_calls(monkeypatch, kernel)  # skips where the kernel does not run
    _, packed = _fp16_valued_pair()
    packed.kernel = kernel
    inputs = torch.randn(4, 48)

    def same_as_nn_linear() -> None:
        with torch.no_grad():
            torch.testing.assert_close(packed(inputs), F.linear(inputs, packed.weight, packed.bias))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same_as_nn_linear()  # packs, with a plain bias
        packed.bias.data = torch.randn(40, 2)[:, 0]  # a strided column
        same_as_nn_linear()
        packed.bias.data = torch.full((1,), 3.0).expand(40)  # one value, expanded
        same_as_nn_linear()
        packed.bias = nn.Parameter(torch.randn(40, 2)[:, 1])  # a new strided parameter
        same_as_nn_linear()
        packed.bias = nn.Parameter(torch.full((1,), 2.0))  # broadcast: nn.Linear takes it
        same_as_nn_linear()
    assert prepacked_linear_module._onednn_operators() is not None
    operators = "_fp16_operators" if kernel == prepacked_linear_module.FP16_WEIGHTS else "_operators"
    assert getattr(prepacked_linear_module, operators) is not None


def test_the_float16_kernel_calls_the_overloads_operators_not_the_overloads(monkeypatch):
    """An `OpOverload`'s call scans its arguments for fake script objects on every call (tracing only): the layer
    calls the overload's operator (`OpOverload.op`) itself, which computes the same."""
    monkeypatch.setattr(prepacked_linear_module, "_fp16_operators", prepacked_linear_module._UNPROBED)
    operators = prepacked_linear_module._fp16_weight_operators()
    if operators is None:
        pytest.skip("FBGEMM's float16-weight operators do not run here")
    overloads = (torch.ops.quantized.linear_prepack_fp16.default, torch.ops.quantized.linear_dynamic_fp16.default)
    if not all(hasattr(overload, "op") for overload in overloads):
        pytest.skip("this torch's overloads have no `op`: the layer calls the overloads")
    assert not any(isinstance(operator, torch._ops.OpOverload) for operator in operators)
    assert (operators.prepack, operators.linear) == tuple(overload.op for overload in overloads)
