"""Bad input tried as a new user would, through the public API and the CLIs (issue 22's probe; not run by CI).

Every case says what a good outcome is: output equal to greedy decoding token for token, a value taken as meant
(`strategies: greedy` → `["greedy"]`), or an error whose message matches a pattern naming the argument or the file
and what is wrong. Each case ends in one of:

* `matched greedy` / `as meant`: the good outcome;
* `same error as greedy`: plain greedy decoding fails the same way (the drafter adds nothing wrong);
* `clear error`: an error (or a warning, where rows are skipped) matching the case's pattern;
* `unclear error`: an error raised by the project's own code that does not say what the pattern asks for;
* `internal traceback`: an error raised inside torch, transformers, datasets, ... and not explained;
* `silently wrong`: output that differs from greedy, or a bad value accepted without a word.

    python benchmarks/probe_bad_input.py [--only SUBSTRING] [--verbose]

Everything runs on tiny random models built in a temporary directory (nothing downloads: HF_HUB_OFFLINE=1). It takes
a few minutes on two CPU cores, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT / "tests" / "evaluation", ROOT / "tests", ROOT / "scripts", ROOT):
    sys.path.insert(0, str(path))

import datasets  # noqa: E402
import torch  # noqa: E402
import train_demo_verifier  # noqa: E402
import transformers  # noqa: E402
import yaml  # noqa: E402
from conftest import build_verifier, build_word_tokenizer, make_source_batch  # noqa: E402
from eval_fixtures import FIXTURE, build_marian, build_tokenizer  # noqa: E402
from huggingface_hub import ModelCard  # noqa: E402
from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    StopStringCriteria,
    TextStreamer,
)

import evaluate  # noqa: E402
import train_drafter  # noqa: E402
from specdec_hf import (  # noqa: E402
    Drafter,
    DraftProposal,
    SpecDrafterModel,
    enable_speculative_decoding,
    prepack_linear_layers,
    speculative_generate,
)
from specdec_hf import prepacked_linear as prepacked_linear_module  # noqa: E402
from specdec_hf.data import DataArguments, load_text_pairs  # noqa: E402
from specdec_hf.distillation import DistillationSettings, distill  # noqa: E402
from specdec_hf.distillation import main as distillation_main  # noqa: E402
from specdec_hf.evaluation import parse_evaluation_arguments  # noqa: E402
from specdec_hf.generation import as_drafter  # noqa: E402
from specdec_hf.training import write_model_card  # noqa: E402

PROJECT_FILES = (
    str(ROOT / "specdec_hf"),
    str(ROOT / "train_drafter.py"),
    str(ROOT / "evaluate.py"),
    str(ROOT / "scripts"),
)
GOOD = ("matched greedy", "as meant", "clear error", "same error as greedy")


@dataclass
class Case:
    """One thing a user might try. `expect` is `greedy` (compare with `reference`), `value` (`check` returns
    True), `error` (an exception or argparse exit whose message matches `pattern`) or `warning` (a logged warning
    or Python warning matching `pattern`, with `check` on the result)."""

    group: str
    name: str
    run: Callable[[], object]
    expect: str
    pattern: str = ""
    reference: Callable[[], torch.Tensor] | None = None
    check: Callable[[object], bool] | None = None


@dataclass
class Outcome:
    case: Case
    label: str
    detail: str = ""
    trace: str = field(default="", repr=False)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def classify(case: Case) -> Outcome:
    """Run a case and name its outcome."""
    stderr, records = io.StringIO(), _Records()
    logging.getLogger().addHandler(records)
    try:
        with (
            contextlib.redirect_stderr(stderr),
            contextlib.redirect_stdout(io.StringIO()),  # the CLIs print their tables
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            result = case.run()
    except SystemExit as exit_:
        message = stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else f"exit {exit_.code}"
        if case.expect == "error" and re.search(case.pattern, stderr.getvalue(), re.S):
            return Outcome(case, "clear error", message)
        return Outcome(case, "unclear error", message)
    except Exception as err:  # every failure is classified, not raised
        message = f"{type(err).__name__}: {err}"
        if case.expect == "error" and re.search(case.pattern, message, re.S):
            return Outcome(case, "clear error", message)
        if case.expect == "greedy" and _raises_the_same(case.reference, err):
            return Outcome(case, "same error as greedy", message)
        frames = traceback.extract_tb(err.__traceback__)
        raised_by_project = bool(frames) and frames[-1].filename.startswith(PROJECT_FILES)
        label = "unclear error" if raised_by_project else "internal traceback"
        return Outcome(case, label, message, traceback.format_exc())
    finally:
        logging.getLogger().removeHandler(records)
    warned = records.messages + [str(warning.message) for warning in caught]
    if case.expect == "greedy":
        expected = case.reference()
        same = isinstance(result, torch.Tensor) and result.shape == expected.shape and torch.equal(result, expected)
        return Outcome(case, "matched greedy" if same else "silently wrong", "" if same else f"got {result}")
    if case.expect == "value":
        return Outcome(case, "as meant" if case.check(result) else "silently wrong", repr(result)[:120])
    if case.expect == "warning":
        match = next((message for message in warned if re.search(case.pattern, message, re.S)), None)
        if match is not None and (case.check is None or case.check(result)):
            return Outcome(case, "clear error", f"warning: {match}")
        return Outcome(case, "silently wrong", f"no matching warning ({warned[:2]}), result {repr(result)[:80]}")
    return Outcome(case, "silently wrong", f"no error; returned {repr(result)[:100]}")


def _raises_the_same(reference: Callable[[], torch.Tensor], err: Exception) -> bool:
    """Whether plain greedy decoding fails with the same error (then the drafter adds no problem of its own)."""
    try:
        reference()
    except Exception as greedy_err:  # compared, not raised
        return type(greedy_err) is type(err) and str(greedy_err) == str(err)
    return False


# ----------------------------------------------------------------------------------------------------------------
# The models and files the cases use
# ----------------------------------------------------------------------------------------------------------------
class Workspace:
    """Tiny random models and data files in a temporary directory."""

    def __init__(self, root: Path):
        self.root = root
        torch.manual_seed(0)
        self.verifier = build_verifier("bart")
        self.drafter = SpecDrafterModel.from_verifier(self.verifier, max_draft_tokens=4, decoder_layers=1).eval()
        self.inputs = make_source_batch(1)
        self.batch = make_source_batch(4)
        texts = [" ".join(f"w{i}" for i in range(start, start + 20)) for start in range(0, 95, 5)]
        self.tokenizer = build_word_tokenizer(texts)
        # the shipped demo pair, for what needs a real tokenizer (stop strings)
        demo = ROOT / "models" / "demo-en-de"
        self.demo_tokenizer = AutoTokenizer.from_pretrained(demo / "verifier")
        self.demo_verifier = AutoModelForSeq2SeqLM.from_pretrained(demo / "verifier", dtype=torch.float32).eval()
        self.demo_drafter = SpecDrafterModel.from_pretrained(demo / "drafter", dtype=torch.float32).eval()
        self.demo_inputs = self.demo_tokenizer(["Open the file and save the changes."], return_tensors="pt")
        # the evaluation's models: a word-level tokenizer over the MT fixture and a Marian verifier of its size
        self.eval_dir = root / "eval_models"
        tokenizer = build_tokenizer()
        marian = build_marian(len(tokenizer), seed=0)
        marian.save_pretrained(self.eval_dir / "verifier")
        tokenizer.save_pretrained(self.eval_dir / "verifier")
        marian_drafter = SpecDrafterModel.from_verifier(marian, max_draft_tokens=4, decoder_layers=1)
        marian_drafter.save_pretrained(self.eval_dir / "drafter")
        shutil.copytree(self.eval_dir / "drafter", self.eval_dir / "truncated_drafter")
        truncate(self.eval_dir / "truncated_drafter" / "model.safetensors", 0.3)
        # a distilled training set for train_drafter.py
        pairs = load_text_pairs(DataArguments(data_files=str(FIXTURE), source_lang="en", target_lang="de"), "train")
        distill(
            marian,
            tokenizer,
            pairs.select(range(48)),
            DistillationSettings(output_dir=str(root / "distilled"), batch_size=16, max_new_tokens=10),
            progress=False,
        )
        self.files = root / "files"
        self.files.mkdir()

    def greedy(self, inputs=None, model: str = "tiny", **kwargs) -> Callable[[], torch.Tensor]:
        """Plain greedy decoding of `inputs` by the tiny (or the demo) verifier, as a call to make later."""
        inputs = self.inputs if inputs is None else inputs
        verifier = self.demo_verifier if model == "demo" else self.verifier
        return lambda: verifier.generate(**inputs, do_sample=False, **{"max_new_tokens": 12, **kwargs})

    def speculative(
        self, inputs=None, route: str = "drafter", drafter=None, model: str = "tiny", **kwargs
    ) -> Callable[[], object]:
        """Speculative decoding on the `drafter=` or the `custom_generate=` route, as a call to make later."""
        inputs = self.inputs if inputs is None else inputs
        verifier = self.demo_verifier if model == "demo" else self.verifier
        drafter = (self.demo_drafter if model == "demo" else self.drafter) if drafter is None else drafter
        kwargs = {"max_new_tokens": 12, "do_sample": False, **kwargs}
        if route == "drafter":
            return lambda: enable_speculative_decoding(verifier).generate(**inputs, drafter=drafter, **kwargs)
        # the class's generate(): the drafter= cases opted this instance in, and its generate() would hand
        # `tokenizer=` and `streamer=` over itself, which a plain custom_generate= call does not
        plain_generate = type(verifier).generate
        return lambda: plain_generate(
            verifier, **inputs, custom_generate=speculative_generate, drafter=drafter, **kwargs
        )

    def write(self, name: str, content: str | bytes) -> str:
        """A file of the workspace with this content (gzipped for `.gz` names); returns its path."""
        path = self.files / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif name.endswith(".gz"):
            with gzip.open(path, "wt", encoding="utf-8") as handle:
                handle.write(content)
        else:
            path.write_text(content, encoding="utf-8")
        return str(path)

    def yaml(self, name: str, values: dict | str) -> str:
        """A YAML config of these values (or this text); returns its path."""
        return self.write(name, values if isinstance(values, str) else yaml.safe_dump(values))

    def eval_argv(self, **overrides: str) -> list[str]:
        """The command line of a quick evaluate.py run on the tiny pair, with some options replaced."""
        options = {
            "--verifier_name_or_path": str(self.eval_dir / "verifier"),
            "--drafters": str(self.eval_dir / "drafter"),
            "--data_files": f"test={FIXTURE}",
            "--source_lang": "en",
            "--target_lang": "de",
            "--output_dir": str(self.root / "eval_out"),
            "--limit": "4",
            "--batch_size": "2",
            "--max_new_tokens": "8",
            "--repeats": "1",
            "--sweep": "false",
            "--measure_memory": "false",
            "--strategies": "greedy spec_k4_b1_t0",
            "--device": "cpu",
            "--disable_tqdm": "true",
            **overrides,
        }
        return [item for name, value in options.items() for item in (name, *value.split(" ")) if value is not None]

    def train_yaml(self, name: str, **overrides) -> str:
        """A train_drafter.py config of a two-step run into `root/name`, with some values replaced."""
        values = {
            "verifier_name_or_path": str(self.eval_dir / "verifier"),
            "train_data": str(self.root / "distilled"),
            "output_dir": str(self.root / name),
            "max_draft_tokens": 4,
            "drafter_config": {"decoder_layers": 1, "prefix_attention": "causal"},
            "per_device_train_batch_size": 8,
            "max_steps": 2,
            "warmup_steps": 1,
            "checkpointing_steps": 1,
            "eval_steps": 100,
            "eval_samples": 8,
            "eval_max_new_tokens": 8,
            "logging_steps": 1,
            "num_threads": 1,
            **overrides,
        }
        return self.yaml(f"{name}.yaml", values)


def truncate(path: Path, keep: float) -> None:
    """Cut a file to a fraction of its size, as an interrupted copy would."""
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


# ----------------------------------------------------------------------------------------------------------------
# Custom drafters of the kind a user writes (specdec_hf.Drafter)
# ----------------------------------------------------------------------------------------------------------------
class FaultyDrafter(Drafter):
    """Wraps the real drafter and spoils its proposal in one way."""

    def __init__(self, inner: SpecDrafterModel, fault: str, vocab_size=None):
        self.inner, self.fault = as_drafter(inner), fault
        self.vocab_size = self.inner.vocab_size if vocab_size is None else vocab_size
        self.num_draft_tokens = self.inner.num_draft_tokens

    def init_drafting_state(self, input_ids, attention_mask, encoder_hidden_states):
        return self.inner.init_drafting_state(input_ids, attention_mask, encoder_hidden_states)

    def select_rows(self, state, rows):
        return self.inner.select_rows(state, rows)

    def propose(self, state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states=None):
        proposal = self.inner.propose(state, prefix_ids, prefix_lengths, num_draft_tokens, verifier_states)
        ids, logits = proposal.draft_ids, proposal.draft_logits
        if self.fault == "none":
            return None
        if self.fault == "ids_at_vocab":
            ids = torch.full_like(ids, self.inner.vocab_size)
        elif self.fault == "ids_negative":
            ids = torch.full_like(ids, -1)
        elif self.fault == "ids_float":
            ids = ids.float()
        elif self.fault == "ids_shape":
            ids = ids[:, :-1]
        elif self.fault == "logits_nan":
            logits = torch.full_like(logits, float("nan"))
        elif self.fault == "logits_minus_inf":
            logits = torch.full_like(logits, float("-inf"))
        elif self.fault == "logits_width":
            logits = logits[..., :-3]
        return DraftProposal(draft_ids=ids, draft_logits=logits, state=proposal.state)


# ----------------------------------------------------------------------------------------------------------------
# The cases
# ----------------------------------------------------------------------------------------------------------------
def generation_cases(w: Workspace) -> list[Case]:
    """The public generate() API (both routes): what works as greedy, and items 1-6 of issue 22."""
    eos = int(w.greedy()()[0, 4])  # a token greedy emits early: rows then stop inside the first block
    demo_output = w.demo_tokenizer.decode(w.greedy(w.demo_inputs, model="demo")()[0], skip_special_tokens=True)
    stop_word = demo_output.split()[1]  # a word greedy decoding writes second
    demo_stop = StopStringCriteria(w.demo_tokenizer, [stop_word])
    cases = []
    for route in ("drafter", "custom_generate"):
        g = f"generate ({route}=)"
        cases += [
            Case(g, "batch 1", w.speculative(route=route), "greedy", reference=w.greedy()),
            Case(g, "batch 4, padded", w.speculative(w.batch, route=route), "greedy", reference=w.greedy(w.batch)),
            Case(
                g,
                "EOS inside the first block",
                w.speculative(w.batch, route=route, eos_token_id=eos),
                "greedy",
                reference=w.greedy(w.batch, eos_token_id=eos),
            ),
            Case(  # transformers drops `tokenizer=` before a custom_generate callable: there, an error with the ways in
                g,
                "stop_strings with tokenizer (item 1)",
                w.speculative(
                    w.demo_inputs, route=route, model="demo", stop_strings=[stop_word], tokenizer=w.demo_tokenizer
                ),
                "greedy" if route == "drafter" else "error",
                pattern=r"stop_strings_tokenizer=.*StopStringCriteria",
                reference=w.greedy(w.demo_inputs, model="demo", stop_strings=[stop_word], tokenizer=w.demo_tokenizer),
            ),
            Case(
                g,
                "StopStringCriteria in stopping_criteria",
                w.speculative(w.demo_inputs, route=route, model="demo", stopping_criteria=[demo_stop]),
                "greedy",
                reference=w.greedy(w.demo_inputs, model="demo", stopping_criteria=[demo_stop]),
            ),
        ]
    cases.append(
        Case(
            "generate (custom_generate=)",
            "stop_strings with stop_strings_tokenizer (item 1)",
            w.speculative(
                w.demo_inputs,
                route="custom_generate",
                model="demo",
                stop_strings=[stop_word],
                stop_strings_tokenizer=w.demo_tokenizer,
            ),
            "greedy",
            reference=w.greedy(w.demo_inputs, model="demo", stop_strings=[stop_word], tokenizer=w.demo_tokenizer),
        )
    )
    g = "generate (drafter=)"
    processors = {
        "repetition_penalty=1.3": {"repetition_penalty": 1.3},
        "no_repeat_ngram_size=2": {"no_repeat_ngram_size": 2},
        "min_new_tokens=8 with an early EOS": {"min_new_tokens": 8, "eos_token_id": eos},
        "bad_words_ids": {"bad_words_ids": [[eos]]},
        "suppress_tokens": {"suppress_tokens": [eos, eos + 1]},
    }
    for name, kwargs in processors.items():
        cases.append(Case(g, name, w.speculative(w.batch, **kwargs), "greedy", reference=w.greedy(w.batch, **kwargs)))
    cases.append(  # reads the batch index: the rows are kept aligned, as greedy shows them
        Case(
            g,
            "encoder_repetition_penalty=1.2",
            w.speculative(w.batch, encoder_repetition_penalty=1.2),
            "greedy",
            reference=w.greedy(w.batch, encoder_repetition_penalty=1.2),
        )
    )
    dict_output = {"return_dict_in_generate": True, "output_scores": True}
    cases += [
        Case(
            g,
            "return_dict_in_generate with scores",
            lambda: w.speculative(w.batch, **dict_output)().sequences,
            "greedy",
            reference=lambda: w.greedy(w.batch, **dict_output)().sequences,
        ),
        Case(
            g,
            "forced decoder prefix (decoder_input_ids)",
            w.speculative(decoder_input_ids=torch.tensor([[2, 7, 9]])),
            "greedy",
            reference=w.greedy(decoder_input_ids=torch.tensor([[2, 7, 9]])),
        ),
        Case(
            g,
            "draft_confidence_threshold=0.3",
            w.speculative(w.batch, draft_confidence_threshold=0.3),
            "greedy",
            reference=w.greedy(w.batch),
        ),
        Case(g, "num_draft_tokens=1", w.speculative(num_draft_tokens=1), "greedy", reference=w.greedy()),
        Case(g, "num_draft_tokens=0", w.speculative(num_draft_tokens=0), "error", r"num_draft_tokens.*0"),
        Case(g, "num_draft_tokens=-2", w.speculative(num_draft_tokens=-2), "error", r"num_draft_tokens"),
        Case(
            g,
            "num_draft_tokens=9 (> the drafter's 4)",
            w.speculative(num_draft_tokens=9),
            "error",
            r"num_draft_tokens.*at most",
        ),
        Case(g, "num_draft_tokens=2.5", w.speculative(num_draft_tokens=2.5), "error", r"num_draft_tokens"),
        Case(g, "beta=0", w.speculative(beta=0), "error", r"beta"),
        Case(g, "beta=1.5", w.speculative(beta=1.5), "error", r"beta"),
        Case(g, "tau=-1 with beta=2", w.speculative(beta=2, tau=-1.0), "error", r"tau"),
        Case(g, "tau='x'", w.speculative(beta=2, tau="x"), "error", r"tau"),
        Case(g, "beta=2 with do_sample", w.speculative(beta=2, do_sample=True), "error", r"beta.*do_sample"),
        Case(
            g,
            "draft_confidence_threshold=1.5",
            w.speculative(draft_confidence_threshold=1.5),
            "error",
            r"draft_confidence_threshold",
        ),
        Case(
            g,
            "draft_confidence_threshold=True",
            w.speculative(draft_confidence_threshold=True),
            "error",
            r"draft_confidence_threshold",
        ),
        Case(
            g,
            "no drafter",
            lambda: w.verifier.generate(**w.inputs, custom_generate=speculative_generate, max_new_tokens=5),
            "error",
            r"drafter.*required",
        ),
        Case(
            g, "drafter='a/path' (a string)", w.speculative(drafter="models/demo-en-de/drafter"), "error", r"drafter"
        ),
        Case(g, "num_beams=2", w.speculative(num_beams=2), "error", r"beam"),
        Case(g, "cache_implementation='static'", w.speculative(cache_implementation="static"), "error", r"static"),
        Case(
            g,
            "streamer with batch 4",
            w.speculative(w.batch, streamer=TextStreamer(w.tokenizer)),
            "error",
            r"batch size 1",
        ),
        Case(
            g,
            "no length limit (max_length=None)",
            w.speculative(max_new_tokens=None, max_length=None),
            "greedy",
            reference=w.greedy(max_new_tokens=None, max_length=None),
        ),
    ]
    other_vocab = build_verifier("bart", vocab_size=120)
    other_drafter = SpecDrafterModel.from_verifier(other_vocab, max_draft_tokens=4, decoder_layers=1)
    wide = build_verifier("bart", d_model=64, encoder_attention_heads=4, decoder_attention_heads=4)
    wide_reader = SpecDrafterModel.from_verifier(wide, max_draft_tokens=4, decoder_layers=1, use_verifier_encoder=True)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=99, n_embd=32, n_layer=1, n_head=4, n_positions=64)).eval()
    embeds = {
        "inputs_embeds": w.verifier.get_input_embeddings()(w.inputs["input_ids"]),
        "attention_mask": w.inputs["attention_mask"],
    }
    encoder = w.verifier.get_encoder()(**w.inputs)
    cases += [
        Case(g, "drafter of another vocabulary", w.speculative(drafter=other_drafter), "error", r"vocab"),
        Case(
            g,
            "use_verifier_encoder drafter of another width (item 3)",
            w.speculative(drafter=wide_reader),
            "error",
            r"verifier_d_model|width|d_model",
        ),
        Case(
            g,
            "decoder-only verifier",
            lambda: enable_speculative_decoding(gpt2).generate(
                torch.tensor([[5, 6, 7]]), drafter=w.drafter, max_new_tokens=4
            ),
            "error",
            r"encoder-decoder",
        ),
        Case(
            g,
            "inputs_embeds (own-encoder drafter)",
            lambda: enable_speculative_decoding(w.verifier).generate(
                **embeds, drafter=w.drafter, max_new_tokens=12, do_sample=False
            ),
            "error",
            r"inputs_embeds",
        ),
        Case(
            g,
            "encoder_outputs as a plain tuple (item 6)",
            lambda: enable_speculative_decoding(w.verifier).generate(
                **w.inputs,
                encoder_outputs=tuple(encoder.values()),
                drafter=w.drafter,
                max_new_tokens=12,
                do_sample=False,
            ),
            "greedy",
            reference=w.greedy(),
        ),
        Case(
            g,
            "encoder_outputs without input_ids, own-encoder drafter (item 6)",
            lambda: enable_speculative_decoding(w.verifier).generate(
                encoder_outputs=encoder,
                attention_mask=w.inputs["attention_mask"],
                drafter=w.drafter,
                max_new_tokens=12,
                do_sample=False,
            ),
            "error",
            r"input_ids.*encoder_outputs|encoder_outputs.*input_ids",
        ),
        Case(
            g,
            "max_new_tokens=10**11, EOS early (item 5)",
            w.speculative(max_new_tokens=10**11, eos_token_id=eos),
            "greedy",
            reference=w.greedy(max_new_tokens=10**11, eos_token_id=eos),
        ),
    ]
    for fault, pattern in (
        ("ids_at_vocab", r"draft_ids.*(vocab|range)"),
        ("ids_negative", r"draft_ids.*(vocab|range|negative)"),
        ("ids_float", r"draft_ids.*(integer|dtype|long)"),
        ("ids_shape", r"draft_ids.*shape"),
        ("none", r"propose.*(None|DraftProposal)"),
    ):
        item = {"ids_shape": "", "none": " (item 6)"}.get(fault, " (item 2)")
        cases.append(
            Case(
                g,
                f"custom drafter: {fault}{item}",
                w.speculative(drafter=FaultyDrafter(w.drafter, fault)),
                "error",
                pattern,
            )
        )
    cases += [
        Case(
            g,
            "custom drafter: draft_logits NaN, do_sample (item 4)",
            w.speculative(drafter=FaultyDrafter(w.drafter, "logits_nan"), do_sample=True),
            "error",
            r"draft_logits.*(NaN|nan|finite)",
        ),
        Case(
            g,
            "custom drafter: draft_logits all -inf, do_sample (item 4)",
            w.speculative(drafter=FaultyDrafter(w.drafter, "logits_minus_inf"), do_sample=True),
            "error",
            r"draft_logits.*(inf|finite)",
        ),
        Case(  # greedy verification without a threshold never reads draft_logits
            g,
            "custom drafter: draft_logits of the wrong width, greedy",
            w.speculative(drafter=FaultyDrafter(w.drafter, "logits_width")),
            "greedy",
            reference=w.greedy(),
        ),
        Case(
            g,
            "custom drafter: draft_logits of the wrong width, do_sample (item 4)",
            w.speculative(drafter=FaultyDrafter(w.drafter, "logits_width"), do_sample=True),
            "error",
            r"draft_logits.*(vocab|last dimension|shape)",
        ),
        Case(
            g,
            "custom drafter: logits width with confidence threshold (item 4)",
            w.speculative(drafter=FaultyDrafter(w.drafter, "logits_width"), draft_confidence_threshold=0.3),
            "error",
            r"draft_logits.*(vocab|last dimension|shape)",
        ),
        Case(
            g,
            "custom drafter: vocab_size=torch.tensor(99) (item 6)",
            w.speculative(drafter=FaultyDrafter(w.drafter, "ok", vocab_size=torch.tensor(99))),
            "greedy",
            reference=w.greedy(),
        ),
    ]
    return cases


def model_cases(w: Workspace) -> list[Case]:
    """SpecDrafterModel, prepacking and the model card."""
    g = "models"
    missing_operator = _simulated_missing_operator(w)
    return [
        Case(
            g,
            "from_verifier(max_draft_tokens=0)",
            lambda: SpecDrafterModel.from_verifier(w.verifier, max_draft_tokens=0),
            "error",
            r"max_draft_tokens",
        ),
        Case(
            g,
            "from_verifier(prefix_attention='sideways')",
            lambda: SpecDrafterModel.from_verifier(w.verifier, prefix_attention="sideways"),
            "error",
            r"prefix_attention",
        ),
        Case(
            g,
            "from_verifier(no_such_field=1)",
            lambda: SpecDrafterModel.from_verifier(w.verifier, no_such_field=1),
            "error",
            r"no_such_field",
        ),
        Case(
            g,
            "from_verifier(draft_vocab_ids out of range)",
            lambda: SpecDrafterModel.from_verifier(w.verifier, max_draft_tokens=4, draft_vocab_ids=[1, 2, 500]),
            "error",
            r"draft_vocab_ids",
        ),
        Case(
            g,
            "from_verifier(encoder_layers=9 > verifier's 2)",
            lambda: SpecDrafterModel.from_verifier(w.verifier, encoder_layers=9),
            "error",
            r"encoder_layers",
        ),
        Case(
            g,
            "SpecDrafterModel.from_pretrained(missing local path), offline (item 9)",
            lambda: SpecDrafterModel.from_pretrained(str(w.root / "runs" / "drafter")),
            "error",
            r"no such directory|not a Hub id|does not exist",
        ),
        Case(
            g,
            "SpecDrafterModel.from_pretrained(truncated safetensors) (item 9)",
            lambda: SpecDrafterModel.from_pretrained(w.eval_dir / "truncated_drafter"),
            "error",
            r"model\.safetensors",
        ),
        Case(
            g,
            "prepack_linear_layers on a meta-device model",
            lambda: prepack_linear_layers(nn.Sequential(nn.Linear(4, 4, device="meta"))),
            "error",
            r"CPU",
        ),
        Case(
            g,
            "prepacked models, a oneDNN operator missing (edges)",
            missing_operator,
            "warning",
            r"oneDNN operators .* missing",
            check=lambda ok: ok is True,
        ),
        Case(
            g,
            "model card: local verifier path not base_model (edges)",
            lambda: _card_base_model(w, str(w.eval_dir / "verifier")),
            "value",
            check=lambda base: base is None,
        ),
        Case(
            g,
            "model card: Hub id as base_model, results round-trip (edges)",
            lambda: _card_base_model(w, "facebook/bart-base"),
            "value",
            check=lambda base: base == "facebook/bart-base",
        ),
    ]


def _simulated_missing_operator(w: Workspace) -> Callable[[], bool]:
    def run() -> bool:
        def missing():
            raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_linear_pointwise'")

        saved = (prepacked_linear_module._resolve_onednn_operators, prepacked_linear_module._operators)
        prepacked_linear_module._resolve_onednn_operators = missing
        prepacked_linear_module._operators = prepacked_linear_module._UNPROBED
        try:
            verifier, drafter = (
                build_verifier("bart"),
                SpecDrafterModel.from_verifier(w.verifier, max_draft_tokens=4, decoder_layers=1).eval(),
            )
            greedy = verifier.generate(**w.batch, do_sample=False, max_new_tokens=12)
            prepack_linear_layers(verifier)
            prepack_linear_layers(drafter)
            output = enable_speculative_decoding(verifier).generate(
                **w.batch, drafter=drafter, do_sample=False, max_new_tokens=12
            )
            return bool(torch.equal(output, greedy))
        finally:
            prepacked_linear_module._resolve_onednn_operators, prepacked_linear_module._operators = saved

    return run


def _card_base_model(w: Workspace, verifier_name: str):
    directory = Path(tempfile.mkdtemp(dir=w.root))
    write_model_card(
        directory,
        w.drafter,
        verifier_name,
        "probe data",
        3,
        {"tokens_per_iteration": 1.5, "accuracy_by_position": [0.5] * 4},
    )
    card = ModelCard.load(directory / "README.md")
    assert card.data.eval_results and card.data.eval_results[0].metric_value == 1.5
    return card.data.base_model


def data_cases(w: Workspace) -> list[Case]:
    """load_text_pairs on local files (item 8) and DataArguments."""
    g = "data files"
    row = json.dumps({"translation": {"en": "Open the file.", "de": "Öffne die Datei."}}, ensure_ascii=False)

    def load(path: str, split: str = "train", **kwargs):
        columns = {"source_lang": "en", "target_lang": "de"} if ".jsonl" in path or ".json" in path else {}
        return lambda: load_text_pairs(
            DataArguments(data_files=path, cache_dir=str(w.root / "cache"), **{**columns, **kwargs}), split
        )

    parquet = w.files / "pairs.parquet"
    datasets.Dataset.from_list([{"source": "a", "target": "b"}] * 50).to_parquet(str(parquet))
    truncate(parquet, 0.5)
    mixed = "\n".join([row, json.dumps({"translation": {"en": "Only English."}}), row]) + "\n"
    return [
        Case(
            g,
            "malformed JSONL line (item 8)",
            load(w.write("broken.jsonl", row + "\n" + row[:25] + "\n")),
            "error",
            r"broken\.jsonl', line 2",
        ),
        Case(g, "empty .jsonl (item 8)", load(w.write("empty.jsonl", "")), "error", r"empty\.jsonl' is empty"),
        Case(g, ".jsonl of blank lines", load(w.write("blank.jsonl", "\n \n\n")), "error", r"blank\.jsonl' is empty"),
        Case(g, "empty .jsonl.gz", load(w.write("empty.jsonl.gz", "")), "error", r"empty\.jsonl\.gz' is empty"),
        Case(
            g,
            "malformed line in .jsonl.gz",
            load(w.write("broken.jsonl.gz", row + "\n{oops\n")),
            "error",
            r"broken\.jsonl\.gz', line 2",
        ),
        Case(
            g,
            "row lacking its target key (item 8)",
            load(w.write("mixed.jsonl", mixed)),
            "warning",
            r"target 'translation\.de'",
            check=lambda d: d.num_rows == 2,
        ),
        Case(
            g,
            "every row lacking the target",
            load(w.write("en_only.jsonl", json.dumps({"translation": {"en": "Hi."}}) + "\n")),
            "error",
            r"target column 'translation\.de' not found",
        ),
        Case(
            g,
            "a JSON array on a JSONL line",
            load(w.write("array.jsonl", row + "\n[1, 2]\n")),
            "error",
            r"array\.jsonl', line 2: a JSON Lines row must be an object",
        ),
        Case(
            g,
            "Latin-1 bytes in a .jsonl",
            load(w.write("latin1.jsonl", '{"translation": {"en": "Gr\xf6\xdfe", "de": "x"}}\n'.encode("latin-1"))),
            "error",
            r"latin1\.jsonl.*not UTF-8",
        ),
        Case(
            g,
            "malformed .json document",
            load(w.write("doc.json", '[{"translation": {"en": "a", "de": "b"}},\n {"translation": }]')),
            "error",
            r"doc\.json', line 2",
        ),
        Case(g, "empty .csv", load(w.write("empty.csv", "")), "error", r"empty\.csv' is empty"),
        Case(g, "empty .tsv", load(w.write("empty.tsv", "")), "error", r"empty\.tsv' is empty"),
        Case(
            g,
            ".csv with an unclosed quote",
            load(w.write("quote.csv", 'source,target\n"a,b\n')),
            "error",
            r"quote\.csv' as comma-separated",
        ),
        Case(g, "truncated .parquet", load(str(parquet)), "error", r"pairs\.parquet' is not a readable Parquet file"),
        Case(
            g,
            "file with a `source` column only",
            load(w.write("flat.jsonl", '{"source": "a"}\n'), source_lang=None, target_lang=None),
            "error",
            r"`source` column but no `target`",
        ),
        Case(g, "missing file", load(str(w.files / "nope.jsonl")), "error", r"nope\.jsonl.*does not exist"),
        Case(g, "unsupported .txt", load(w.write("pairs.txt", "a\tb\n")), "error", r"supported formats"),
        Case(
            g,
            "formats mixed in one split",
            lambda: load_text_pairs(
                DataArguments(data_files=[w.write("m1.jsonl", row + "\n"), w.write("m2.csv", "source,target\na,b\n")]),
                "train",
            ),
            "error",
            r"mix formats",
        ),
        Case(
            g,
            "split not among named data_files",
            load(f"train={w.write('t.jsonl', row + chr(10))}", "test"),
            "error",
            r"split 'test' is not in data_files",
        ),
        Case(
            g, "unknown dataset name", lambda: DataArguments(dataset_name="wmt15"), "error", r"unknown dataset 'wmt15'"
        ),
        Case(
            g,
            "source_lang without target_lang",
            lambda: DataArguments(dataset_name="wmt14", source_lang="en"),
            "error",
            r"target_lang",
        ),
        Case(g, "max_samples=0", lambda: DataArguments(data_files="x.jsonl", max_samples=0), "error", r"max_samples"),
        Case(g, "no data at all", lambda: DataArguments(), "error", r"no data given"),
        Case(
            g,
            "a directory as a data file",
            load(str(w.files)),
            "error",
            r"files' \(split 'train'\) is a directory",
        ),
    ]


def evaluate_cases(w: Workspace) -> list[Case]:
    """evaluate.py: YAML and command-line values (item 7), models (item 9), data (item 8)."""
    g = "evaluate.py"
    base = {
        "verifier_name_or_path": str(w.eval_dir / "verifier"),
        "drafters": [str(w.eval_dir / "drafter")],
        "dataset_name": "wmt14",
    }

    def with_yaml(values, name="eval.yaml"):
        return lambda: evaluate.main(["--config", w.yaml(name, values)])

    def parsed(values, attribute):
        return lambda: getattr(
            parse_evaluation_arguments(["--config", w.yaml("eval_ok.yaml", {**base, **values})])[0], attribute
        )

    def cli(**overrides):
        return lambda: evaluate.main(w.eval_argv(**overrides))

    broken = w.write("eval_broken.jsonl", '{"translation": {"en": "a", "de": "b"}}\n{"translation": \n')
    empty = w.write("eval_empty.jsonl", "")
    return [
        Case(
            g,
            "YAML max_new_tokens: 2.5 (item 7)",
            with_yaml({**base, "max_new_tokens": 2.5}),
            "error",
            r"eval\.yaml: `max_new_tokens` must be an integer, got 2\.5",
        ),
        Case(
            g,
            "YAML strategies: greedy (item 7)",
            parsed({"strategies": "greedy"}, "strategies"),
            "value",
            check=lambda value: value == ["greedy"],
        ),
        Case(
            g,
            "YAML strategies: 'greedy beam'",
            with_yaml({**base, "strategies": "greedy beam"}),
            "error",
            r"`strategies` must be a list of strings.*\[greedy, beam\]",
        ),
        Case(
            g,
            "YAML strategies: [greedy, 3]",
            with_yaml({**base, "strategies": ["greedy", 3]}),
            "error",
            r"`strategies`.*item 1",
        ),
        Case(
            g,
            "YAML drafters: one path, not a list",
            parsed({"drafters": str(w.eval_dir / "drafter")}, "drafters"),
            "value",
            check=lambda value: value == [str(w.eval_dir / "drafter")],
        ),
        Case(
            g,
            "YAML batch_size: true",
            with_yaml({**base, "batch_size": True}),
            "error",
            r"`batch_size` must be an integer, got true",
        ),
        Case(
            g,
            "YAML sweep_batch_sizes: [1, 2.5]",
            with_yaml({**base, "sweep_batch_sizes": [1, 2.5]}),
            "error",
            r"`sweep_batch_sizes`.*item 1",
        ),
        Case(
            g,
            "YAML sweep_batch_sizes: 8",
            parsed({"sweep_batch_sizes": 8}, "sweep_batch_sizes"),
            "value",
            check=lambda value: value == [8],
        ),
        Case(g, "YAML dtype: 16", with_yaml({**base, "dtype": 16}), "error", r"`dtype` must be a string"),
        Case(g, "YAML limit: ten", with_yaml({**base, "limit": "ten"}), "error", r"`limit` must be an integer"),
        Case(
            g,
            "YAML limit: 1.0e3",
            parsed({"limit": 1000.0}, "limit"),
            "value",
            check=lambda value: value == 1000 and type(value) is int,
        ),
        Case(
            g,
            "YAML target_lang: no (Norwegian, unquoted)",
            with_yaml("verifier_name_or_path: v\ndrafters: [d]\ndataset_name: x\nsource_lang: en\ntarget_lang: no\n"),
            "error",
            r"`target_lang` must be a string, got false.*quote",
        ),
        Case(
            g,
            "YAML data_files as a {split: path} mapping",
            lambda: (
                parse_evaluation_arguments(
                    ["--config", w.yaml("eval_map.yaml", {**base, "data_files": {"test": str(FIXTURE)}})]
                )[1].data_files
            ),
            "value",
            check=lambda value: value == {"test": [str(FIXTURE)]},
        ),
        Case(
            g,
            "YAML num_beam (unknown key)",
            with_yaml({**base, "num_beam": 4}),
            "error",
            r"unknown keys \['num_beam'\]",
        ),
        Case(g, "YAML file holding a list", with_yaml("- greedy\n- beam\n"), "error", r"must hold `key: value` lines"),
        Case(
            g,
            "YAML syntax error",
            with_yaml("strategies: [greedy,\n"),
            "error",
            r"eval\.yaml, line \d+, column \d+, is not valid YAML",
        ),
        Case(
            g,
            "--config of a missing file",
            lambda: evaluate.main(["--config", str(w.files / "none.yaml")]),
            "error",
            r"none\.yaml: no such file",
        ),
        Case(
            g, "--config of a directory", lambda: evaluate.main(["--config", str(w.files)]), "error", r"is a directory"
        ),
        Case(
            g,
            "--max_new_tokens 2.5",
            cli(**{"--max_new_tokens": "2.5"}),
            "error",
            r"--max_new_tokens.*must be an integer, got '2\.5'",
        ),
        Case(g, "--batch_size abc", cli(**{"--batch_size": "abc"}), "error", r"--batch_size.*must be an integer"),
        Case(g, "--sweep maybe", cli(**{"--sweep": "maybe"}), "error", r"--sweep.*true or false"),
        Case(
            g,
            "--strategies nucleus",
            cli(**{"--strategies": "greedy nucleus"}),
            "error",
            r"unknown strategy name.*nucleus",
        ),
        Case(
            g,
            "--drafters path of three parts, missing (item 9)",
            cli(**{"--drafters": "models/demo-en-de/drafterx"}),
            "error",
            r"`drafters` 'models/demo-en-de/drafterx': no such directory",
        ),
        Case(
            g,
            "--drafters runs/missing, offline (item 9)",
            cli(**{"--drafters": "runs/missing"}),
            "error",
            r"`drafters` 'runs/missing': no such directory.*offline",
        ),
        Case(
            g,
            "--drafters truncated safetensors (item 9)",
            cli(**{"--drafters": str(w.eval_dir / "truncated_drafter")}),
            "error",
            r"truncated_drafter/model\.safetensors cannot be read",
        ),
        Case(
            g,
            "--drafters a config.json file",
            cli(**{"--drafters": str(w.eval_dir / "drafter" / "config.json")}),
            "error",
            r"is a file: give the directory",
        ),
        Case(
            g,
            "--verifier_name_or_path missing",
            cli(**{"--verifier_name_or_path": str(w.root / "no_verifier")}),
            "error",
            r"`verifier_name_or_path`.*no such directory",
        ),
        Case(
            g,
            "--tokenizer_name_or_path missing",
            cli(**{"--tokenizer_name_or_path": "tok/en/de"}),
            "error",
            r"`tokenizer_name_or_path`.*no such directory",
        ),
        Case(
            g,
            "--assistant_model missing (assisted)",
            cli(**{"--strategies": "greedy assisted", "--assistant_model": "no/such/assistant"}),
            "error",
            r"`assistant_model`.*no such directory",
        ),
        Case(
            g,
            "--data_files malformed JSONL (item 8)",
            cli(**{"--data_files": f"test={broken}"}),
            "error",
            r"eval_broken\.jsonl', line 2",
        ),
        Case(
            g,
            "--data_files empty JSONL (item 8)",
            cli(**{"--data_files": f"test={empty}"}),
            "error",
            r"eval_empty\.jsonl' is empty",
        ),
        Case(g, "--device cuda on a CPU machine", cli(**{"--device": "cuda"}), "error", r"CUDA is not available"),
        Case(g, "--limit 0", cli(**{"--limit": "0"}), "error", r"`limit` must be >= 1"),
        Case(
            g,
            "a tiny complete run",
            lambda: evaluate.main(w.eval_argv()),
            "value",
            check=lambda results: isinstance(results, dict),
        ),
    ]


def training_cases(w: Workspace) -> list[Case]:
    """train_drafter.py: YAML and command-line values (item 7), models and checkpoints (item 9), a real run."""
    g = "train_drafter.py"

    def train(name, **overrides):
        return lambda: train_drafter.main(["--config", w.train_yaml(name, **overrides)])

    def parsed(attribute, **overrides):
        return lambda: getattr(
            train_drafter.parse_yaml_and_cli(
                [train_drafter.DrafterTrainingArguments], ["--config", w.train_yaml("parsed", **overrides)]
            )[0],
            attribute,
        )

    damaged = w.root / "damaged_distilled"
    shutil.copytree(w.root / "distilled", damaged)
    for arrow in damaged.glob("data-*.arrow"):
        truncate(arrow, 0.5)

    def truncated_optimizer():
        config = w.train_yaml("resumable")
        train_drafter.main(["--config", config])
        optimizer = w.root / "resumable" / "checkpoint-2" / "optimizer.bin"
        truncate(optimizer, 0.9)
        return train_drafter.main(["--config", config, "--max_steps", "3", "--resume_from_checkpoint", "latest"])

    return [
        Case(
            g,
            "YAML max_steps: 2.5 (item 7)",
            train("t1", max_steps=2.5),
            "error",
            r"t1\.yaml: `max_steps` must be an integer, got 2\.5",
        ),
        Case(
            g,
            "YAML drafter_config: [1, 2] (item 7)",
            train("t2", drafter_config=[1, 2]),
            "error",
            r"`drafter_config` must be a mapping, got \[1, 2\]",
        ),
        Case(
            g,
            "YAML drafter_config: null",
            train("t3", drafter_config=None),
            "error",
            r"`drafter_config` must be a mapping, got null",
        ),
        Case(
            g,
            "YAML learning_rate: fast",
            train("t4", learning_rate="fast"),
            "error",
            r"`learning_rate` must be a number",
        ),
        Case(
            g,
            "YAML mixed_precision: no (unquoted)",
            train("t5", mixed_precision=False),
            "error",
            r"`mixed_precision` must be a string, got false",
        ),
        Case(
            g,
            "YAML push_to_hub: maybe",
            train("t6", push_to_hub="maybe"),
            "error",
            r"`push_to_hub` must be true or false",
        ),
        Case(
            g,
            "YAML max_steps: 1.0e4",
            parsed("max_steps", max_steps=1.0e4),
            "value",
            check=lambda value: value == 10_000 and type(value) is int,
        ),
        Case(
            g,
            "YAML learning_rate: 5e-4 (a string to YAML 1.1)",
            lambda: (
                train_drafter.parse_yaml_and_cli(
                    [train_drafter.DrafterTrainingArguments],
                    [
                        "--config",
                        w.yaml(
                            "lr.yaml", "verifier_name_or_path: v\ntrain_data: d\noutput_dir: o\nlearning_rate: 5e-4\n"
                        ),
                    ],
                )[0].learning_rate
            ),
            "value",
            check=lambda value: value == 5e-4,
        ),
        Case(g, "YAML max_splits: 2.5", train("t7", max_splits=2.5), "error", r"`max_splits` must be an integer"),
        Case(
            g,
            "--max_steps 2.5",
            lambda: train_drafter.main(["--config", w.train_yaml("t8"), "--max_steps", "2.5"]),
            "error",
            r"--max_steps.*must be an integer, got '2\.5'",
        ),
        Case(
            g,
            "--drafter_config '[1, 2]'",
            lambda: train_drafter.main(["--config", w.train_yaml("t9"), "--drafter_config", "[1, 2]"]),
            "error",
            r"--drafter_config.*must be a mapping",
        ),
        Case(
            g,
            "verifier path missing (item 9)",
            train("t10", verifier_name_or_path=str(w.root / "runs" / "verifier")),
            "error",
            r"`verifier_name_or_path`.*no such directory",
        ),
        Case(
            g,
            "drafter_name_or_path missing (item 9)",
            train("t11", drafter_name_or_path="runs/old/drafter", drafter_config={}),
            "error",
            r"`drafter_name_or_path`.*no such directory",
        ),
        Case(
            g,
            "train_data not distilled",
            train("t12", train_data=str(w.files)),
            "error",
            r"is not a distilled dataset",
        ),
        Case(
            g,
            "train_data with a truncated arrow file",
            train("t13", train_data=str(damaged)),
            "error",
            r"damaged_distilled' cannot be read",
        ),
        Case(
            g,
            "resume from a truncated optimizer.bin (item 9)",
            truncated_optimizer,
            "error",
            r"checkpoint-2/optimizer\.bin cannot be read.*--resume_from_checkpoint .*checkpoint-1",
        ),
        Case(
            g,
            "resume 'latest' with no checkpoint",
            lambda: train_drafter.main(["--config", w.train_yaml("t14"), "--resume_from_checkpoint", "latest"]),
            "error",
            r"no complete checkpoint",
        ),
        Case(
            g,
            "resume from a directory that is no checkpoint",
            lambda: train_drafter.main(["--config", w.train_yaml("t15"), "--resume_from_checkpoint", str(w.files)]),
            "error",
            r"not a complete checkpoint",
        ),
        Case(
            g,
            "split_points all without causal prefix",
            train("t16", split_points="all", drafter_config={"decoder_layers": 1}),
            "error",
            r"prefix_attention: causal",
        ),
        Case(g, "eval_samples above the rows", train("t17", eval_samples=500), "error", r"too few to hold out"),
        Case(
            g,
            "a tiny complete run: card round-trips (edges)",
            lambda: (
                train_drafter.main(["--config", w.train_yaml("t18")]),
                ModelCard.load(w.root / "t18" / "README.md").data,
            )[1],
            "value",
            check=lambda data: data.base_model is None and data.eval_results is not None,
        ),
    ]


def other_cli_cases(w: Workspace) -> list[Case]:
    """The distillation CLI and the demo verifier script."""
    g = "distillation / demo"
    base = {
        "verifier": str(w.eval_dir / "verifier"),
        "output_dir": str(w.root / "distill_out"),
        "data_files": [f"train={FIXTURE}"],
        "source_lang": "en",
        "target_lang": "de",
        "max_samples": 4,
        "max_new_tokens": 4,
    }

    def distil(values):
        return lambda: distillation_main(["--config", w.yaml("distil.yaml", values)])

    demo = {"data_dir": str(w.files), "output_dir": str(w.root / "demo")}
    return [
        Case(
            g,
            "distillation YAML batch_size: 2.5",
            distil({**base, "batch_size": 2.5}),
            "error",
            r"`batch_size` must be an integer",
        ),
        Case(
            g,
            "distillation YAML num_beams: two",
            distil({**base, "num_beams": "two"}),
            "error",
            r"`num_beams` must be an integer",
        ),
        Case(
            g, "distillation YAML dtype: bf16", distil({**base, "dtype": "bf16"}), "error", r"`dtype` must be one of"
        ),
        Case(
            g,
            "distillation --verifier missing (item 9)",
            distil({**base, "verifier": "runs/demo/verifier/best"}),
            "error",
            r"`verifier` 'runs/demo/verifier/best': no such directory",
        ),
        Case(
            g,
            "distillation data file malformed (item 8)",
            distil({**base, "data_files": [f"train={w.write('distil_bad.jsonl', '{oops}')}"]}),
            "error",
            r"distil_bad\.jsonl', line 1",
        ),
        Case(
            g,
            "demo verifier YAML encoder_layer_map: 0",
            lambda: train_demo_verifier.parse_args(
                ["--config", w.yaml("demo.yaml", {**demo, "encoder_layer_map": 0})]
            ),
            "error",
            r"`encoder_layer_map` must be a string",
        ),
        Case(
            g,
            "demo verifier YAML dropout: high",
            lambda: train_demo_verifier.parse_args(["--config", w.yaml("demo2.yaml", {**demo, "dropout": "high"})]),
            "error",
            r"`dropout` must be a number",
        ),
        Case(
            g,
            "demo verifier reads a malformed JSONL (item 8)",
            lambda: train_demo_verifier.read_pairs(
                Path(w.write("demo_bad.jsonl", '{"translation": {"en": "a", "de": "b"}}\n{"translation"\n'))
            ),
            "error",
            r"demo_bad\.jsonl', line 2",
        ),
    ]


def main() -> None:
    """Run every case (or those `--only` selects) and print the table and the counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="Run only the cases whose group or name contains this.")
    parser.add_argument("--verbose", action="store_true", help="Print the traceback of internal and unclear errors.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as directory:
        workspace = Workspace(Path(directory))
        os.chdir(directory)  # relative paths in the cases are looked up here, not in the repository
        cases = [
            *generation_cases(workspace),
            *model_cases(workspace),
            *data_cases(workspace),
            *evaluate_cases(workspace),
            *training_cases(workspace),
            *other_cli_cases(workspace),
        ]
        if args.only:
            cases = [case for case in cases if args.only in case.group or args.only in case.name]
        outcomes = [classify(case) for case in cases]
    print("| # | where | case | outcome | message |")
    print("|---|---|---|---|---|")
    for number, outcome in enumerate(outcomes, start=1):
        detail = outcome.detail.replace("\n", " ").replace("|", "\\|")
        detail = detail if len(detail) <= 160 else detail[:157] + "..."
        print(f"| {number} | {outcome.case.group} | {outcome.case.name} | {outcome.label} | {detail} |")
    counts = Counter(outcome.label for outcome in outcomes)
    print()
    print(f"{len(outcomes)} cases: " + ", ".join(f"{counts[label]} {label}" for label in sorted(counts)))
    bad = [outcome for outcome in outcomes if outcome.label not in GOOD]
    print(f"still failing: {len(bad)}")
    if args.verbose:
        for outcome in bad:
            print(f"\n### {outcome.case.group}: {outcome.case.name}\n{outcome.trace or outcome.detail}")


if __name__ == "__main__":
    main()
