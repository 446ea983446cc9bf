"""benchmarks/drafter_call_splits.py: teacher-forced drafts at decoding's calls are decoding's drafts."""

from __future__ import annotations

import pytest
import torch
from conftest import build_verifier, load_repository_script

from specdec_hf import SpecDrafterModel, enable_speculative_decoding
from specdec_hf.training import distill_greedy_outputs, fit_drafter_in_memory


@pytest.fixture(scope="module")
def script():
    return load_repository_script("benchmarks/drafter_call_splits.py", "drafter_call_splits")


def test_teacher_forced_drafts_at_the_calls_are_what_decoding_accepted(script):
    """At β=1 a call drafts from the same prefix and verifier states as the teacher-forced pass: the drafts decoding
    accepted are the leading right drafts at its calls, so the two profiles differ only in where they look."""
    model = build_verifier("marian")
    generator = torch.Generator().manual_seed(0)
    sources = torch.randint(4, 99, (64, 10), generator=generator)
    mask = torch.ones_like(sources)
    targets, lengths = distill_greedy_outputs(model, sources, mask, max_new_tokens=16)
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(
        model, max_draft_tokens=4, decoder_layers=1, prefix_attention="causal", use_verifier_encoder=True,
        verifier_state_layers=[1, 2],
    )  # fmt: skip
    fit_drafter_in_memory(drafter, sources[:56], mask[:56], targets[:56], lengths[:56], steps=100, verifier=model)
    drafter.eval()
    enable_speculative_decoding(model)

    accepted = every = 0
    for row in range(56, 64):
        inputs = {"input_ids": sources[row : row + 1], "attention_mask": mask[row : row + 1]}
        scores = script.leading_correct(model, drafter, inputs, 4, 16)
        length = model.generate(**inputs, do_sample=False, max_new_tokens=16).shape[1]
        assert scores.runs.shape == (length - 1,) and 0 <= int(scores.runs.min()) <= int(scores.runs.max()) <= 4
        assert scores.calls == sorted(set(scores.calls)) and all(0 <= call < length - 1 for call in scores.calls)
        # near max_new_tokens decoding drafts fewer than 4 (a call at split index c has c + 1 tokens of the 17 the
        # length allows, the last one the bonus): count the teacher-forced run only as far as decoding drafted
        budgets = torch.tensor([min(4, 15 - call) for call in scores.calls], dtype=torch.long)
        assert scores.accepted == int(torch.minimum(scores.runs[scores.calls], budgets).sum())
        accepted += scores.accepted
        every += int(scores.runs.sum())
    print(f"accepted in decoding {accepted}, right at every split point {every}")
    assert accepted > 0 and every >= accepted  # the trained drafter gets drafts accepted


def test_acceptance_profile_counts_leading_runs():
    script = load_repository_script("benchmarks/drafter_call_splits.py", "drafter_call_splits")
    assert script.acceptance_profile(torch.tensor([0, 1, 3, 4]), 4) == [0.75, 0.5, 0.5, 0.25]
    assert script.acceptance_profile(torch.tensor([], dtype=torch.long), 4) == []
