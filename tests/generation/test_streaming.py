"""Streaming: accepted tokens reach `streamer` once each, in order, and the streamed text is the decoded output."""

from __future__ import annotations

from threading import Thread

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, build_word_tokenizer
from oracle_drafters import OracleDrafter
from transformers import TextIteratorStreamer
from transformers.generation.streamers import BaseStreamer

from specdec_hf import enable_speculative_decoding, speculative_generate

WORDS = [f"w{i}" for i in range(VOCAB_SIZE)]


class RecordingStreamer(BaseStreamer):
    """Keeps every `put` call, to check order and multiplicity."""

    def __init__(self):
        self.chunks: list[list[int]] = []
        self.ended = 0

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended += 1


@pytest.fixture
def setup():
    model = build_verifier("bart")
    tokenizer = build_word_tokenizer([" ".join(WORDS)])
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 10, 2]])}
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=20)
    return model, tokenizer, inputs, reference


@pytest.mark.parametrize("route", ["custom_generate", "custom_generate_streamer", "enabled"])
def test_tokens_arrive_once_in_order(setup, route):
    model, _, inputs, reference = setup
    streamer = RecordingStreamer()
    drafter = OracleDrafter(reference, VOCAB_SIZE, num_draft_tokens=4, accuracy="half")
    if route == "enabled":
        output = enable_speculative_decoding(model).generate(
            **inputs, drafter=drafter, streamer=streamer, max_new_tokens=20
        )
    else:
        name = "streamer" if route == "custom_generate_streamer" else "token_streamer"
        output = model.generate(
            **inputs, max_new_tokens=20, custom_generate=speculative_generate, drafter=drafter, **{name: streamer}
        )
    assert torch.equal(output, reference)
    prompt, *accepted = streamer.chunks
    assert prompt == reference[0, :1].tolist()
    assert [token for chunk in accepted for token in chunk] == reference[0, 1:].tolist()
    assert len(accepted) < reference.shape[1] - 1, "several tokens per put: they are streamed as accepted"
    assert streamer.ended == 1


@pytest.mark.parametrize("route", ["custom_generate", "enabled"])
@pytest.mark.parametrize("num_draft_tokens", [4, "auto"])
def test_text_iterator_streamer_yields_the_decoded_output(setup, route, num_draft_tokens):
    """Iterating the streamer ends on both routes (it blocked forever on `custom_generate=` before), with a fixed k
    and with `"auto"` (whose calls may decode without drafting)."""
    model, tokenizer, inputs, reference = setup
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=60)
    drafter = OracleDrafter(reference, VOCAB_SIZE, num_draft_tokens=4, accuracy="half")
    kwargs = {"drafter": drafter, "streamer": streamer, "max_new_tokens": 20, "num_draft_tokens": num_draft_tokens}
    if route == "enabled":
        enable_speculative_decoding(model)
    else:
        kwargs["custom_generate"] = speculative_generate
    result = {}

    def run():
        result["output"] = model.generate(**inputs, **kwargs)

    thread = Thread(target=run)
    thread.start()
    streamed = "".join(streamer)
    thread.join()
    assert torch.equal(result["output"], reference)
    assert streamed.strip() == tokenizer.decode(reference[0], skip_special_tokens=True).strip()


@pytest.mark.parametrize("route", ["custom_generate", "enabled"])
def test_two_streamers_are_refused_and_both_ended(setup, route):
    """Both routes refuse `streamer=` with `token_streamer=` (the opt-in used to keep one silently), and a refused
    call ends the streamers it was given, so that a consumer iterating one does not wait forever."""
    model, _, inputs, reference = setup
    drafter = OracleDrafter(reference, VOCAB_SIZE, num_draft_tokens=4, accuracy="half")
    streamers = RecordingStreamer(), RecordingStreamer()
    kwargs = {"drafter": drafter, "max_new_tokens": 20, "streamer": streamers[0], "token_streamer": streamers[1]}
    if route == "enabled":
        enable_speculative_decoding(model)
        match = "pass it once"
    else:
        kwargs["custom_generate"] = speculative_generate
        match = "pass the streamer once"
    with pytest.raises(ValueError, match=match):
        model.generate(**inputs, **kwargs)
    assert [streamer.ended for streamer in streamers] == [1, 1]


@pytest.mark.parametrize("route", ["custom_generate", "enabled"])
def test_a_call_refused_before_decoding_ends_the_streamer_once(setup, route):
    """Refusals on either route (here: `num_beams=4` with a drafter), and the same object passed as both
    streamers, end it once."""
    model, _, inputs, reference = setup
    drafter = OracleDrafter(reference, VOCAB_SIZE, num_draft_tokens=4, accuracy="half")
    streamer = RecordingStreamer()
    kwargs = {"drafter": drafter, "max_new_tokens": 20, "streamer": streamer, "num_beams": 4}
    if route == "enabled":
        enable_speculative_decoding(model)
    else:
        kwargs["custom_generate"] = speculative_generate
    with pytest.raises(ValueError, match="beam"):
        model.generate(**inputs, **kwargs)
    assert streamer.ended == 1
    with pytest.raises(ValueError, match="once"):
        model.generate(**inputs, **{**kwargs, "num_beams": 1, "token_streamer": streamer})
    assert streamer.ended == 2


class FailingOnSecondCall(OracleDrafter):
    """Drafts as the oracle does once, then raises: a failure after tokens were streamed."""

    def propose(self, *args, **kwargs):
        self.proposals_made = getattr(self, "proposals_made", 0) + 1
        if self.proposals_made == 2:
            raise RuntimeError("drafter broke")
        return super().propose(*args, **kwargs)


@pytest.mark.parametrize("route", ["custom_generate", "enabled"])
def test_a_call_failing_mid_decoding_ends_the_streamer_once(setup, route):
    model, _, inputs, reference = setup
    drafter = FailingOnSecondCall(reference, VOCAB_SIZE, num_draft_tokens=4, accuracy="half")
    streamer = RecordingStreamer()
    kwargs = {"drafter": drafter, "max_new_tokens": 20, "streamer": streamer}
    if route == "enabled":
        enable_speculative_decoding(model)
    else:
        kwargs["custom_generate"] = speculative_generate
    with pytest.raises(RuntimeError, match="drafter broke"):
        model.generate(**inputs, **kwargs)
    assert len(streamer.chunks) >= 2  # the prompt and the first iteration's tokens were streamed
    assert streamer.ended == 1


@pytest.mark.parametrize("name", ["streamer", "token_streamer"])
def test_a_refused_call_ends_its_streamer(setup, name):
    """A call refused after generate() has handed over (here: a streamer with two rows) ends the streamer."""
    model, _, inputs, reference = setup
    drafter = OracleDrafter(reference, VOCAB_SIZE, num_draft_tokens=4, accuracy="half")
    streamer = RecordingStreamer()
    with pytest.raises(ValueError, match="A streamer needs batch size 1"):
        model.generate(
            input_ids=inputs["input_ids"].repeat(2, 1),
            max_new_tokens=20,
            custom_generate=speculative_generate,
            drafter=drafter,
            **{name: streamer},
        )
    assert streamer.ended == 1
