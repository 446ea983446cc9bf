"""Timing hooks, the timing drafter wrapper and the memory measurement (no timed assertions)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from conftest import build_verifier, make_source_batch

from specdec_hf import SpecDrafterModel, speculative_generate
from specdec_hf.evaluation import ModuleTimer, TimedDrafter, measure_peak_memory, parameter_bytes
from specdec_hf.evaluation.memory import peak_from_profiler_events

CPU = torch.device("cpu")


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(self.inner(x))


def test_module_timer_counts_outermost_calls_and_removes_its_hooks():
    model = Outer()
    with ModuleTimer([model.inner, model], CPU) as timer:
        model.inner(torch.zeros(1, 4))  # alone: counted for `inner`
        model(torch.zeros(1, 4))  # nested calls of `inner` are inside `model`: counted once, for `model`
    assert timer.calls == [1, 1]
    assert timer.total_s > 0
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not model.inner._forward_hooks and not model.inner._forward_pre_hooks


class CountingDrafter:
    vocab_size = 11
    num_draft_tokens = 3

    def __init__(self):
        self.proposed = 0

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states):
        return "state"

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        self.proposed += 1
        return "proposal"

    def select_rows(self, state, rows):
        return state


def test_timed_drafter_delegates():
    inner = CountingDrafter()
    drafter = TimedDrafter(inner, CPU)
    assert (drafter.vocab_size, drafter.num_draft_tokens) == (11, 3)
    assert drafter.verifier_state_layers is None and drafter.max_draft_tokens is None  # the interface's defaults
    state = drafter.init_drafting_state(None, None, torch.zeros(1, 2, 4))
    assert drafter.propose(state, None, None, 3) == "proposal"
    assert drafter.select_rows(state, None) == "state"
    assert inner.proposed == drafter.propose_calls == 1
    assert drafter.total_s > 0


def test_timed_drafter_passes_verifier_states_on():
    """Wrapped, a drafter that reads the verifier's states decodes as alone (β = 3: the drafts shape the output)."""
    verifier = build_verifier("bart")
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        verifier,
        max_draft_tokens=4,
        decoder_layers=1,
        prefix_attention="causal",
        verifier_state_layers=[-1],
        use_verifier_encoder=True,
    ).eval()
    timed_drafter = TimedDrafter(drafter, CPU)
    assert timed_drafter.verifier_state_layers == [-1] and timed_drafter.max_draft_tokens == 4
    inputs = make_source_batch(2, seed=1, pad_token_id=verifier.config.pad_token_id)
    kwargs = dict(
        max_new_tokens=12, custom_generate=speculative_generate, beta=3, tau=1.0, return_dict_in_generate=True
    )
    alone = verifier.generate(**inputs, **kwargs, drafter=drafter)
    wrapped = verifier.generate(**inputs, **kwargs, drafter=timed_drafter)
    assert torch.equal(wrapped.sequences, alone.sequences)
    assert wrapped.speculative_stats.accepted_tokens == alone.speculative_stats.accepted_tokens
    assert timed_drafter.propose_calls == alone.speculative_stats.drafter_calls and timed_drafter.total_s > 0


def event(start, delta):
    return SimpleNamespace(time_range=SimpleNamespace(start=start), self_cpu_memory_usage=delta)


def test_peak_from_profiler_events():
    # allocate 100, allocate 50 (150 live), free 100, allocate 80 (130 live), free all; given out of order
    events = [event(3, -100), event(1, 100), event(2, 50), event(4, 80), event(5, -130), event(0, 0)]
    assert peak_from_profiler_events(events) == 150
    assert peak_from_profiler_events([]) == 0
    assert peak_from_profiler_events([event(0, -10)]) == 0


def test_measure_peak_memory_on_cpu_sees_live_tensors():
    size = 256 * 1024  # floats: 1 MiB each

    def work():
        a = torch.ones(size)
        b = torch.ones(size)
        return float((a + b).sum())  # a, b and a + b live together: 3 MiB

    peak = measure_peak_memory(work, CPU)
    assert 3 * 4 * size <= peak < 5 * 4 * size


def test_parameter_bytes_counts_shared_weights_once():
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    assert parameter_bytes(model) == 10 * 4 * 4
