"""`prepack_where_faster`: each linear layer signature keeps the kernel measured faster, per row count."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import build_verifier, make_source_batch
from torch import nn

from specdec_hf import KernelChoice, PrepackedLinear, SpecDrafterModel, prepack_where_faster, speculative_generate
from specdec_hf import prepacked_linear as prepacked_linear_module

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch build has no oneDNN")

ROWS = (1, 2, 5, 9)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 48))


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [module for module in model.modules() if isinstance(module, nn.Linear)]


def _prepacked_here(dtype: torch.dtype) -> bool:
    operators = prepacked_linear_module._onednn_operators()
    return operators is not None and dtype in operators.dtypes


def _fake_measure(prepacked_wins: set[int], calls: list | None = None):
    """A measurement where the prepacked kernel is faster exactly at the row counts in `prepacked_wins`."""

    def measure(layer, rows):
        assert layer.min_rows == 1, "a previous choice must not change what is measured"
        if calls is not None:
            calls.append((layer.in_features, layer.out_features, rows))
        return (2.0, 1.0) if rows in prepacked_wins else (1.0, 2.0)

    return measure


@pytest.fixture
def counted_onednn_calls(monkeypatch):
    """How many calls took the oneDNN path (the operator wrapped, so that its results stay real)."""
    operators = prepacked_linear_module._onednn_operators()
    if operators is None or torch.float32 not in operators.dtypes:
        pytest.skip("the oneDNN operators do not run here")
    calls = []

    def counting(*args):
        calls.append(args[0].shape)
        return operators.linear_pointwise(*args)

    monkeypatch.setattr(prepacked_linear_module, "_operators", operators._replace(linear_pointwise=counting))
    return calls


def test_prepacked_only_from_the_rows_where_it_wins(counted_onednn_calls):
    model = _model()
    reference = copy.deepcopy(model)
    choices = prepack_where_faster(model, rows=ROWS, measure=_fake_measure({5, 9}))
    assert [choice.min_rows for choice in choices] == [5, 5]
    assert all(isinstance(layer, PrepackedLinear) and layer.min_rows == 5 for layer in _linears(model))
    with torch.no_grad():
        for rows in (1, 2, 4):
            inputs = torch.randn(rows, 32)
            torch.testing.assert_close(model(inputs), reference(inputs), rtol=1e-5, atol=1e-5)
        assert counted_onednn_calls == []  # below 5 rows: nn.Linear's kernel
        for rows in (5, 7, 64):
            inputs = torch.randn(1, rows, 32)
            torch.testing.assert_close(model(inputs), reference(inputs), rtol=1e-5, atol=1e-5)
    assert len(counted_onednn_calls) == 3 * 3


def test_a_signature_that_never_wins_is_nn_linear_again(counted_onednn_calls):
    model = _model()
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    inputs = torch.randn(5, 32)
    with torch.no_grad():
        expected = model(inputs)
    choices = prepack_where_faster(model, rows=ROWS, measure=_fake_measure(set()))
    assert [choice.min_rows for choice in choices] == [None, None]
    for layer in _linears(model):
        assert type(layer) is nn.Linear
        assert not {"_packed", "_packed_source", "_packed_key", "min_rows"} & set(vars(layer))
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in state.items())
    with torch.no_grad():
        assert torch.equal(model(inputs), expected)
    assert counted_onednn_calls == []
    assert "nn.Linear" in choices[0].describe()


def test_only_wins_up_to_the_last_row_count_prepack():
    if not _prepacked_here(torch.float32):
        pytest.skip("the oneDNN operators do not run float32 here")
    """A win at 2 rows between losses does not prepack small calls: only wins at every larger count do."""
    choices = prepack_where_faster(_model(), rows=ROWS, measure=_fake_measure({2, 9}))
    assert [choice.min_rows for choice in choices] == [9, 9]
    choices = prepack_where_faster(_model(), rows=ROWS, measure=_fake_measure({1, 2, 5, 9}))
    assert [choice.min_rows for choice in choices] == [1, 1]


def test_one_measurement_per_signature_and_row_count():
    calls = []
    model = _model()  # 32 -> 48 twice, 48 -> 32 once
    choices = prepack_where_faster(model, rows=ROWS, measure=_fake_measure({9}, calls))
    if not _prepacked_here(torch.float32):
        assert calls == [] and all(choice.min_rows is None for choice in choices)
        return
    assert sorted(calls) == sorted([(32, 48, rows) for rows in ROWS] + [(48, 32, rows) for rows in ROWS])
    assert [(c.in_features, c.out_features, c.num_layers, c.bias, c.dtype) for c in choices] == [
        (32, 48, 2, True, torch.float32),
        (48, 32, 1, True, torch.float32),
    ]
    assert choices[0].rows == ROWS and choices[0].plain_seconds == (1.0, 1.0, 1.0, 2.0)
    # a second call measures again, from every row count (the fake measure checks min_rows is reset to 1)
    choices = prepack_where_faster(model, rows=ROWS, measure=_fake_measure({1, 2, 5, 9}))
    assert all(layer.min_rows == 1 for layer in _linears(model))


def test_a_dtype_onednn_does_not_serve_is_not_measured():
    calls = []
    model = _model().half()
    choices = prepack_where_faster(model, rows=ROWS, measure=_fake_measure({1, 2, 5, 9}, calls))
    assert calls == []
    assert all(choice.min_rows is None and choice.plain_seconds == () for choice in choices)
    assert all(type(layer) is nn.Linear for layer in _linears(model))


@pytest.mark.parametrize("rows", [(), (0, 1), (5, 2), (1, 1, 2)])
def test_bad_row_counts_are_refused(rows):
    with pytest.raises(ValueError, match="`rows` must be increasing row counts"):
        prepack_where_faster(_model(), rows=rows)


def test_real_measurement_keeps_results_and_reports_every_layer():
    model = _model()
    inputs = torch.randn(5, 32)
    with torch.no_grad():
        expected = model(inputs)
    choices = prepack_where_faster(model, rows=(1, 5))
    assert all(isinstance(choice, KernelChoice) for choice in choices)
    assert sum(choice.num_layers for choice in choices) == 3
    if _prepacked_here(torch.float32):
        assert all(len(c.plain_seconds) == len(c.prepacked_seconds) == 2 for c in choices)
        assert all(seconds > 0 for c in choices for seconds in c.plain_seconds + c.prepacked_seconds)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_beta_one_equals_greedy_when_steps_and_verifications_take_different_kernels(
    family, batch_size, counted_onednn_calls
):
    """Calls below 5 rows (greedy steps here, at batch 1 and 3) on nn.Linear's kernel, verifications of k=4 (5 rows
    a row and more) on oneDNN's: β=1 is still greedy's output."""
    verifier = build_verifier(family).eval()
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", verifier_state_layers=[-1]
    ).eval()
    prepack_where_faster(verifier, rows=ROWS, measure=_fake_measure({5, 9}))
    prepack_where_faster(drafter, rows=ROWS, measure=_fake_measure({5, 9}))
    inputs = make_source_batch(batch_size, pad_token_id=verifier.config.pad_token_id)
    greedy = verifier.generate(**inputs, do_sample=False, max_new_tokens=20)
    assert all(shape[:-1].numel() >= 5 for shape in counted_onednn_calls)  # the encoder's rows, none of the steps'
    steps_on_onednn = len(counted_onednn_calls)
    output = verifier.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=20,
        num_draft_tokens=4,
        custom_generate=speculative_generate,
        drafter=drafter,
    )
    assert torch.equal(output, greedy)
    assert len(counted_onednn_calls) > 2 * steps_on_onednn  # the verifications ran on oneDNN


def test_rows_count_every_leading_dimension(counted_onednn_calls):
    """A (batch, positions, features) input has batch x positions rows."""
    model = _model()
    prepack_where_faster(model, rows=ROWS, measure=_fake_measure({5, 9}))
    with torch.no_grad():
        model(torch.randn(2, 2, 32))  # 4 rows
        assert counted_onednn_calls == []
        model(torch.randn(3, 2, 32))  # 6 rows
        assert len(counted_onednn_calls) == 3
        model(torch.randn(0, 32))  # no rows
        assert len(counted_onednn_calls) == 3


def test_signatures_tell_bias_apart_and_count_a_shared_layer_once():
    shared = nn.Linear(32, 32)
    model = nn.ModuleList([shared, nn.Linear(32, 32, bias=False), shared])
    choices = prepack_where_faster(model, rows=ROWS, measure=_fake_measure({9}))
    assert [(choice.bias, choice.num_layers) for choice in choices] == [(True, 1), (False, 1)]
    assert "no bias" in choices[1].describe() and "no bias" not in choices[0].describe()


def test_layers_the_prepacked_path_would_not_run_are_not_measured():
    calls = []
    model = _model()
    with torch.backends.mkldnn.flags(enabled=False):
        choices = prepack_where_faster(model, rows=ROWS, measure=_fake_measure({1, 2, 5, 9}, calls))
    assert calls == []
    assert all(type(layer) is nn.Linear for layer in _linears(model))
    assert all("not measured" in choice.describe() for choice in choices)
    assert choices[0].to_dict()["plain_us"] == [] and choices[0].to_dict()["min_rows"] is None


def _float16_valued(model: nn.Module) -> nn.Module:
    """`model` with every parameter rounded to float16 values, kept in float32 (a float16 checkpoint loaded so)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.half().float())
    return model


def _measure_by_kernel(seconds: dict[str, float], calls: list | None = None):
    """A measurement where `nn.Linear` takes 2.0 s a call and each packed kernel what `seconds` names."""

    def measure(layer, rows):
        if calls is not None:
            calls.append(layer.kernel)
        return 2.0, seconds[layer.kernel]

    return measure


def test_float16_valued_layers_keep_the_packed_kernel_measured_cheaper(counted_fp16_calls):
    model = _float16_valued(_model())
    reference = copy.deepcopy(model)
    choices = prepack_where_faster(model, rows=ROWS, measure=_measure_by_kernel({"onednn": 1.5, "fp16_weights": 1.0}))
    assert [(choice.kernel, choice.min_rows) for choice in choices] == [("fp16_weights", 1)] * 2
    assert all(layer.kernel == "fp16_weights" for layer in _linears(model))
    assert "float16 weights (FBGEMM) from 1 row(s)" in choices[0].describe()
    assert choices[0].to_dict()["kernel"] == "fp16_weights" and choices[0].prepacked_seconds == (1.0,) * len(ROWS)
    inputs = torch.randn(3, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), reference(inputs), rtol=1e-5, atol=1e-5)
    assert len(counted_fp16_calls) == 3  # every layer ran on it
    if _prepacked_here(torch.float32):  # and oneDNN where it is the cheaper one
        choices = prepack_where_faster(
            model, rows=ROWS, measure=_measure_by_kernel({"onednn": 1.0, "fp16_weights": 1.5})
        )
        assert [choice.kernel for choice in choices] == ["onednn"] * 2
        assert all(layer.kernel == "onednn" for layer in _linears(model))


def test_only_float16_valued_weights_are_measured_on_the_fp16_kernel(counted_fp16_calls):
    calls = []
    choices = prepack_where_faster(_model(), rows=ROWS, measure=_measure_by_kernel({"onednn": 1.0}, calls))
    assert "fp16_weights" not in calls
    assert all(choice.kernel in (None, "onednn") for choice in choices)


def test_beta_one_equals_greedy_on_float16_weight_kernels(family, counted_fp16_calls):
    """Every linear call of both models on FBGEMM's float16-weight kernel: β=1 is still greedy's output."""
    verifier = _float16_valued(build_verifier(family).eval())
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", verifier_state_layers=[-1]
    ).eval()
    measure = _measure_by_kernel({"onednn": 3.0, "fp16_weights": 1.0})
    for model in (verifier, _float16_valued(drafter)):
        choices = prepack_where_faster(model, rows=ROWS, measure=measure)
        assert {choice.kernel for choice in choices} == {"fp16_weights"}
    inputs = make_source_batch(3, pad_token_id=verifier.config.pad_token_id)
    greedy = verifier.generate(**inputs, do_sample=False, max_new_tokens=20)
    assert counted_fp16_calls, "greedy ran on the float16-weight kernel"
    output = verifier.generate(
        **inputs, do_sample=False, max_new_tokens=20, num_draft_tokens=4, custom_generate=speculative_generate,
        drafter=drafter,
    )  # fmt: skip
    assert torch.equal(output, greedy)


def test_layers_of_one_shape_choose_apart_by_their_weights(counted_fp16_calls):
    """Float16-valued and other weights of the same shape are two signatures: only the first may take the float16
    kernel, and each is measured on the kernels that would run it."""
    model = _model()
    _float16_valued(model[0])  # 32 -> 48, as the last layer, whose weight stays float32-valued
    calls = []
    choices = prepack_where_faster(
        model, rows=ROWS, measure=_measure_by_kernel({"onednn": 1.5, "fp16_weights": 1.0}, calls)
    )
    by_layer = {id(layer): layer.kernel for layer in _linears(model) if isinstance(layer, PrepackedLinear)}
    assert model[0].kernel == "fp16_weights"
    assert by_layer.get(id(model[4])) in (None, "onednn")  # never the float16 kernel
    assert len(choices) == 3 and calls.count("fp16_weights") == len(ROWS)


def test_of_two_winning_kernels_the_one_cheaper_at_few_rows_is_kept(counted_fp16_calls):
    """Costs relative to nn.Linear: a kernel faster at every count but by little at the largest is preferred over
    one that wins only at the largest counts, however large their absolute times."""
    plain = {1: 10.0, 2: 11.0, 5: 13.0, 9: 45.0}
    packed = {"fp16_weights": {1: 6.0, 2: 7.0, 5: 9.0, 9: 44.0}, "onednn": {1: 11.0, 2: 12.0, 5: 14.0, 9: 20.0}}

    def measure(layer, rows):
        return plain[rows], packed[layer.kernel][rows]

    choices = prepack_where_faster(_float16_valued(_model()), rows=ROWS, measure=measure)
    assert [(choice.kernel, choice.min_rows) for choice in choices] == [("fp16_weights", 1)] * 2


def test_a_failing_measurement_leaves_the_layers_on_onednn(counted_fp16_calls):
    model = _float16_valued(_model())

    def measure(layer, rows):
        if layer.kernel == "fp16_weights":
            raise RuntimeError("timer broke")
        return 2.0, 1.0

    with pytest.raises(RuntimeError, match="timer broke"):
        prepack_where_faster(model, rows=ROWS, measure=measure)
    assert all(layer.kernel == "onednn" for layer in _linears(model))
