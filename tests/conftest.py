"""Shared fixtures: tiny random verifiers of the five supported families, built from configs (no downloads).

Weights use a larger init std than the families' defaults so that greedy outputs vary and top-1 scores have no
near-ties: a k-token verify forward and a 1-token greedy step differ in the last bits, and tie-free
models keep the token-for-token comparison strict.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    MarianConfig,
    MarianMTModel,
    MBartConfig,
    MBartForConditionalGeneration,
    PegasusConfig,
    PegasusForConditionalGeneration,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

VOCAB_SIZE = 99
FAMILIES = ("bart", "t5", "marian", "mbart", "pegasus")

_BART_LIKE = dict(
    vocab_size=VOCAB_SIZE,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    init_std=0.2,
    dropout=0.0,
    attention_dropout=0.0,
    forced_eos_token_id=None,
)


_FAMILIES = {
    # family: (config class, model class, special token ids)
    "bart": (
        BartConfig,
        BartForConditionalGeneration,
        dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    ),
    "mbart": (
        MBartConfig,
        MBartForConditionalGeneration,
        dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    ),
    "marian": (MarianConfig, MarianMTModel, dict(pad_token_id=1, eos_token_id=2, decoder_start_token_id=1)),
    "pegasus": (
        PegasusConfig,
        PegasusForConditionalGeneration,
        dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
    ),
}
_T5 = dict(
    vocab_size=VOCAB_SIZE,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    dropout_rate=0.0,
    initializer_factor=4.0,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)


def build_verifier(family: str, seed: int = 0, eos_token_id: int | None = None, **config_overrides):
    """A tiny random encoder-decoder of `family`, in eval mode.

    `eos_token_id` replaces the family's EOS in the generation config so that tests can make rows stop at different
    lengths (a random model rarely emits its real EOS); `config_overrides` change the config itself (e.g.
    `vocab_size` and special ids matching a test tokenizer).
    """
    torch.manual_seed(seed)
    if family == "t5":
        model = T5ForConditionalGeneration(T5Config(**{**_T5, **config_overrides}))
    elif family in _FAMILIES:
        config_class, model_class, special_ids = _FAMILIES[family]
        model = model_class(config_class(**{**_BART_LIKE, **special_ids, **config_overrides}))
        if family == "mbart":
            model.generation_config.forced_bos_token_id = 5  # the target-language code, as mBART-50 does
    else:
        raise ValueError(f"unknown family {family!r}")
    if eos_token_id is not None:
        model.config.eos_token_id = eos_token_id
        model.generation_config.eos_token_id = eos_token_id
    return model.eval()


def build_word_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with BART's special ids (`<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3) and EOS appended."""
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=specials))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def make_source_batch(batch_size: int, seed: int = 0, pad_token_id: int = 1) -> dict[str, torch.Tensor]:
    """Random source ids; rows after the first are right-padded to different lengths."""
    generator = torch.Generator().manual_seed(seed)
    length = 11
    input_ids = torch.randint(4, VOCAB_SIZE, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch_size):
        keep = max(2, length - 3 * row)
        attention_mask[row, keep:] = 0
        input_ids[row, keep:] = pad_token_id
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@pytest.fixture(autouse=True, scope="session")
def single_thread():
    """Tiny models gain nothing from intra-op threads; on a busy 2-core machine thread hand-offs dominate."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    """Each supported verifier family in turn."""
    return request.param


REPOSITORY = Path(__file__).resolve().parents[1]


def load_repository_script(relative_path: str, module_name: str) -> ModuleType:
    """Import a script of the repository (e.g. `scripts/grow_demo_drafter.py`) as module `module_name`, registered in
    `sys.modules` (dataclasses look their module up there), its directory on `sys.path` while it is imported, as
    when it is run (benchmarks import their sibling `_common`)."""
    path = REPOSITORY / relative_path
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def generate_with_drafter(model, inputs: dict, drafter, **kwargs):
    """`model.generate(**inputs)` through `speculative_generate` with `drafter`: greedy and a dict output (with
    `speculative_stats`) unless `kwargs` say otherwise."""
    from specdec_hf import speculative_generate

    options = {"do_sample": False, "num_beams": 1, "return_dict_in_generate": True, **kwargs}
    return model.generate(**inputs, custom_generate=speculative_generate, drafter=drafter, **options)


class WeakKey:
    """A weakly referable stand-in for a verifier or a drafter: the process keeps the `num_draft_tokens="auto"`
    measurements of such a pair across calls."""


class StepClock:
    """A clock for the draft length schedule's timings: every reading is one unit after the last, so a verifier
    forward of any width costs 1 and a loop iteration 1 beyond its forward; `spend` adds what a slow drafter's call
    costs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now

    def spend(self, units: float) -> None:
        self.now += units


@pytest.fixture
def clock(monkeypatch):
    """The draft length schedule reads this clock instead of the machine's: what `num_draft_tokens="auto"` chooses
    does not depend on the load of the machine running the tests."""
    from specdec_hf.generation import draft_length

    step_clock = StepClock()
    monkeypatch.setattr(draft_length, "_clock", step_clock)
    return step_clock


@pytest.fixture
def fresh_draft_length_measurements():
    """No cost table or acceptance count of `num_draft_tokens="auto"` from an earlier test, and none left after."""
    from specdec_hf.generation import draft_length

    draft_length.clear_measurements()
    yield
    draft_length.clear_measurements()


@pytest.fixture
def counted_fp16_calls(monkeypatch):
    """How many calls took FBGEMM's float16-weight kernel (the operator wrapped, its results kept)."""
    from specdec_hf import prepacked_linear

    operators = prepacked_linear._fp16_weight_operators()
    if operators is None:
        pytest.skip("FBGEMM's float16-weight operators do not run here")
    calls = []

    def counting(inputs, packed):
        calls.append(inputs.shape)
        return operators.linear(inputs, packed)

    monkeypatch.setattr(prepacked_linear, "_fp16_operators", operators._replace(linear=counting))
    return calls


@pytest.fixture
def host_settlements(monkeypatch):
    """The iterations the loop settled on the host (`host_outcome.settle_on_host`, wrapped to count its calls), one
    entry each: a test checks with it which path ran."""
    from specdec_hf.generation import speculative_loop

    settle = speculative_loop.settle_on_host
    settled = []

    def counting(*args, **kwargs):
        settled.append(1)
        return settle(*args, **kwargs)

    monkeypatch.setattr(speculative_loop, "settle_on_host", counting)
    return settled
