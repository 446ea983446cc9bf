"""Host synchronisations per speculative iteration, so that they cannot creep back.

On a GPU every read of a device value by the host waits until the device is idle. `HostSyncCounter` counts the
calls of the package's own code that do so, per verifier call; the set-up before the first verification and the
wrap-up after the last are left out, so that the count does not depend on a run's length. What the counter cannot
see (calls that pass no torch function it hooks) is checked by reading the per-iteration code. The counts are the
accelerator's: on the CPU, where a read waits for nothing, greedy iterations settle on the host instead
(`host_outcome`), so these tests run the accelerator's tensor path.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from oracle_drafters import OracleDrafter

import specdec_hf.acceptance
import specdec_hf.generation.processor_gating
import specdec_hf.generation.spec_drafter_adapter
import specdec_hf.generation.speculative_loop
from specdec_hf import SourceCopyDrafter, SpecDrafterModel, speculative_generate
from specdec_hf.evaluation.host_syncs import HostSyncCounter
from specdec_hf.generation.host_outcome import settling_on_tensors

GREEDY_BUDGET = 2
EOS = 7  # a frequent token of the tiny verifier: rows finish at different iterations


@pytest.fixture(autouse=True)
def tensor_path():
    """The iterations settled on tensors, as on an accelerator, although these tests run on the CPU."""
    with settling_on_tensors():
        yield


@pytest.fixture(scope="module")
def verifier():
    return build_verifier("bart", eos_token_id=EOS)


def _spec_drafter(verifier, max_draft_tokens: int = 10) -> SpecDrafterModel:
    """A drafter through its adapter, with everything that drafts per iteration: the verifier's states, a causal
    prefix cache and a reduced head."""
    torch.manual_seed(0)
    return SpecDrafterModel.from_verifier(
        verifier,
        max_draft_tokens=max_draft_tokens,
        encoder_layers=1,
        decoder_layers=1,
        prefix_attention="causal",
        verifier_state_layers=[1, 2],
        draft_vocab_ids=list(range(0, VOCAB_SIZE, 2)),
    )


def _counted(verifier, source, drafter, num_draft_tokens: int, **kwargs) -> tuple[list[int], object]:
    """The counted calls after each verification but the last (the wrap-up), and the run's statistics."""
    with HostSyncCounter(verifier) as counter:
        output = verifier.generate(
            **source,
            max_new_tokens=40,
            custom_generate=speculative_generate,
            drafter=drafter,
            num_draft_tokens=num_draft_tokens,
            return_dict_in_generate=True,
            **kwargs,
        )
    per_iteration = counter.per_iteration()[:-1]
    assert len(per_iteration) == output.speculative_stats.verifier_calls - 1 and len(per_iteration) > 3
    return per_iteration, output.speculative_stats


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("drafter_name", ["spec_drafter", "oracle", "source_copy"])
def test_greedy_iteration_syncs_at_most_twice(verifier, batch_size, drafter_name):
    source = make_source_batch(batch_size, seed=1)
    if drafter_name == "oracle":
        reference = verifier.generate(**source, do_sample=False, max_new_tokens=40)
        drafter = OracleDrafter(reference, VOCAB_SIZE, accuracy="half")
        relaxation = {}
    elif drafter_name == "source_copy":  # per-row draft counts (`num_drafts`)
        # a source made of the verifier's own output twice over: it continues many prefixes, not all
        output = verifier.generate(**source, do_sample=False, max_new_tokens=20)[:, 1:]
        source = {"input_ids": torch.cat([output, output], dim=1)}
        # the device's search, as on a GPU (on a CPU the copy may read the prefix on the host: free there)
        drafter = SourceCopyDrafter.from_verifier(verifier, num_draft_tokens=4, cpu_index=False)
        relaxation = dict(beta=4, tau=3.0)
    else:
        drafter = _spec_drafter(verifier)
        relaxation = dict(beta=4, tau=3.0)  # the untrained drafter's drafts are accepted now and then
    per_iteration, stats = _counted(verifier, source, drafter, 4, do_sample=False, **relaxation)
    if batch_size > 1:  # the rows advanced by different amounts: the ragged layout was exercised
        assert len(set(stats.accepted_tokens)) > 1, stats
    assert max(per_iteration) <= GREEDY_BUDGET, per_iteration


def test_sampling_iteration_syncs_do_not_grow_with_k(verifier):
    source = make_source_batch(4, seed=1)
    drafter = _spec_drafter(verifier)
    most = {}
    for num_draft_tokens in (4, 10):
        torch.manual_seed(0)
        per_iteration, _ = _counted(verifier, source, drafter, num_draft_tokens, do_sample=True, top_k=20)
        most[num_draft_tokens] = max(per_iteration)  # fewer where an iteration drafts nothing (k = 0 at the end)
    assert most[4] == most[10], most


def test_sampling_with_the_source_copy_before_a_drafter_syncs_as_the_drafter_alone(verifier):
    """The combined proposal's scores (copied rows certain, the fallback's its own) cost no host read of their own."""
    source = make_source_batch(4, seed=1)
    output = verifier.generate(**source, do_sample=False, max_new_tokens=20)[:, 1:]
    source = {"input_ids": torch.cat([output, output], dim=1)}  # continues many prefixes, not all
    most = {}
    for name in ("drafter", "source_copy_then_drafter"):
        drafter = _spec_drafter(verifier)
        if name == "source_copy_then_drafter":
            # the device's search, as on a GPU (on a CPU the copy may read the prefix on the host: free there)
            drafter = SourceCopyDrafter.from_verifier(verifier, num_draft_tokens=4, fallback=drafter, cpu_index=False)
        torch.manual_seed(0)
        per_iteration, _ = _counted(verifier, source, drafter, 4, do_sample=True, top_k=20)
        most[name] = max(per_iteration)
    # the copy's own host read (whether any row needs the fallback) and the widest draft count are its only extras
    assert most["source_copy_then_drafter"] <= most["drafter"] + 2, most


# --------------------------------------------------------------------------------------------------------------
# By reading: what the counter cannot see
# --------------------------------------------------------------------------------------------------------------

_PER_ITERATION_MODULES = (
    specdec_hf.generation.speculative_loop,
    specdec_hf.acceptance,
    specdec_hf.generation.processor_gating,
    specdec_hf.generation.position_processing,
    specdec_hf.generation.spec_drafter_adapter,
)


def _functions() -> dict[str, list[ast.FunctionDef]]:
    """Every function and method of the modules an iteration runs, by name."""
    functions: dict[str, list[ast.FunctionDef]] = {}
    for module in _PER_ITERATION_MODULES:
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.FunctionDef):
                functions.setdefault(node.name, []).append(node)
    return functions


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _per_iteration_code() -> list[ast.AST]:
    """The body of the loop's `while`, and every function of those modules it reaches by name, called or handed on
    (`functools.partial(verify, ...)`) (the adapter's `propose` and `select_rows` among them)."""
    source = textwrap.dedent(inspect.getsource(specdec_hf.generation.speculative_loop.run_speculative_loop))
    loop = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.While))
    functions = _functions()
    reached, pending, seen = [loop], [loop], set()
    while pending:
        for node in ast.walk(pending.pop()):
            if isinstance(node, ast.Call):
                name = _called_name(node)
            else:
                name = node.id if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) else None
            if name in functions and name not in seen:
                seen.add(name)
                reached += functions[name]
                pending += functions[name]
    assert {"draft", "verify", "accept", "judge_per_position", "commit", "propose"} <= seen
    return reached


def _int_names(function: ast.AST) -> set[str]:
    """Names a function binds from a tensor's shape (Python ints)."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and "shape" in ast.unparse(node.value):
            for target in node.targets:
                names |= {name.id for name in ast.walk(target) if isinstance(name, ast.Name)}
    return names


def _syncing_calls(code: ast.AST) -> list[str]:
    """`.cpu()`, `torch.equal`, one-argument `torch.where`, and `repeat_interleave` with repeats that are not
    a constant or a shape."""
    int_names = _int_names(code)
    found = []
    for node in ast.walk(code):
        if not isinstance(node, ast.Call):
            continue
        name = _called_name(node)
        if name in ("cpu", "equal") or (name == "where" and len(node.args) + len(node.keywords) == 1):
            found.append(ast.unparse(node))
        if name == "repeat_interleave":
            repeats = node.args[0] if node.args else next(k.value for k in node.keywords if k.arg == "repeats")
            if not (isinstance(repeats, ast.Constant) or (isinstance(repeats, ast.Name) and repeats.id in int_names)):
                found.append(ast.unparse(node))
    return found


def test_per_iteration_code_reads_nothing_back_by_other_means():
    found = [call for code in _per_iteration_code() for call in _syncing_calls(code)]
    assert found == []


def test_the_reading_check_finds_what_it_looks_for():
    code = ast.parse(
        "def f(x, counts):\n"
        "    rows, k = x.shape\n"
        "    a = x.cpu()\n    b = torch.equal(x, x)\n    c = torch.where(x)\n"
        "    d = x.repeat_interleave(counts, dim=0)\n    e = x.repeat_interleave(k, dim=0)\n"
    )
    assert _syncing_calls(code) == [
        "x.cpu()",
        "torch.equal(x, x)",
        "torch.where(x)",
        "x.repeat_interleave(counts, dim=0)",
    ]
