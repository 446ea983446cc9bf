"""A drafter whose default k is `"auto"` (the shipped drafters'): the config, the drafting contract, `generate()`, the
source-copy drafter and the export script take it, and anything else is refused with the fix."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, generate_with_drafter, load_repository_script, make_source_batch
from oracle_drafters import OracleDrafter

from specdec_hf import SourceCopyDrafter, SpecDrafterConfig, SpecDrafterModel
from specdec_hf.drafting import validate_drafter
from specdec_hf.generation import api

GREEDY = dict(do_sample=False, num_beams=1)

pytestmark = pytest.mark.usefixtures("fresh_draft_length_measurements")


class RecordingSchedule(api.DraftLengthSchedule):
    """The schedule `generate()` builds, remembering that it was built (and for which largest k)."""

    built: list[int] = []

    def __init__(self, verifier, drafter_key, max_draft_tokens, *args, **kwargs):
        RecordingSchedule.built.append(max_draft_tokens)
        super().__init__(verifier, drafter_key, max_draft_tokens, *args, **kwargs)


@pytest.fixture
def recording_schedule(monkeypatch):
    RecordingSchedule.built = []
    monkeypatch.setattr(api, "DraftLengthSchedule", RecordingSchedule)
    return RecordingSchedule


def test_the_config_takes_auto_and_refuses_another_word(tmp_path):
    config = SpecDrafterConfig(vocab_size=VOCAB_SIZE, max_draft_tokens=4, num_draft_tokens="auto")
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["num_draft_tokens"] == "auto"
    assert SpecDrafterConfig.from_pretrained(tmp_path).num_draft_tokens == "auto"
    for bad in ("fast", 0, 5):
        with pytest.raises(
            ValueError, match=r"`num_draft_tokens` must be between 1 and `max_draft_tokens` \(4\) or 'auto'"
        ):
            SpecDrafterConfig(vocab_size=VOCAB_SIZE, max_draft_tokens=4, num_draft_tokens=bad)


def test_the_contract_takes_auto_and_refuses_another_word():
    drafter = OracleDrafter(torch.zeros(1, 4, dtype=torch.long), VOCAB_SIZE, 3, "right")
    drafter.num_draft_tokens, drafter.max_draft_tokens = "auto", 3
    validate_drafter(drafter, VOCAB_SIZE)
    drafter.num_draft_tokens = "fast"
    with pytest.raises(ValueError, match=r"`num_draft_tokens` .* possibly 'auto' \(got .*'fast'"):
        validate_drafter(drafter, VOCAB_SIZE)
    drafter.num_draft_tokens, drafter.max_draft_tokens = "auto", None  # no limit: which k could auto take?
    with pytest.raises(ValueError, match=r"`num_draft_tokens='auto'` but no `max_draft_tokens`.*integer"):
        validate_drafter(drafter, VOCAB_SIZE)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_drafter_saying_auto_chooses_k_as_decoding_runs_and_stays_greedy(recording_schedule, tmp_path, batch_size):
    model = build_verifier("bart")
    inputs = make_source_batch(batch_size, seed=2, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=12)
    torch.manual_seed(0)
    drafter = SpecDrafterModel.from_verifier(model, max_draft_tokens=3, decoder_layers=1, num_draft_tokens="auto")
    drafter.save_pretrained(tmp_path)
    drafter = SpecDrafterModel.from_pretrained(tmp_path).eval()  # the saved default survives the round trip
    output = generate_with_drafter(model, inputs, drafter, max_new_tokens=12)
    assert torch.equal(output.sequences, reference)
    assert recording_schedule.built == [3]  # up to the drafter's max_draft_tokens
    generate_with_drafter(model, inputs, drafter, max_new_tokens=12, num_draft_tokens=2)  # a fixed k for one call
    assert recording_schedule.built == [3]


def test_a_fixed_default_k_builds_no_schedule(recording_schedule):
    model = build_verifier("bart")
    inputs = make_source_batch(1, seed=2, pad_token_id=model.config.pad_token_id)
    drafter = SpecDrafterModel.from_verifier(model, max_draft_tokens=3, decoder_layers=1, num_draft_tokens=2).eval()
    stats = generate_with_drafter(model, inputs, drafter, max_new_tokens=8).speculative_stats
    assert recording_schedule.built == [] and stats.num_draft_tokens == 2 and stats.drafter_calls > 0


def test_the_source_copy_takes_its_fallbacks_auto(recording_schedule):
    model = build_verifier("bart")
    drafter = SpecDrafterModel.from_verifier(model, max_draft_tokens=3, decoder_layers=1, num_draft_tokens="auto")
    assert SourceCopyDrafter.from_verifier(model, fallback=drafter).num_draft_tokens == "auto"
    alone = SourceCopyDrafter.from_verifier(model, num_draft_tokens="auto")
    assert (alone.num_draft_tokens, alone.max_draft_tokens) == ("auto", 8)  # its default k the largest auto takes
    inputs = make_source_batch(2, seed=3, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=10)
    assert torch.equal(generate_with_drafter(model, inputs, alone, max_new_tokens=10).sequences, reference)
    assert recording_schedule.built == [8]  # k chosen as decoding runs, up to 8
    with pytest.raises(ValueError, match=r"at most the drafter's 8 \(its `max_draft_tokens`\), got 9: lower"):
        generate_with_drafter(model, inputs, alone, max_new_tokens=10, num_draft_tokens=9)
    with pytest.raises(ValueError, match=r"`num_draft_tokens` must be an integer >= 1 or 'auto', got 'fast'"):
        SourceCopyDrafter.from_verifier(model, num_draft_tokens="fast")


def test_the_export_script_sets_auto_in_the_config_and_the_card(tmp_path):
    from specdec_hf.training import write_model_card

    export_script = load_repository_script("scripts/export_demo_pair.py", "export_demo_pair")
    verifier = build_verifier("marian")
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1, use_verifier_encoder=True)
    source = tmp_path / "run"
    drafter.save_pretrained(source)
    write_model_card(source, drafter, "runs/v", "tiny distilled data", 7, {"tokens_per_iteration": 1.5})
    export_script.export_drafter(source, tmp_path / "shipped", torch.float16, "models/v", "auto")
    exported = SpecDrafterModel.from_pretrained(tmp_path / "shipped")
    assert exported.config.num_draft_tokens == "auto"
    card = (tmp_path / "shipped" / "README.md").read_text(encoding="utf-8")
    assert "(a number chosen at every iteration unless `generate()` gets another" in card
    export_script.export_drafter(tmp_path / "shipped", tmp_path / "again", torch.float16, "models/v", 2)
    assert "(2 unless `generate()` gets another" in (tmp_path / "again" / "README.md").read_text(encoding="utf-8")
