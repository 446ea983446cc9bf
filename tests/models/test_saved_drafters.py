"""Drafters saved by earlier code load and draft identically: the tiny fixtures of `tests/fixtures/legacy_drafters`
(written by the code before the redesign, with the script recorded in their README).

Each fixture records the state-dict keys, the config as saved (under the earlier field names, which load under the
current ones), the drafts (ids, scores over the verifier's vocabulary, confidence) of a fixed sequence of drafting
calls, and the output of speculative `generate()`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

from specdec_hf import SpecDrafterAdapter, SpecDrafterModel, speculative_generate
from specdec_hf.models.configuration_spec_drafter import LEGACY_FIELD_NAMES

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "legacy_drafters"
GREEDY = dict(do_sample=False, num_beams=1)


def _check_config(loaded, saved: dict) -> None:
    """Every field of the saved config.json is read back with its value (under its current name)."""
    assert {"block_size", "prefix_feature_layers"} <= set(saved)  # saved under the earlier names
    for name, value in saved.items():
        if name in ("architectures", "transformers_version", "dtype", "model_type"):
            continue
        assert getattr(loaded.config, LEGACY_FIELD_NAMES.get(name, name)) == value, name


def _teacher_forced_states(verifier, inputs, sequences, layers):
    with torch.no_grad():
        outputs = verifier(**inputs, decoder_input_ids=sequences, output_hidden_states=True, use_cache=False)
    return torch.cat([outputs.decoder_hidden_states[index] for index in layers], dim=-1)


def _replay(verifier, drafter, inputs, reference, calls):
    """Run the recorded sequence of drafting calls on one drafting state; yield each proposal and its record."""
    adapter = SpecDrafterAdapter(drafter)
    layers = adapter.verifier_state_layers
    states = _teacher_forced_states(verifier, inputs, reference, layers) if layers else None
    with torch.no_grad():
        encoder_output = verifier.get_encoder()(**inputs).last_hidden_state
        state = adapter.init_drafting_state(inputs["input_ids"], inputs["attention_mask"], encoder_output)
        for call in calls:
            longest = max(call["lengths"])
            verifier_states = states[:, :longest] if layers and longest > 1 else None
            lengths = torch.tensor(call["lengths"])
            proposal = adapter.propose(state, reference[:, :longest], lengths, call["k"], verifier_states)
            state = proposal.state
            yield proposal, call


@pytest.mark.parametrize("name", ["states_reduced_head", "own_encoder"])
def test_drafter_saved_by_earlier_code_loads_and_drafts_identically(name):
    directory = FIXTURES / name
    expected = json.loads((directory / "expected.json").read_text())
    expected_scores = load_file(directory / "expected_logits.safetensors")
    verifier = AutoModelForSeq2SeqLM.from_pretrained(directory / "verifier", dtype=torch.float32).eval()
    drafter = SpecDrafterModel.from_pretrained(directory / "drafter", dtype=torch.float32).eval()
    assert sorted(drafter.state_dict()) == expected["state_dict_keys"]
    _check_config(drafter, expected["config"])

    inputs = {key: torch.tensor(value) for key, value in expected["source"].items()}
    reference = torch.tensor(expected["reference"])
    replayed = 0
    for index, (proposal, call) in enumerate(_replay(verifier, drafter, inputs, reference, expected["calls"])):
        assert proposal.draft_ids.tolist() == call["draft_ids"]
        torch.testing.assert_close(proposal.draft_logits, expected_scores[f"call_{index}"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(proposal.confidence(), torch.tensor(call["confidence"]), atol=1e-6, rtol=1e-5)
        replayed += 1
    assert replayed == len(expected["calls"]) == 4

    for k, record in expected["generate"].items():
        output = verifier.generate(
            **inputs,
            **GREEDY,
            max_new_tokens=12,
            custom_generate=speculative_generate,
            drafter=drafter,
            num_draft_tokens=None if k == "None" else int(k),
            return_dict_in_generate=True,
        )
        stats = output.speculative_stats
        assert output.sequences.tolist() == record["sequences"]
        assert stats.accepted_tokens == record["accepted_tokens"]
        assert stats.drafted_tokens == record["drafted_tokens"]
        assert stats.iterations == record["iterations"]
        assert stats.accepted_at_position[: len(record["accepted_at_position"])] == record["accepted_at_position"]
