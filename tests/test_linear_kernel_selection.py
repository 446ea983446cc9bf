"""`prepack_where_faster`: each linear layer signature keeps the kernel measured faster, per row count."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import build_verifier, make_source_batch
from torch import nn

from specdec_hf import (
    KernelChoice,
    PrepackedLinear,
    SpecDrafterModel,
    linear_kernel_selection,
    prepack_linear_layers,
    prepack_where_faster,
    speculative_generate,
)
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


def _sweeps_costing(chosen: float, everywhere: float, calls: list | None = None):
    """A whole-model sweep costing `chosen` seconds under the per-signature choice and `everywhere` with the float16
    kernel on every layer that can take it."""

    def measure_sweeps(layers, rows, assignments):
        if calls is not None:
            calls.append((list(layers), rows, [list(assignment) for assignment in assignments]))
        return [chosen, everywhere]

    return measure_sweeps


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
    if _prepacked_here(torch.float32):  # and oneDNN where it is the cheaper one, the whole model agreeing
        choices = prepack_where_faster(
            model,
            rows=ROWS,
            measure=_measure_by_kernel({"onednn": 1.0, "fp16_weights": 1.5}),
            measure_sweeps=_sweeps_costing(chosen=1.0, everywhere=1.0),
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


def test_the_whole_model_moves_float16_layers_to_their_kernel_where_its_sweep_is_faster(counted_fp16_calls):
    """Each layer alone is faster on oneDNN, the model's layers together on float16 weights (a footprint that fits
    the cache only in float16): the whole model's sweep decides, and every layer is swept in module order."""
    if not _prepacked_here(torch.float32):
        pytest.skip("the oneDNN operators do not run float32 here")
    model = _float16_valued(_model())
    reference = copy.deepcopy(model)
    calls = []
    choices = prepack_where_faster(
        model,
        rows=ROWS,
        measure=_measure_by_kernel({"onednn": 1.0, "fp16_weights": 1.5}),
        measure_sweeps=_sweeps_costing(chosen=2.0, everywhere=1.0, calls=calls),
    )
    assert [(c.kernel, c.min_rows, c.chosen_by) for c in choices] == [("fp16_weights", 1, "whole model")] * 2
    assert choices[0].prepacked_seconds == (1.5,) * len(ROWS)  # the layer's own timing on the kernel it got
    assert "(chosen by timing the whole model)" in choices[0].describe()
    assert choices[0].to_dict()["chosen_by"] == "whole model"
    assert all(layer.kernel == "fp16_weights" and layer.min_rows == 1 for layer in _linears(model))
    assert [rows for _, rows, _ in calls] == list(ROWS)
    layers, _, (chosen, everywhere) = calls[0]
    assert layers == _linears(model)
    assert chosen == [("onednn", 1)] * 3 and everywhere == [("fp16_weights", 1)] * 3
    inputs = torch.randn(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), reference(inputs), rtol=1e-5, atol=1e-5)
    assert len(counted_fp16_calls) == 3


def test_the_per_layer_choice_stays_where_the_whole_model_sweep_is_not_faster(counted_fp16_calls):
    if not _prepacked_here(torch.float32):
        pytest.skip("the oneDNN operators do not run float32 here")
    model = _float16_valued(_model())
    choices = prepack_where_faster(
        model,
        rows=ROWS,
        measure=_measure_by_kernel({"onednn": 1.0, "fp16_weights": 1.5}),
        measure_sweeps=_sweeps_costing(chosen=1.0, everywhere=1.0),
    )
    assert [(c.kernel, c.chosen_by) for c in choices] == [("onednn", "layer")] * 2
    assert all(layer.kernel == "onednn" for layer in _linears(model))


def test_the_whole_model_sweep_moves_only_float16_valued_layers(counted_fp16_calls):
    """A layer whose weights are not float16 values keeps its own choice in both sweeps and after them: here
    nn.Linear, swept as a kernel that never runs from any row count."""
    model = _model()
    _float16_valued(model[0])
    _float16_valued(model[2])
    calls = []

    def measure(layer, rows):  # nn.Linear wins every layer alone
        return 1.0, 2.0

    choices = prepack_where_faster(
        model, rows=ROWS, measure=measure, measure_sweeps=_sweeps_costing(chosen=3.0, everywhere=1.0, calls=calls)
    )
    _, _, (chosen, everywhere) = calls[0]
    assert [kernel for kernel, _ in everywhere] == ["fp16_weights", "fp16_weights", "onednn"]
    assert chosen[2] == everywhere[2] and chosen[2][1] > 2**40  # nn.Linear's kernel at any row count
    assert model[0].kernel == model[2].kernel == "fp16_weights"
    assert type(model[4]) is nn.Linear
    assert sorted((c.in_features, c.chosen_by) for c in choices) == [
        (32, "layer"),
        (32, "whole model"),
        (48, "whole model"),
    ]


def test_a_failing_sweep_leaves_the_layers_prepacked_on_onednn(counted_fp16_calls):
    model = _float16_valued(_model())

    def measure_sweeps(layers, rows, assignments):
        layers[0].kernel, layers[0].min_rows = "fp16_weights", 7  # as a timer does before it fails
        raise RuntimeError("sweep broke")

    with pytest.raises(RuntimeError, match="sweep broke"):
        prepack_where_faster(model, rows=ROWS, measure=lambda layer, rows: (1.0, 2.0), measure_sweeps=measure_sweeps)
    assert all(layer.kernel == "onednn" and layer.min_rows == 1 for layer in _linears(model))


@pytest.mark.parametrize(("everywhere", "moved"), [((0.5, 0.5, 1.2, 1.2), True), ((0.5, 1.2, 1.2, 1.2), False)])
def test_the_whole_model_choice_sums_relative_costs_over_the_row_counts(everywhere, moved, counted_fp16_calls):
    """Float16 everywhere at half the cost for few rows and 1.2 times it for many: kept where the relative costs sum
    to less than one per row count (3.4 of 4), not where they do not (4.1)."""
    if not _prepacked_here(torch.float32):
        pytest.skip("the oneDNN operators do not run float32 here")
    relative = dict(zip(ROWS, everywhere, strict=True))

    def measure_sweeps(layers, rows, assignments):
        return [10.0 * rows, 10.0 * rows * relative[rows]]  # absolute times grow with the rows: ratios decide

    choices = prepack_where_faster(
        _float16_valued(_model()),
        rows=ROWS,
        measure=_measure_by_kernel({"onednn": 1.0, "fp16_weights": 1.5}),
        measure_sweeps=measure_sweeps,
    )
    assert {choice.kernel for choice in choices} == ({"fp16_weights"} if moved else {"onednn"})


def test_nothing_moves_when_the_float16_kernel_failed_during_the_sweeps(counted_fp16_calls, monkeypatch):
    """A float16 kernel disabled mid-sweep timed nn.Linear's computation under its name: no layer moves to it."""
    if not _prepacked_here(torch.float32):
        pytest.skip("the oneDNN operators do not run float32 here")

    def measure_sweeps(layers, rows, assignments):
        monkeypatch.setattr(prepacked_linear_module, "_fp16_operators", None)  # as after a failing call
        return [2.0, 1.0]

    model = _float16_valued(_model())
    choices = prepack_where_faster(
        model,
        rows=ROWS,
        measure=_measure_by_kernel({"onednn": 1.0, "fp16_weights": 1.5}),
        measure_sweeps=measure_sweeps,
    )
    assert [(choice.kernel, choice.chosen_by) for choice in choices] == [("onednn", "layer")] * 2


class _CountedLinear(nn.Linear):
    """A partner's layer that counts its calls (the sweeps call `forward` directly, without hooks)."""

    calls = 0

    def forward(self, input):
        _CountedLinear.calls += 1
        return super().forward(input)


def test_the_default_sweeps_run_the_partner_before_each_pass_and_leave_outputs_unchanged(counted_fp16_calls):
    """The default sweep timer, alone and after a partner: one positive median per assignment, the partner's layers
    run before every pass (warm-ups included), and the model computes what it did."""
    model = prepack_linear_layers(_float16_valued(_model()))
    reference = copy.deepcopy(model)
    layers = _linears(model)
    never = linear_kernel_selection._NEVER
    assignments = ([("onednn", never)] * len(layers), [("fp16_weights", 1)] * len(layers))
    partner = [_CountedLinear(32, 32), _CountedLinear(32, 32)]
    with torch.inference_mode():
        for partner_layers in (None, partner):
            _CountedLinear.calls = 0
            seconds = linear_kernel_selection._time_sweeps(
                layers, 2, assignments, partner_layers=partner_layers, rounds=3
            )
            assert len(seconds) == 2 and all(value > 0 for value in seconds)
            expected = 0 if partner_layers is None else len(partner) * (1 + 3) * len(assignments)
            assert _CountedLinear.calls == expected
    inputs = torch.randn(4, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), reference(inputs), rtol=1e-5, atol=1e-5)


def test_step_layers_are_the_decoders_and_the_heads_in_module_order(family):
    verifier = build_verifier(family)
    layers = linear_kernel_selection._step_layers(verifier)
    decoder_layers = [m for m in verifier.get_decoder().modules() if isinstance(m, nn.Linear)]
    encoder_layers = {id(m) for m in verifier.get_encoder().modules() if isinstance(m, nn.Linear)}
    head = verifier.get_output_embeddings()
    assert layers == decoder_layers + ([head] if head not in decoder_layers else [])
    assert not encoder_layers & {id(layer) for layer in layers}
    model = _model()  # no decoder: every linear layer
    assert linear_kernel_selection._step_layers(model) == _linears(model)


def test_a_drafters_step_layers_include_its_projection_of_the_verifier_states():
    """Every drafter call projects the new prefix rows' verifier states: that layer is judged with the step's."""
    verifier = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=3, decoder_layers=1, prefix_attention="causal", verifier_state_layers=[1, 2]
    )
    layers = linear_kernel_selection._step_layers(drafter)
    decoder_layers = [m for m in drafter.get_decoder().modules() if isinstance(m, nn.Linear)]
    assert layers[0] is drafter.feature_proj
    assert layers[1 : 1 + len(decoder_layers)] == decoder_layers
    assert layers[-1] is drafter.get_output_embeddings()
    plain = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=3, decoder_layers=1)
    assert plain.feature_proj is None  # no projection: the decoder's layers and the head
    plain_decoder = [m for m in plain.get_decoder().modules() if isinstance(m, nn.Linear)]
    assert linear_kernel_selection._step_layers(plain) == plain_decoder + [plain.get_output_embeddings()]


def test_an_encoder_decoder_model_is_judged_by_its_own_decoder_steps(family, counted_fp16_calls, monkeypatch):
    """Without a `measure_sweeps` or a partner, a transformers encoder-decoder model's assignments are timed on its
    own decoder forwards over a cache (one positive median per assignment), a drafter given `runs_after` on sweeps
    after its partner's, and β=1 on the kernels chosen so is still greedy's output."""
    if not _prepacked_here(torch.float32):
        pytest.skip("the oneDNN operators do not run float32 here")
    verifier = _float16_valued(build_verifier(family).eval())
    assert linear_kernel_selection._runs_decoder_steps(verifier)
    onednn_alone = _measure_by_kernel({"onednn": 1.0, "fp16_weights": 1.5})  # so that float16 is left to the model
    timers = []
    for name in ("_time_decoder_steps", "_time_sweeps"):
        timer = getattr(linear_kernel_selection, name)

        def spy(*args, _timer=timer, _name=name, **kwargs):
            timers.append(_name)
            return _timer(*args, **kwargs)

        monkeypatch.setattr(linear_kernel_selection, name, spy)
    prepack_where_faster(verifier, rows=(1, 3), measure=onednn_alone)
    assert timers and set(timers) == {"_time_decoder_steps"}
    layers = linear_kernel_selection._step_layers(verifier)
    prepacked = [layer for layer in layers if isinstance(layer, PrepackedLinear)]
    never = linear_kernel_selection._NEVER
    assignments = ([("onednn", never)] * len(prepacked), [("fp16_weights", 1)] * len(prepacked))
    with torch.inference_mode():
        seconds = linear_kernel_selection._time_decoder_steps(verifier, prepacked, 3, assignments, rounds=2, calls=2)
    assert len(seconds) == 2 and all(value > 0 for value in seconds)
    torch.manual_seed(0)
    drafter = _float16_valued(SpecDrafterModel.from_verifier(verifier, max_draft_tokens=3, decoder_layers=1).eval())
    timers.clear()
    prepack_where_faster(drafter, rows=(1, 3), measure=onednn_alone, runs_after=verifier)
    assert timers and set(timers) == {"_time_sweeps"}
    inputs = make_source_batch(2, pad_token_id=verifier.config.pad_token_id)
    greedy = verifier.generate(**inputs, do_sample=False, max_new_tokens=12)
    output = verifier.generate(
        **inputs, do_sample=False, max_new_tokens=12, num_draft_tokens=3, custom_generate=speculative_generate,
        drafter=drafter,
    )  # fmt: skip
    assert torch.equal(output, greedy)


def test_a_model_that_reads_no_token_ids_is_swept_not_stepped():
    """Speech and vision encoder-decoders (`main_input_name` other than `input_ids`) cannot be given random ids."""
    verifier = build_verifier("bart")
    assert linear_kernel_selection._runs_decoder_steps(verifier)
    verifier.main_input_name = "input_features"
    assert not linear_kernel_selection._runs_decoder_steps(verifier)
    assert not linear_kernel_selection._runs_decoder_steps(_model())


def test_decoder_steps_fit_the_models_positions():
    """A model of 8 positions: a 3-token step runs over a shorter cache and source; a step of 8 tokens cannot follow
    a cached one, and that row count is swept instead."""
    if not _prepacked_here(torch.float32):
        pytest.skip("the oneDNN operators do not run float32 here")
    verifier = prepack_linear_layers(build_verifier("bart", max_position_embeddings=8).eval())
    layers = linear_kernel_selection._step_layers(verifier)
    assignments = ([("onednn", linear_kernel_selection._NEVER)] * len(layers), [("onednn", 1)] * len(layers))
    with torch.inference_mode():
        for rows in (3, 8):
            seconds = linear_kernel_selection._time_decoder_steps(
                verifier, layers, rows, assignments, rounds=1, calls=1
            )
            assert len(seconds) == 2 and all(value > 0 for value in seconds)
