"""Export the trained demo models into the repository: half-precision safetensors, tokenizer, model cards.

    python scripts/export_demo_pair.py --task summarization --verifier runs/demo_sum_verifier/best \
        --verifier_config configs/demo/verifier_sum.yaml --output_dir models/demo-sum \
        --heldout data/debian_sum/test.jsonl --validation data/debian_sum/validation.jsonl   # the verifier alone

    python scripts/export_demo_pair.py --verifier runs/demo_verifier_v2/best --drafter runs/drafter_v2 \
        --assistant runs/demo_assistant_v2/checkpoint-last --output_dir models/demo-en-de --num_draft_tokens auto \
        --verifier_config configs/demo/verifier_v2_en_de.yaml --assistant_config configs/demo/assistant_v2_en_de.yaml
    python scripts/export_demo_pair.py --drafter runs/drafter_debian_en_de_stage2   # only a retrained drafter

Writes `output_dir/{verifier,drafter,assistant}` (loadable with `AutoModelForSeq2SeqLM` / `AutoModel` /
`AutoTokenizer`, like Hub checkpoints) and the evaluation slices with their licence notice:
`output_dir/heldout_test.jsonl`, drawn from the corpus's test split (never seen in training), and
`output_dir/heldout_validation.jsonl`, the validation rows the speculative settings are tuned on.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import torch
import yaml
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from specdec_hf import SpecDrafterModel
from specdec_hf.auto_draft_length import AUTO
from specdec_hf.data.loading import sample_indices
from specdec_hf.dtypes import TORCH_DTYPES
from specdec_hf.training import drafter_card_data

# where scripts/build_demo_pair.sh extracts the previous demo pair (its git tag), which pair v2 grows from
PREVIOUS_PAIR_DIR = Path("runs/demo_pair_v1")
PREVIOUS_PAIR_TAG = "demo-v1"

SUMMARIZATION_NOTICE = """Sources and licences of heldout_test.jsonl and heldout_validation.jsonl (rows from the test and
validation splits of the corpus built by `python -m specdec_hf.data.debian_corpus --task summarization`), and of the
data the models were trained on: Debian (bookworm) package long descriptions ("document") and their one-line
synopses ("summary"), from the package index of Debian main, under the licences of the respective packages ("id" and
"group" name the binary and source package).
"""

SUMMARIZATION_VERIFIER_CARD = """---
language: [en]
library_name: transformers
pipeline_tag: summarization
tags: [bart, speculative-decoding, specdec_hf, offline-demo]
---

# specdec_hf demo verifier: package description → synopsis

A small `BartForConditionalGeneration` ({params:.1f}M parameters: d_model {d_model}, {enc}+{dec} layers, a
{vocab}-piece Unigram vocabulary) trained on CPU by `scripts/train_demo_verifier.py --config {config}`{origin}, on
the offline summarization corpus of Debian package descriptions (a package's long description → its one-line
synopsis; see NOTICE.md), {steps} optimizer steps. Its generation config is shaped like bart-large-cnn's (beam search,
`no_repeat_ngram_size=3`, `length_penalty=2.0`, length limits scaled to synopses). It exists to show speculative
decoding on a summarization model on machines without a model hub; it is not a general-purpose summarizer. Weights
are stored in {dtype}; load them in float32 (or bfloat16) on CPUs.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("models/demo-sum/verifier", dtype="float32")
tokenizer = AutoTokenizer.from_pretrained("models/demo-sum/verifier")
```

Greedy validation ROUGE-L during training (first 300 validation rows): {score}.
{test_line}"""

NOTICE = """Sources and licences of heldout_test.jsonl and heldout_validation.jsonl (sentences from the test and
validation splits of the corpus built by `python -m specdec_hf.data.debian_corpus --task translation`), and of the
data the models were trained on:
- rows with "source": "ding" — Ding dictionary (Debian package trans-de-en), GPL-2+.
- rows with "source": "lohelp" — LibreOffice help (libreoffice-help-en-us / -de), MPL-2.0.
- rows with "source": "ddtp_desc" / "ddtp_synopsis" — Debian package descriptions and their German translations
  (Debian Description Translation Project), under the licences of the respective packages in Debian main.
"""

VERIFIER_CARD = """---
language: [en, de]
library_name: transformers
pipeline_tag: translation
tags: [marian, speculative-decoding, specdec_hf, offline-demo]
---

# specdec_hf demo verifier: English → German

A small `MarianMTModel` ({params:.1f}M parameters: d_model {d_model}, {enc}+{dec} layers, a {vocab}-piece Unigram
vocabulary shared by both languages) trained on CPU by `scripts/train_demo_verifier.py --config {config}`{origin},
on the offline corpus of Debian packages (Ding dictionary examples, LibreOffice help, Debian package descriptions;
see NOTICE.md), {steps} optimizer steps. It exists to show
speculative decoding on real text on machines without a model hub; it is not a general-purpose translator.
Weights are stored in {dtype}; load them in float32 (or bfloat16) on CPUs.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("models/demo-en-de/verifier", dtype="float32")
tokenizer = AutoTokenizer.from_pretrained("models/demo-en-de/verifier")
```

Greedy validation BLEU during training (first 300 validation sentences): {score}.
{test_line}"""

ASSISTANT_CARD = """---
language: [en, de]
library_name: transformers
tags: [marian, assisted-generation, specdec_hf, offline-demo]
---

# specdec_hf demo assistant: a small autoregressive draft model for HF assisted generation

The peer baseline of the demo: a {params:.1f}M-parameter `MarianMTModel` sharing the demo verifier's tokenizer,
trained by `scripts/train_demo_verifier.py --config {config}`{origin} on the verifier's distilled outputs, for
`generate(assistant_model=...)`. Weights in {dtype}.
"""


def training_origin(config: Path) -> str:
    """The card's words for where a model's training started: from scratch, or grown from another model (named as
    the previous demo pair where it lies where `scripts/build_demo_pair.sh` extracts that pair's git tag)."""
    init_from = (yaml.safe_load(config.read_text()) or {}).get("init_from")
    if not init_from:
        return ", from scratch"
    origin = f", starting from copies of the layers of `{init_from}`"
    if Path(init_from).is_relative_to(PREVIOUS_PAIR_DIR):
        origin += f" (the previous demo pair, git tag {PREVIOUS_PAIR_TAG})"
    return origin


def export_seq2seq(
    source: Path,
    target: Path,
    dtype: torch.dtype,
    card: str,
    training_config: Path,
    test_line: str = "",
    metric: str = "bleu",
) -> dict:
    """Save a seq2seq model + tokenizer in `dtype` with a model card naming its `training_config` and its validation
    `metric` from `eval_results.json`; returns what the card was filled with."""
    model = AutoModelForSeq2SeqLM.from_pretrained(source, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model.to(dtype).save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    results = json.loads((source / "eval_results.json").read_text()) if (source / "eval_results.json").exists() else {}
    config = model.config
    values = {
        "params": sum(p.numel() for p in model.parameters()) / 1e6,
        "d_model": config.d_model,
        "enc": config.encoder_layers,
        "dec": config.decoder_layers,
        "vocab": config.vocab_size,
        "steps": results.get("step", "?"),
        "score": f"{results[metric]:.2f}" if metric in results else "not recorded",
        "dtype": str(dtype).removeprefix("torch."),
        "test_line": test_line,
        "config": training_config.as_posix(),
        "origin": training_origin(training_config),
    }
    (target / "README.md").write_text(card.format(**values))
    return values


# each task's whole recipe, which a continued drafter's card points to for how the drafter it continued was made
BUILD_SCRIPTS = {"translation": "scripts/build_demo_pair.sh", "summarization": "scripts/build_demo_sum.sh"}


def export_drafter(
    source: Path,
    target: Path,
    dtype: torch.dtype,
    verifier_path: str,
    num_draft_tokens: int | str | None = None,
    training_config: Path | None = None,
    build_script: str = BUILD_SCRIPTS["translation"],
) -> None:
    """Save the drafter in `dtype`, pointing its config and card at the shipped verifier, with its training model card.

    `num_draft_tokens` (the k generate() drafts when given none, or "auto") is set when given, else kept as trained. A
    `training_config` (the YAML of `train_drafter.py`) is named in the card, with the drafter it continued if any and
    `build_script`, the pair's recipe that shows how that drafter was made."""
    drafter = SpecDrafterModel.from_pretrained(source, dtype=torch.float32)
    drafter.config.verifier_name_or_path = verifier_path
    if num_draft_tokens is not None:
        if num_draft_tokens != AUTO and not 1 <= num_draft_tokens <= drafter.config.max_draft_tokens:
            raise ValueError(
                "--num_draft_tokens must be between 1 and the drafter's max_draft_tokens "
                f"({drafter.config.max_draft_tokens}) or {AUTO!r}, got {num_draft_tokens}."
            )
        drafter.config.num_draft_tokens = num_draft_tokens
    drafter.to(dtype).save_pretrained(target, safe_serialization=True)
    for name in ("README.md", "eval_results.json"):
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    if (target / "README.md").exists():  # the training run's card, redone for the shipped verifier
        card = target / "README.md"
        recipe = None if training_config is None else drafter_recipe(training_config, build_script)
        text = redo_drafter_card_text(card.read_text(encoding="utf-8"), verifier_path, num_draft_tokens, recipe)
        card.write_text(text, encoding="utf-8")
        refresh_drafter_card_metadata(target, verifier_path)


# lines of the card `specdec_hf.training.write_model_card` writes
CARD_HEADING = re.compile(r"^# Spec-Drafter for `(?P<verifier>[^`]+)`$", re.MULTILINE)
CARD_DEFAULT_K = re.compile(r"\((\d+|a number chosen at every iteration) unless `generate\(\)` gets another")
# the training data (`dataset_description` of the drafter's train_drafter.py config)
CARD_DATA = re.compile(r"^- data: (?P<data>.+?)\s*$", re.MULTILINE)


def redo_drafter_card_text(
    text: str, verifier_path: str, num_draft_tokens: int | str | None, recipe: str | None
) -> str:
    """A drafter card's text for the shipped drafter: the verifier it names (a path of the training run, which means
    nothing in the repository) replaced by `verifier_path`, its default k set to `num_draft_tokens` when given, and
    a `- recipe:` line (replaced if there is one) when `recipe` is given; without one, a recipe line of an earlier
    export stays (the weights are the same). Raises `ValueError` for a card that `write_model_card` did not write."""
    heading = CARD_HEADING.search(text)
    if heading is None or CARD_DATA.search(text) is None:
        raise ValueError(
            "the drafter's README.md is not the card train_drafter.py writes (no '# Spec-Drafter for `...`' heading "
            "or '- data:' line): rewrite it with specdec_hf.training.write_model_card"
        )
    trained_with = heading["verifier"]
    text = text.replace(f"`{trained_with}`", f"`{verifier_path}`").replace(f'"{trained_with}"', f'"{verifier_path}"')
    if num_draft_tokens is not None:
        default_k = "a number chosen at every iteration" if num_draft_tokens == AUTO else num_draft_tokens
        text = CARD_DEFAULT_K.sub(f"({default_k} unless `generate()` gets another", text)
    if recipe is not None:
        text = re.sub(r"\n- recipe: [^\n]*", "", text)
        text = text.replace("\n- data: ", f"\n- recipe: {recipe}\n- data: ", 1)
    return text


def drafter_recipe(config: Path, build_script: str) -> str:
    """The card's words for how a drafter was trained: its `train_drafter.py` config, and the drafter it continued
    (made by `build_script`, the pair's whole recipe)."""
    continued = (yaml.safe_load(config.read_text()) or {}).get("drafter_name_or_path")
    recipe = f"`python train_drafter.py --config {config.as_posix()}`"
    if not continued:
        return recipe + ", from the verifier's weights"
    return (
        f"{recipe}, continuing the drafter it names (`drafter_name_or_path: {continued}`; "
        f"`{build_script}` shows how that drafter was made and runs every phase); the optimizer steps below are this "
        "training's own"
    )


def refresh_drafter_card_metadata(drafter_dir: Path, verifier_path: str) -> None:
    """Rewrite the metadata of a drafter's card (keeping its text) from its `eval_results.json` and the data its
    text names (the `- data:` line), so that each task's drafter names its own corpus."""
    results_file = drafter_dir / "eval_results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    card = ModelCard.load(drafter_dir / "README.md")
    data = CARD_DATA.search(card.text)
    if data is None:
        raise ValueError(f"{drafter_dir / 'README.md'} names no training data (no '- data:' line)")
    card.data = drafter_card_data(
        verifier_path, results, data["data"], model_name=f"specdec_hf-{drafter_dir.parent.name}-{drafter_dir.name}"
    )
    card.save(drafter_dir / "README.md")


def export_heldout(corpus_split: Path, target: Path, rows: int, seed: int) -> None:
    """A fixed random slice of a split of the corpus (no training sentence is in its test or validation split), its
    lines as they are: the rows `evaluate.py` draws with `limit: rows` and `limit_seed: seed`, in the split's order.
    Raises `ValueError` for a row with an empty text, which `evaluate.py` would leave out before its draw."""
    lines = corpus_split.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        row = json.loads(line)
        if "translation" in row:
            names, texts = "translation.en or translation.de", (row["translation"] or {}).values()
        else:
            names, texts = "document or summary", (row.get("document"), row.get("summary"))
        if not all(isinstance(text, str) and text.strip() for text in texts) or len(texts) != 2:
            raise ValueError(
                f"{corpus_split}, line {number}: an empty or missing {names}; evaluate.py skips such rows before "
                "drawing, so the slice would not be its rows. Rebuild the corpus."
            )
    target.write_text("".join(lines[i] + "\n" for i in sample_indices(len(lines), rows, seed)), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--verifier", type=Path, default=None, help="Omit to re-export only the drafter (and assistant)."
    )
    parser.add_argument("--task", choices=sorted(BUILD_SCRIPTS), default="translation")
    parser.add_argument("--drafter", type=Path, default=None, help="Omit to export the verifier alone.")
    parser.add_argument("--assistant", type=Path, default=None)
    parser.add_argument(
        "--verifier_config",
        type=Path,
        default=None,
        help="The verifier's training config, named in its card (required with --verifier).",
    )
    parser.add_argument(
        "--assistant_config",
        type=Path,
        default=None,
        help="The assistant's training config, named in its card (required with --assistant).",
    )
    parser.add_argument(
        "--drafter_config",
        type=Path,
        default=None,
        help="The drafter's train_drafter.py config, named in its card with the drafter it continued, if any.",
    )
    parser.add_argument("--output_dir", type=Path, default=Path("models/demo-en-de"))
    parser.add_argument("--heldout", type=Path, default=Path("data/debian_en_de/test.jsonl"))
    parser.add_argument("--heldout_rows", type=int, default=200)
    parser.add_argument("--validation", type=Path, default=Path("data/debian_en_de/validation.jsonl"))
    # the draw of configs/eval/demo_en_de_tuning.yaml (limit 100, limit_seed 0): the rows the settings are tuned on
    parser.add_argument("--validation_rows", type=int, default=100)
    parser.add_argument("--validation_seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="float16")
    parser.add_argument("--seed", type=int, default=0, help="The draw of the test slice.")
    parser.add_argument(
        "--num_draft_tokens",
        type=lambda text: text if text == AUTO else int(text),
        default=None,
        help="The drafter's k when generate() is given none: an integer, or 'auto' (chosen at every iteration).",
    )
    parser.add_argument("--test_results", type=str, default="", help="A line of measured test figures for the card.")
    args = parser.parse_args()
    if args.drafter_config is not None and not args.drafter_config.is_file():
        parser.error(f"--drafter_config: no such file {args.drafter_config}")
    for model, config in (("verifier", args.verifier_config), ("assistant", args.assistant_config)):
        if getattr(args, model) is not None and (config is None or not config.is_file()):
            parser.error(f"--{model} needs --{model}_config, the YAML file it was trained with (got {config})")
    dtype = TORCH_DTYPES[args.dtype]
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    if args.verifier is None and args.drafter is None:
        parser.error("nothing to export: give --verifier, --drafter or both")
    summarization = args.task == "summarization"
    if args.verifier is not None:
        card, metric = (SUMMARIZATION_VERIFIER_CARD, "rougeL") if summarization else (VERIFIER_CARD, "bleu")
        values = export_seq2seq(
            args.verifier, out / "verifier", dtype, card, args.verifier_config, args.test_results, metric
        )
        export_heldout(args.heldout, out / "heldout_test.jsonl", args.heldout_rows, args.seed)
        export_heldout(args.validation, out / "heldout_validation.jsonl", args.validation_rows, args.validation_seed)
        (out / "NOTICE.md").write_text(SUMMARIZATION_NOTICE if summarization else NOTICE)
        print(f"verifier: {values['params']:.1f}M parameters")
    if args.drafter is not None:
        export_drafter(
            args.drafter,
            out / "drafter",
            dtype,
            str(out / "verifier"),
            args.num_draft_tokens,
            args.drafter_config,
            BUILD_SCRIPTS[args.task],
        )
    if args.assistant is not None:
        export_seq2seq(args.assistant, out / "assistant", dtype, ASSISTANT_CARD, args.assistant_config)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    print(f"exported to {out} ({size:.1f} MiB in all)")


if __name__ == "__main__":
    main()
