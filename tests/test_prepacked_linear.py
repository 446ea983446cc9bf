"""`prepack_linear_layers`: the same results as `nn.Linear`, the same parameters, and greedy output kept at β=1."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from conftest import build_verifier, make_source_batch
from torch import nn

from specdec_hf import PrepackedLinear, SpecDrafterModel, prepack_linear_layers, speculative_generate
from specdec_hf.prepacked_linear import _prepacked_dtypes

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch build has no oneDNN")


def _pair(dtype: torch.dtype, bias: bool = True) -> tuple[nn.Linear, PrepackedLinear]:
    torch.manual_seed(0)
    linear = nn.Linear(48, 40, bias=bias).to(dtype)
    return linear, PrepackedLinear.from_linear(linear)


def _prepacked_here(dtype: torch.dtype) -> bool:
    return dtype in _prepacked_dtypes()


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


def test_dtype_round_trips_and_data_edits_never_leave_a_stale_copy():
    """A round trip through another dtype frees and reallocates the weight (its address may come back); `.data`
    edits bypass the version counter and need `reset_packed()`."""
    linear, packed = _pair(torch.float32)
    inputs = torch.randn(6, 48)
    with torch.no_grad():
        for _ in range(5):
            packed(inputs)
            packed.half().float()  # rounds the weight: the result must follow
            torch.testing.assert_close(packed(inputs), F.linear(inputs, packed.weight, packed.bias))
        packed.weight.data.mul_(3.0)
        packed.reset_packed()
        torch.testing.assert_close(packed(inputs), F.linear(inputs, packed.weight, packed.bias))


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
    linears = sum(type(m) is nn.Linear for m in verifier.modules())
    assert prepack_linear_layers(verifier) is verifier
    assert prepack_linear_layers(verifier) is verifier  # a second call wraps nothing twice
    packed = [m for m in verifier.modules() if isinstance(m, PrepackedLinear)]
    assert len(packed) == linears and not any(type(m) is nn.Linear for m in verifier.modules())
    assert not any(m.training for m in packed)  # eval mode kept
    assert verifier.get_output_embeddings().weight is verifier.get_input_embeddings().weight  # still tied
    assert verifier.state_dict().keys() == state.keys()
    verifier.save_pretrained(tmp_path)
    reloaded = type(verifier).from_pretrained(tmp_path)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_layers_with_hooks_or_subclasses_are_left_alone_and_shared_layers_stay_shared():
    class Scaled(nn.Linear):
        pass

    shared = nn.Linear(8, 8)
    hooked = nn.Linear(8, 8)
    hooked.register_forward_hook(lambda module, args, output: output * 0)
    model = nn.ModuleDict({"a": shared, "b": shared, "hooked": hooked, "subclass": Scaled(8, 8)})
    prepack_linear_layers(model)
    assert isinstance(model["a"], PrepackedLinear) and model["a"] is model["b"]
    assert type(model["hooked"]) is nn.Linear and type(model["subclass"]) is Scaled
    assert torch.equal(model["hooked"](torch.randn(2, 8)), torch.zeros(2, 8))  # its hook still runs


def test_weights_off_the_cpu_are_refused():
    model = nn.Sequential(nn.Linear(8, 8, device="meta"))
    with pytest.raises(ValueError, match="CPU"):
        prepack_linear_layers(model)


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
        verifier, block_size=4, decoder_layers=1, prefix_attention="causal", prefix_feature_layers=[-1]
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
