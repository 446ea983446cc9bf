"""`stop_strings=` with a tokenizer stops rows where greedy decoding stops them, on both routes into the loop.

transformers drops `generate(tokenizer=...)` before calling a `custom_generate` callable; `enable_speculative_decoding`
hands it over as `stop_strings_tokenizer=`, which the `custom_generate=` route takes directly. Stop strings need a
real tokenizer (`StopStringCriteria` reads its token strings), so this runs on the shipped demo pair.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, StopStringCriteria

from specdec_hf import SpecDrafterModel, enable_speculative_decoding, speculative_generate

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo-en-de"
SOURCES = ["Open the file and save the changes.", "The server restarts every night after the backup."]
GREEDY = dict(do_sample=False, num_beams=1, max_new_tokens=24)
# a fixed k: the demo drafter's default ("auto") may decode a call without drafting, which would leave stopping inside
# an iteration that accepts several tokens untested on a loaded machine
DRAFTING = dict(num_draft_tokens=2)


@pytest.fixture(scope="module")
def demo():
    verifier = AutoModelForSeq2SeqLM.from_pretrained(DEMO / "verifier", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "verifier")
    drafter = SpecDrafterModel.from_pretrained(DEMO / "drafter", dtype=torch.float32).eval()
    return verifier, tokenizer, drafter


def _stop_word(verifier, tokenizer, inputs) -> str:
    """The second word greedy decoding writes for the first source: the stop ends that row early."""
    text = tokenizer.decode(verifier.generate(**inputs, **GREEDY)[0], skip_special_tokens=True)
    return text.split()[1]


@pytest.mark.parametrize("eos", ["eos", "no eos"])
@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.parametrize("route", ["drafter", "custom_generate"])
def test_stop_strings_stop_as_greedy(demo, batch_size, route, eos):
    """Also without an EOS token, where greedy goes on decoding a stopped row while another is unfinished."""
    verifier, tokenizer, drafter = demo
    if eos == "no eos":
        verifier = copy.deepcopy(verifier)
        verifier.generation_config.eos_token_id = None
    inputs = tokenizer(SOURCES[:batch_size], return_tensors="pt", padding=True)
    stop = {"stop_strings": [_stop_word(verifier, tokenizer, inputs)]}
    reference = verifier.generate(**inputs, **GREEDY, **stop, tokenizer=tokenizer)
    # the stop string cuts the first row short (after the decoder start token, pad only follows a row's end)
    unstopped = verifier.generate(**inputs, **GREEDY)
    pad = tokenizer.pad_token_id
    if eos == "eos":
        assert (reference[0, 1:] != pad).sum() < (unstopped[0, 1:] != pad).sum()
    else:  # no EOS: the stop string ends the call at batch 1; at batch 2 greedy decodes row 0 on past it
        assert reference.shape[1] < unstopped.shape[1] or batch_size == 2
    if route == "drafter":
        # a copy: the fixture's verifier stays without the opt-in, for the custom_generate= route
        output = enable_speculative_decoding(copy.deepcopy(verifier)).generate(
            **inputs, **GREEDY, **stop, tokenizer=tokenizer, drafter=drafter, **DRAFTING
        )
    else:
        output = verifier.generate(
            **inputs,
            **GREEDY,
            **stop,
            stop_strings_tokenizer=tokenizer,
            custom_generate=speculative_generate,
            drafter=drafter,
            **DRAFTING,
        )
    assert torch.equal(output, reference)


@pytest.mark.parametrize("route", ["drafter", "custom_generate"])
def test_a_stop_string_criteria_among_the_stopping_criteria_stops_as_greedy(demo, route):
    """The way in that needs no tokenizer argument: `stopping_criteria=[StopStringCriteria(tokenizer, [...])]`."""
    verifier, tokenizer, drafter = demo
    inputs = tokenizer(SOURCES[:1], return_tensors="pt")
    stop = {"stopping_criteria": [StopStringCriteria(tokenizer, [_stop_word(verifier, tokenizer, inputs)])]}
    reference = verifier.generate(**inputs, **GREEDY, **stop)
    assert reference.shape[1] < verifier.generate(**inputs, **GREEDY).shape[1]  # the stop string cut it short
    if route == "drafter":
        output = enable_speculative_decoding(copy.deepcopy(verifier)).generate(
            **inputs, **GREEDY, **stop, drafter=drafter, **DRAFTING
        )
    else:
        output = verifier.generate(
            **inputs, **GREEDY, **stop, custom_generate=speculative_generate, drafter=drafter, **DRAFTING
        )
    assert torch.equal(output, reference)


def test_stop_strings_without_their_tokenizer_name_the_ways_that_work(demo):
    """On the `custom_generate=` route `tokenizer=` never reaches the method: the error gives the ways in."""
    verifier, tokenizer, drafter = demo
    inputs = tokenizer(SOURCES[:1], return_tensors="pt")
    with pytest.raises(ValueError, match=r"stop_strings_tokenizer=tokenizer.*drafter=drafter.*StopStringCriteria"):
        verifier.generate(
            **inputs,
            **GREEDY,
            stop_strings=["Datei"],
            tokenizer=tokenizer,
            custom_generate=speculative_generate,
            drafter=drafter,
        )
