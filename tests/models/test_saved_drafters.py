"""Saved drafters load and draft identically: the tiny drafters of `tests/fixtures/saved_drafters`, one per design
the code supports, each saved with `save_pretrained` together with the drafts it made.

Each `<name>/` holds the drafter as `save_pretrained` wrote it (`config.json`, `model.safetensors`), the inputs of
its drafting calls (`inputs.safetensors`: the source, the verifier's encoder output and decoder states, the committed
tokens) and `expected.json` (the drafts, as verifier ids, and their confidence, of a fixed sequence of drafting calls
on one drafting state, so that the prefix cache of a causal drafter is read across calls).

The fixtures were written by `write_fixtures()` below, with random weights (seeded) and the code of the version they
test. A deliberate change of the saved format or of drafting breaks this test: rewrite them with
`PYTHONPATH=tests .venv/bin/python tests/models/test_saved_drafters.py` and say why in the commit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, make_source_batch
from safetensors.torch import load_file, save_file
from tiny_drafters import random_prefixes, tiny_drafter

from specdec_hf import SpecDrafterAdapter, SpecDrafterModel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "saved_drafters"
# (committed tokens of each row, k) of each drafting call; prefixes only grow, as in decoding
CALLS = [([1, 1], 4), ([3, 2], 3), ([5, 5], 4), ([8, 6], 2)]
SMALL = dict(max_position_embeddings=16)  # enough for the 11 source tokens and the calls: small files


# fixture name -> the dtype it is saved in (the shipped drafters are float16)
DTYPES = {
    "own_encoder": torch.float32,
    "family_encoder": torch.float16,
    "verifier_encoder_states": torch.float16,
    "states_reduced_head": torch.float16,
}


def _build(name: str) -> SpecDrafterModel:
    """The drafter of fixture `name` as first built, before saving."""
    if name == "own_encoder":  # the compact encoder, a bidirectional prefix, the tied full head
        return tiny_drafter(seed=1, d_model=16, **SMALL)
    if name == "family_encoder":  # the verifier family's encoder (BartEncoder) with the verifier's first layer
        verifier = build_verifier("bart")
        return SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, encoder_layers=1, decoder_layers=1)
    if name == "verifier_encoder_states":  # as the shipped summarization drafter: no encoder, EAGLE-style states
        return tiny_drafter(
            seed=3,
            **SMALL,
            use_verifier_encoder=True,
            verifier_d_model=48,  # another width than the drafter's: the verifier's output is projected
            prefix_attention="causal",
            verifier_state_layers=[1, -1],
        )
    if name == "states_reduced_head":  # as the shipped translation drafter, with a reduced head
        drafter = tiny_drafter(
            seed=4,
            **SMALL,
            use_verifier_encoder=True,
            prefix_attention="causal",
            verifier_state_layers=[-1],
            draft_vocab_size=40,
            tie_word_embeddings=False,
        )
        drafter.draft_vocab_ids.copy_(torch.randperm(VOCAB_SIZE, generator=torch.Generator().manual_seed(4))[:40])
        return drafter
    raise ValueError(f"unknown fixture {name!r}")


def _inputs(drafter: SpecDrafterModel) -> dict[str, torch.Tensor]:
    """Fixed inputs of the drafting calls, of `drafter`'s widths."""
    config = drafter.config
    verifier_width = config.verifier_d_model or config.d_model
    generator = torch.Generator().manual_seed(0)
    source = make_source_batch(2)
    inputs = {
        **source,
        "encoder_hidden_states": torch.randn(*source["input_ids"].shape, verifier_width, generator=generator),
        "prefix_ids": random_prefixes([9, 9], seed=0),
    }
    if config.verifier_state_layers:
        width = len(config.verifier_state_layers) * verifier_width
        inputs["verifier_states"] = torch.randn(2, 9, width, generator=generator)
    return inputs


def _draft(drafter: SpecDrafterModel, inputs: dict[str, torch.Tensor]) -> list[dict]:
    """The drafts of the `CALLS` on one drafting state: ids and confidence of each call."""
    adapter = SpecDrafterAdapter(drafter)
    state = adapter.init_drafting_state(inputs["input_ids"], inputs["attention_mask"], inputs["encoder_hidden_states"])
    drafts = []
    for lengths, k in CALLS:
        longest = max(lengths)
        states = inputs["verifier_states"][:, :longest] if "verifier_states" in inputs and longest > 1 else None
        proposal = adapter.propose(state, inputs["prefix_ids"][:, :longest], torch.tensor(lengths), k, states)
        state = proposal.state
        drafts.append({"draft_ids": proposal.draft_ids.tolist(), "confidence": proposal.confidence().tolist()})
    return drafts


def _load(directory: Path) -> SpecDrafterModel:
    """The saved drafter in float32 (whatever dtype it was saved in), checking that every weight was read."""
    drafter, info = SpecDrafterModel.from_pretrained(directory, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    return drafter.eval()


def write_fixtures() -> None:
    """(Re)write every fixture: build, save, load back and record the loaded drafter's drafts."""
    for name, dtype in DTYPES.items():
        directory = FIXTURES / name
        shutil.rmtree(directory, ignore_errors=True)
        drafter = _build(name).eval()
        drafter.to(dtype).save_pretrained(directory)
        inputs = _inputs(drafter)
        save_file(inputs, directory / "inputs.safetensors")
        drafts = _draft(_load(directory), inputs)
        calls = ",\n".join(json.dumps(draft) for draft in drafts)  # one call a line
        (directory / "expected.json").write_text(f'{{"calls": [\n{calls}\n]}}\n')


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_saved_drafter_loads_and_drafts_identically(name):
    directory = FIXTURES / name
    expected = json.loads((directory / "expected.json").read_text())["calls"]
    drafts = _draft(_load(directory), load_file(directory / "inputs.safetensors"))
    for call, (draft, record) in enumerate(zip(drafts, expected, strict=True)):
        assert draft["draft_ids"] == record["draft_ids"], call
        torch.testing.assert_close(
            torch.tensor(draft["confidence"]), torch.tensor(record["confidence"]), atol=1e-6, rtol=1e-5
        )


if __name__ == "__main__":
    write_fixtures()
