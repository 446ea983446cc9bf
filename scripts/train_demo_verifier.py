"""Trains a demo verifier from scratch on a Debian corpus: en→de Marian, or BART for summarization.

The corpora come from `python -m specdec_hf.data.debian_corpus --task translation|summarization --output_dir ...`.
The script trains a shared Unigram tokenizer (`tokenizers`) on both sides, builds a small model (`model_type`), and
runs a plain PyTorch loop (token-bucketed batches, label-smoothed cross-entropy, Adam with an inverse-square-root
schedule). It checkpoints atomically every few minutes and on SIGTERM/SIGINT, so it can be stopped at any time and
resumed:

```bash
python scripts/train_demo_verifier.py --config configs/demo/verifier_en_de.yaml
python scripts/train_demo_verifier.py --config configs/demo/verifier_en_de.yaml --resume
python scripts/train_demo_verifier.py --config configs/demo/verifier_sum.yaml --resume
```

Outputs in `output_dir`: `tokenizer/`, `checkpoint-last/` (model + tokenizer + `trainer_state.pt`), `best/` (best
greedy validation score so far: BLEU for translation, ROUGE-L for summarization, with `eval_results.json`; evaluated
every `eval_every_minutes`, or every `eval_every_steps` for a rerun that evaluates the same steps on any machine, and
at `max_steps`) and `train.log`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from specdec_hf.config_parsing import parse_yaml_and_cli
from specdec_hf.data.local_files import read_jsonl
from specdec_hf.data.vocabulary_layout import pad_last_permutation, relayout_marian_model, relayout_tokenizer
from specdec_hf.distillation import load_distilled_dataset
from specdec_hf.evaluation.metrics import corpus_quality

logger = logging.getLogger("train_demo_verifier")

PAD, EOS, UNK, BOS = "<pad>", "</s>", "<unk>", "<s>"
MODEL_TYPES = ("marian", "bart")
# the task's jsonl layout (source key, target key) and the validation score that picks `best/`
TASKS = {"translation": "bleu", "summarization": "rougeL"}


@dataclass
class DemoVerifierArguments:
    """Hyper-parameters of the demo verifier run; values live in `configs/demo/verifier_en_de.yaml`."""

    data_dir: str = field(default="data/debian_en_de", metadata={"help": "Directory with train/validation.jsonl."})
    task: str = field(
        default="translation",
        metadata={
            "help": '`translation` (rows `{"translation": {"en", "de"}}`, best by BLEU) or `summarization` '
            '(rows `{"document", "summary"}`, best by ROUGE-L).'
        },
    )
    model_type: str = field(
        default="marian",
        metadata={
            "help": "`marian` (`MarianMTModel`: `<pad>` starts the decoder) or `bart` (`BartForConditionalGeneration`: "
            "`<s> ... </s>` on both sides, `</s>` starts the decoder and `<s>` is forced first, as in bart-large-cnn)."
        },
    )
    output_dir: str = field(default="runs/demo_verifier", metadata={"help": "Checkpoints, tokenizer and logs."})
    vocab_size: int = field(default=8000, metadata={"help": "Size of the shared en+de vocabulary."})
    tokenizer_model: str = field(default="unigram", metadata={"help": "`unigram` or `bpe`."})
    d_model: int = field(default=256, metadata={"help": "Model width."})
    attention_heads: int = field(default=4, metadata={"help": "Attention heads (encoder and decoder)."})
    ffn_dim: int = field(default=1024, metadata={"help": "Feed-forward width."})
    encoder_layers: int = field(default=4, metadata={"help": "Encoder layers."})
    decoder_layers: int = field(default=3, metadata={"help": "Decoder layers."})
    max_position_embeddings: int = field(default=256, metadata={"help": "Maximum positions."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout probability."})
    generation_max_length: int = field(default=128, metadata={"help": "`max_length` of the generation config."})
    max_tokens_per_sentence: int = field(default=64, metadata={"help": "Longer pairs (either side) are dropped."})
    max_source_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Sources longer than this are truncated to it (keeping `</s>`) instead of dropped; only the "
            "target is then held to max_tokens_per_sentence (summarization: long documents, short summaries)."
        },
    )
    batch_target_tokens: int = field(default=3000, metadata={"help": "Padded target tokens per batch."})
    batch_source_tokens: int | None = field(
        default=None,
        metadata={"help": "Also cap a batch's padded source tokens, and group by source length (long sources)."},
    )
    generation_num_beams: int = field(default=1, metadata={"help": "`num_beams` of the saved generation config."})
    generation_min_length: int = field(default=0, metadata={"help": "`min_length` of the saved generation config."})
    generation_no_repeat_ngram_size: int = field(
        default=0, metadata={"help": "`no_repeat_ngram_size` of the saved generation config."}
    )
    generation_length_penalty: float = field(
        default=1.0, metadata={"help": "`length_penalty` of the saved generation config (beam search only)."}
    )
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate."})
    warmup_steps: int = field(default=1000, metadata={"help": "Linear warm-up, then inverse square root decay."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam beta1."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2."})
    label_smoothing: float = field(default=0.1, metadata={"help": "Label smoothing of the cross-entropy."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    max_steps: int = field(default=10_000_000, metadata={"help": "Stop after this many optimizer steps."})
    max_hours: float = field(default=8.0, metadata={"help": "Stop after this much training wall time (all runs)."})
    seed: int = field(default=0, metadata={"help": "Seed for initialisation and batch order."})
    num_threads: int = field(default=1, metadata={"help": "`torch.set_num_threads`."})
    log_every_steps: int = field(default=20, metadata={"help": "Steps between log lines."})
    save_every_minutes: float = field(default=10.0, metadata={"help": "Wall minutes between checkpoints."})
    eval_every_minutes: float = field(
        default=30.0, metadata={"help": "Wall minutes between BLEU evaluations (unused with eval_every_steps)."}
    )
    eval_every_steps: int | None = field(
        default=None,
        metadata={
            "help": "Steps between BLEU evaluations, in place of eval_every_minutes: a rerun then evaluates, and "
            "saves `best` from, the same steps on any machine (a run stopped on a step due for evaluation "
            "evaluates it when resumed)."
        },
    )
    eval_samples: int = field(default=300, metadata={"help": "First N validation sentences used for BLEU."})
    eval_batch_size: int = field(default=50, metadata={"help": "Sentences per generation batch."})
    max_train_examples: int | None = field(default=None, metadata={"help": "Debug: use only the first N pairs."})
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Reuse this tokenizer instead of training one (e.g. an assistant sharing a verifier's)."},
    )
    distilled_train_data: str | None = field(
        default=None,
        metadata={
            "help": "Train on a distilled dataset (specdec_hf.distillation output: `source` -> `target`, the "
            "verifier's outputs) instead of data_dir/train.jsonl."
        },
    )
    init_from: str | None = field(
        default=None,
        metadata={
            "help": "A trained Marian model (directory) to grow this one from: its tokenizer, embeddings and layers "
            "start the run (progressive stacking, Gong et al. 2019, via the layer maps). A tokenizer with `<pad>` "
            "at id 0 is first re-laid with `<pad>` last, as in Marian checkpoints. With model_type 'bart': a "
            "trained BART of this shape, continued whole (e.g. on its own outputs, `distilled_train_data`)."
        },
    )
    encoder_layer_map: str | None = field(
        default=None,
        metadata={"help": "With init_from: the source encoder layer of each encoder layer, e.g. `0,1,2,3`."},
    )
    decoder_layer_map: str | None = field(
        default=None,
        metadata={"help": "With init_from: the source decoder layer of each decoder layer, e.g. `0,1,2,0,1,2`."},
    )
    resume: bool = field(default=False, metadata={"help": "Continue from `output_dir/checkpoint-last`."})

    def __post_init__(self):
        if self.tokenizer_model not in ("unigram", "bpe"):
            raise ValueError(f"tokenizer_model must be 'unigram' or 'bpe', got {self.tokenizer_model!r}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {tuple(TASKS)}, got {self.task!r}")
        if self.max_source_tokens is not None and not 2 <= self.max_source_tokens <= self.max_position_embeddings:
            raise ValueError(
                f"max_source_tokens must be between 2 and max_position_embeddings ({self.max_position_embeddings}), "
                f"got {self.max_source_tokens}"
            )
        if self.model_type == "bart" and self.init_from and (self.encoder_layer_map or self.decoder_layer_map):
            raise ValueError(
                "init_from with model_type 'bart' continues that model whole: leave encoder_layer_map and "
                "decoder_layer_map unset (growing by layer maps is for Marian models)"
            )
        if self.d_model % self.attention_heads:
            raise ValueError("d_model must be divisible by attention_heads")
        if self.eval_every_steps is not None and self.eval_every_steps < 1:
            raise ValueError(f"eval_every_steps must be at least 1 (or unset), got {self.eval_every_steps}")
        if self.max_tokens_per_sentence > self.max_position_embeddings:
            raise ValueError("max_tokens_per_sentence must not exceed max_position_embeddings")
        if self.generation_max_length > self.max_position_embeddings:
            raise ValueError(
                f"generation_max_length ({self.generation_max_length}) must not exceed max_position_embeddings "
                f"({self.max_position_embeddings}): the evaluation's greedy outputs would run past the positions"
            )
        for name, depth in (("encoder_layer_map", self.encoder_layers), ("decoder_layer_map", self.decoder_layers)):
            layer_map = getattr(self, name)
            if layer_map is None:
                continue
            if self.init_from is None:
                raise ValueError(f"{name} needs init_from (the model whose layers it copies)")
            if len(parse_layer_map(layer_map)) != depth:
                raise ValueError(f"{name}={layer_map!r} must name one source layer for each of the {depth} layers")
        if self.init_from and self.tokenizer_name_or_path:
            raise ValueError("init_from brings its own tokenizer: leave tokenizer_name_or_path unset")


def parse_layer_map(text: str) -> list[int]:
    """`"0,1,2,0,1,2"` -> `[0, 1, 2, 0, 1, 2]`."""
    try:
        return [int(part) for part in str(text).split(",")]
    except ValueError:
        raise ValueError(f"a layer map is comma-separated layer indices such as '0,1,2,0,1,2', got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> DemoVerifierArguments:
    """Reads `--config <yaml>` as defaults, then applies the other command-line flags as overrides."""
    (args,) = parse_yaml_and_cli([DemoVerifierArguments], argv)
    return args


# ----------------------------------------------------------------------------------------------------------------
# Data and tokenizer
# ----------------------------------------------------------------------------------------------------------------
def read_pairs(path: Path, limit: int | None = None, task: str = "translation") -> list[tuple[str, str]]:
    """Reads `(source, target)` pairs from a `.jsonl` file: `(en, de)` for translation, `(document, summary)` for
    summarization."""
    pairs = []
    for number, row in enumerate(read_jsonl(path), start=1):
        if task == "summarization":
            if not isinstance(row.get("document"), str) or not isinstance(row.get("summary"), str):
                raise ValueError(f'{path}, row {number}: expected {{"document": ..., "summary": ...}}, got {row}')
            pairs.append((row["document"], row["summary"]))
        else:
            translation = row.get("translation")
            if not isinstance(translation, dict) or not {"en", "de"} <= translation.keys():
                raise ValueError(
                    f'{path}, row {number}: expected {{"translation": {{"en": ..., "de": ...}}}}, got {row}'
                )
            pairs.append((translation["en"], translation["de"]))
        if limit is not None and len(pairs) >= limit:
            break
    return pairs


def train_tokenizer(
    pairs: list[tuple[str, str]], args: DemoVerifierArguments, save_dir: Path
) -> PreTrainedTokenizerFast:
    """
    Trains a SentencePiece-style tokenizer shared by both sides (Metaspace pre-tokenizer, Unigram or BPE model).

    Args:
        pairs (`list[tuple[str, str]]`): Training pairs.
        args (`DemoVerifierArguments`): Uses `vocab_size`, `tokenizer_model` and `model_type`.
        save_dir (`Path`): Where the tokenizer is saved in Hugging Face format.

    Returns:
        `PreTrainedTokenizerFast`: for Marian, `<pad>` (id 0), `</s>` (id 1), `<unk>` (id 2), and `</s>` appended
        on encoding; for BART, BART's layout: `<s>` (0), `<pad>` (1), `</s>` (2), `<unk>` (3), and `<s> ... </s>`.
    """
    special = [BOS, PAD, EOS, UNK] if args.model_type == "bart" else [PAD, EOS, UNK]
    if args.tokenizer_model == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=args.vocab_size, special_tokens=special, unk_token=UNK)
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=special)
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator((text for pair in pairs for text in pair), trainer=trainer, length=2 * len(pairs))
    if args.model_type == "bart":
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A {EOS}",
            pair=f"{BOS} $A {EOS} $B {EOS}",
            special_tokens=[(BOS, tokenizer.token_to_id(BOS)), (EOS, tokenizer.token_to_id(EOS))],
        )
        extra = {"bos_token": BOS}
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {EOS}", pair=f"$A $B {EOS}", special_tokens=[(EOS, tokenizer.token_to_id(EOS))]
        )
        extra = {}
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK, **extra
    )
    hf_tokenizer.model_max_length = args.max_position_embeddings
    hf_tokenizer.save_pretrained(save_dir)
    return hf_tokenizer


def encode_pairs(
    tokenizer: PreTrainedTokenizerFast,
    pairs: list[tuple[str, str]],
    max_tokens: int,
    max_source_tokens: int | None = None,
) -> list[tuple[list[int], list[int]]]:
    """
    Tokenizes pairs (with the tokenizer's special tokens) and drops those longer than `max_tokens` on either side;
    with `max_source_tokens`, longer sources are cut to it instead (their last token, `</s>`, kept) and only the
    target is held to `max_tokens`.
    """
    sources = tokenizer([source for source, _ in pairs], add_special_tokens=True)["input_ids"]
    targets = tokenizer([target for _, target in pairs], add_special_tokens=True)["input_ids"]
    if max_source_tokens is not None:
        sources = [s if len(s) <= max_source_tokens else s[: max_source_tokens - 1] + s[-1:] for s in sources]
        return [(s, t) for s, t in zip(sources, targets, strict=True) if len(t) <= max_tokens]
    return [(s, t) for s, t in zip(sources, targets, strict=True) if len(s) <= max_tokens and len(t) <= max_tokens]


def make_batches(
    examples: list[tuple[list[int], list[int]]],
    max_target_tokens: int,
    seed: int,
    max_source_tokens: int | None = None,
) -> list[list[int]]:
    """
    Groups example indices into batches of similar length holding at most `max_target_tokens` padded target tokens
    (and, with `max_source_tokens`, at most that many padded source tokens, grouping by source length first).

    The order depends only on `seed` (e.g. `seed + epoch`), so a run can be resumed at a batch index.
    """
    rng = random.Random(seed)
    if max_source_tokens is None:
        order = sorted(range(len(examples)), key=lambda i: (len(examples[i][1]), len(examples[i][0]), rng.random()))
    else:
        order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), len(examples[i][1]), rng.random()))
    batches, current, longest_target, longest_source = [], [], 0, 0
    for i in order:
        source_length, target_length = len(examples[i][0]), len(examples[i][1])
        too_many_targets = max(longest_target, target_length) * (len(current) + 1) > max_target_tokens
        too_many_sources = (
            max_source_tokens is not None
            and max(longest_source, source_length) * (len(current) + 1) > max_source_tokens
        )
        if current and (too_many_targets or too_many_sources):
            batches.append(current)
            current, longest_target, longest_source = [], 0, 0
        current.append(i)
        longest_target, longest_source = max(longest_target, target_length), max(longest_source, source_length)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(
    examples: list[tuple[list[int], list[int]]], indices: list[int], pad_id: int, decoder_start_id: int
) -> dict[str, torch.Tensor]:
    """Pads a batch; `labels` use -100 for padding and `decoder_input_ids` are the labels shifted right."""
    sources, targets = [examples[i][0] for i in indices], [examples[i][1] for i in indices]
    src_len, tgt_len = max(map(len, sources)), max(map(len, targets))
    input_ids = torch.full((len(indices), src_len), pad_id, dtype=torch.long)  # (batch, src_len)
    labels = torch.full((len(indices), tgt_len), -100, dtype=torch.long)  # (batch, tgt_len)
    decoder_input_ids = torch.full((len(indices), tgt_len), pad_id, dtype=torch.long)  # (batch, tgt_len)
    for row, (src, tgt) in enumerate(zip(sources, targets, strict=True)):
        input_ids[row, : len(src)] = torch.tensor(src)
        labels[row, : len(tgt)] = torch.tensor(tgt)
        decoder_input_ids[row, 0] = decoder_start_id
        decoder_input_ids[row, 1 : len(tgt)] = torch.tensor(tgt[:-1])
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != pad_id).long(),
        "decoder_input_ids": decoder_input_ids,
        "labels": labels,
    }


# ----------------------------------------------------------------------------------------------------------------
# Model, optimisation, checkpoints
# ----------------------------------------------------------------------------------------------------------------
def _architecture(args: DemoVerifierArguments, tokenizer: PreTrainedTokenizerFast) -> dict:
    """The config fields both model types take from the arguments: vocabulary, widths, depths, positions, dropout."""
    return {
        "vocab_size": len(tokenizer),
        "d_model": args.d_model,
        "encoder_layers": args.encoder_layers,
        "decoder_layers": args.decoder_layers,
        "encoder_attention_heads": args.attention_heads,
        "decoder_attention_heads": args.attention_heads,
        "encoder_ffn_dim": args.ffn_dim,
        "decoder_ffn_dim": args.ffn_dim,
        "max_position_embeddings": args.max_position_embeddings,
        "dropout": args.dropout,
    }


# the config fields a model continued whole must share with the model it starts from: its shape, and what its
# weights mean (activation, embedding scale, special ids, tying); dropout and generation settings may differ
_CONTINUED_FIELDS = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
    "activation_function",
    "scale_embedding",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "tie_word_embeddings",
)


def _zero_pad_row(model: PreTrainedModel, pad_token_id: int) -> None:
    """Start the `<pad>` embedding row at zero (`zero_pad_row_gradient` keeps it there)."""
    with torch.no_grad():
        model.get_input_embeddings().weight[pad_token_id].zero_()


def build_model(args: DemoVerifierArguments, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised model of `args.model_type` with shared, tied embeddings and its generation config."""
    if args.model_type == "bart":
        return build_bart_model(args, tokenizer)
    config = MarianConfig(
        **_architecture(args, tokenizer),
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    model = MarianMTModel(config)
    model.generation_config = GenerationConfig(
        max_length=args.generation_max_length,
        num_beams=1,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        # as in Marian checkpoints: the decoder starts from <pad>, which is never generated
        bad_words_ids=[[tokenizer.pad_token_id]],
    )
    _zero_pad_row(model, tokenizer.pad_token_id)
    return model


def build_bart_model(args: DemoVerifierArguments, tokenizer: PreTrainedTokenizerFast) -> BartForConditionalGeneration:
    """
    A randomly initialised `BartForConditionalGeneration` laid out as bart-large-cnn is: `</s>` starts the decoder,
    `<s>` is forced first and `</s>` last, and the generation config carries the `generation_*` settings (beam
    search, `min_length`, n-gram blocking, length penalty) scaled to this corpus.
    """
    config = BartConfig(
        **_architecture(args, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = BartForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        max_length=args.generation_max_length,
        min_length=args.generation_min_length,
        num_beams=args.generation_num_beams,
        no_repeat_ngram_size=args.generation_no_repeat_ngram_size,
        length_penalty=args.generation_length_penalty,
        early_stopping=args.generation_num_beams > 1,
        do_sample=False,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        forced_bos_token_id=tokenizer.bos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
    )
    _zero_pad_row(model, tokenizer.pad_token_id)
    return model


def load_growth_source(path: str, model_type: str = "marian") -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Loads the model to start from (float32): a BART as it is, a Marian model re-laid with `<pad>` last when its
    tokenizer has it elsewhere."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    if model_type == "bart":
        return BartForConditionalGeneration.from_pretrained(path, dtype=torch.float32), tokenizer
    source = MarianMTModel.from_pretrained(path, dtype=torch.float32)
    if tokenizer.pad_token_id != len(tokenizer) - 1:
        old_ids = pad_last_permutation(len(tokenizer), tokenizer.pad_token_id)
        tokenizer = relayout_tokenizer(tokenizer, old_ids)
        relayout_marian_model(source, old_ids, tokenizer)
        logger.info("re-laid %s with <pad> last (id %d)", path, tokenizer.pad_token_id)
    return source, tokenizer


@torch.no_grad()
def grow_from(model: MarianMTModel, source: MarianMTModel, args: DemoVerifierArguments) -> None:
    """
    Starts `model` from `source`: shared embeddings, output bias and, per the layer maps, copies of its layers.

    Progressive stacking (Gong et al., 2019, "Efficient Training of BERT by Progressively Stacking") initialises a
    deeper model with copies of a trained shallower one's layers; `decoder_layer_map="0,1,2,0,1,2"` stacks a 3-layer
    decoder twice. Layers without a map keep their random initialisation.
    """
    if source.config.d_model != model.config.d_model or source.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"init_from {args.init_from}: its width and vocabulary must match this model's")
    model.get_input_embeddings().weight.copy_(source.get_input_embeddings().weight)
    model.final_logits_bias.copy_(source.final_logits_bias)
    for side, layer_map in (("encoder", args.encoder_layer_map), ("decoder", args.decoder_layer_map)):
        if layer_map is None:
            continue
        source_layers = getattr(source.model, side).layers
        for target, index in zip(getattr(model.model, side).layers, parse_layer_map(layer_map), strict=True):
            if not 0 <= index < len(source_layers):
                raise ValueError(f"{side}_layer_map: {args.init_from} has {len(source_layers)} {side} layers")
            target.load_state_dict(source_layers[index].state_dict())


@torch.no_grad()
def continue_from(
    model: BartForConditionalGeneration, source: BartForConditionalGeneration, args: DemoVerifierArguments
) -> None:
    """Starts `model` as a copy of `source`, every weight (a BART continued whole).

    Raises:
        ValueError: when the two configs differ in a field of `_CONTINUED_FIELDS` (the shape, or what the weights
            mean).
    """
    differing = {
        name: (getattr(source.config, name), getattr(model.config, name))
        for name in _CONTINUED_FIELDS
        if getattr(source.config, name) != getattr(model.config, name)
    }
    if differing:
        raise ValueError(
            f"init_from {args.init_from}: its {differing} (theirs, this config's) differ: give the settings of the "
            "model to continue"
        )
    model.load_state_dict(source.state_dict())


def zero_pad_row_gradient(model: PreTrainedModel) -> None:
    """
    Keeps the `<pad>` embedding row at zero: the tied LM head sends it gradient (`padding_idx` only protects the
    lookup), so its gradient is cleared before every optimizer step.
    """
    weight = model.get_input_embeddings().weight
    if weight.grad is not None:
        weight.grad[model.config.pad_token_id].zero_()


def label_smoothed_loss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float, pad_id: int) -> torch.Tensor:
    """
    Label-smoothed cross-entropy summed over the counted targets, smoothing over every class but `<pad>`.

    Args:
        logits (`torch.Tensor` of shape `(batch, tgt_len, vocab)`): The model's scores.
        labels (`torch.Tensor` of shape `(batch, tgt_len)`): Targets, `-100` where not counted.
        epsilon (`float`): Label smoothing.
        pad_id (`int`): The class left out of the smoothing (never a target, never generated).
    """
    counted = labels != -100
    log_probs = torch.log_softmax(logits[counted].float(), dim=-1)  # (num_targets, vocab)
    nll = -log_probs.gather(-1, labels[counted].unsqueeze(-1)).squeeze(-1)
    smooth = -(log_probs.sum(-1) - log_probs[:, pad_id]) / (log_probs.size(-1) - 1)
    return ((1.0 - epsilon) * nll + epsilon * smooth).sum()


def inverse_sqrt_schedule(warmup_steps: int):
    """Multiplier of the peak learning rate: linear warm-up, then `sqrt(warmup / step)` (Vaswani et al., 2017)."""

    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / warmup_steps, math.sqrt(warmup_steps / step))

    return factor


def save_atomically(directory: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, extra: dict) -> None:
    """
    Writes model + tokenizer (+ extra files) to a temporary directory, then swaps it in with renames.

    `extra` maps a file name to a `dict` (`.json`) or any object (`torch.save`). The previous `directory` is kept as
    `<directory>.old` until the new one is in place, so a good checkpoint always exists on disk.
    """
    tmp, old = directory.with_name(directory.name + ".tmp"), directory.with_name(directory.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name, obj in extra.items():
        if name.endswith(".json"):
            (tmp / name).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
        else:
            torch.save(obj, tmp / name)
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(output_dir: Path) -> Path:
    """`checkpoint-last`, or `checkpoint-last.old` when a swap was interrupted between its two renames."""
    for name in ("checkpoint-last", "checkpoint-last.old"):
        if (output_dir / name / "trainer_state.pt").exists():
            return output_dir / name
    raise FileNotFoundError(f"--resume: no checkpoint in {output_dir}")


@torch.no_grad()
def evaluate_quality(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    pairs: list[tuple[str, str]],
    batch_size: int,
    max_source_tokens: int | None = None,
) -> dict[str, float]:
    """
    Greedy-decodes the sources of `pairs` (the generation config's other processors kept) and scores the outputs
    against the targets: BLEU and chrF (sacrebleu, 0-100) and ROUGE-1/2/L (rouge-score, here 0-100 too).
    """
    was_training = model.training
    model.eval()
    hypotheses = []
    for start in range(0, len(pairs), batch_size):
        sources = [source for source, _ in pairs[start : start + batch_size]]
        truncation = {"truncation": True, "max_length": max_source_tokens} if max_source_tokens else {}
        batch = tokenizer(sources, return_tensors="pt", padding=True, **truncation)
        output = model.generate(**batch, num_beams=1, do_sample=False)
        hypotheses += tokenizer.batch_decode(output, skip_special_tokens=True)
    model.train(was_training)
    quality = corpus_quality(hypotheses, [target for _, target in pairs])
    scores = {"bleu": quality["bleu"], "chrf": quality["chrf"]}
    scores.update({name: 100 * quality[name] for name in ("rouge1", "rouge2", "rougeL")})
    return scores


def setup_logging(output_dir: Path) -> None:
    """Logs to stdout and (appending) to `output_dir/train.log`, in place of the handlers of an earlier run in the
    same process (each line would be written once per run otherwise)."""
    formatter = logging.Formatter("%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    logger.setLevel(logging.INFO)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(output_dir / "train.log")):
        handler.setFormatter(formatter)
        logger.addHandler(handler)


class StopRequested:
    """Turns SIGTERM/SIGINT into a flag checked between optimizer steps, so the loop can checkpoint and exit."""

    def __init__(self):
        self.signal_name = None
        signal.signal(signal.SIGTERM, self._handler)
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum, frame):
        self.signal_name = signal.Signals(signum).name

    def __bool__(self) -> bool:
        return self.signal_name is not None


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------
def training_function(args: DemoVerifierArguments) -> None:
    """Runs (or resumes) the training loop until `max_steps`, `max_hours` or a signal."""
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(output_dir)
    torch.set_num_threads(args.num_threads)
    stop = StopRequested()
    logger.info("arguments: %s", json.dumps(asdict(args)))

    # 1. Tokenizer and data
    if args.distilled_train_data:
        distilled = load_distilled_dataset(args.distilled_train_data)
        train_pairs = list(zip(distilled["source"], distilled["target"], strict=True))[: args.max_train_examples]
    else:
        train_pairs = read_pairs(Path(args.data_dir) / "train.jsonl", args.max_train_examples, args.task)
    eval_pairs = read_pairs(Path(args.data_dir) / "validation.jsonl", args.eval_samples, args.task)
    if args.resume:
        checkpoint = find_checkpoint(output_dir)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(checkpoint)
    elif args.init_from:
        growth_source, tokenizer = load_growth_source(args.init_from, args.model_type)
        tokenizer.save_pretrained(output_dir / "tokenizer")
    elif args.tokenizer_name_or_path:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.tokenizer_name_or_path)
    else:
        start = time.perf_counter()
        tokenizer = train_tokenizer(train_pairs, args, output_dir / "tokenizer")
        logger.info("trained tokenizer (%d pieces) in %.0f s", len(tokenizer), time.perf_counter() - start)
    examples = encode_pairs(tokenizer, train_pairs, args.max_tokens_per_sentence, args.max_source_tokens)
    logger.info(
        "%d / %d training pairs within %d tokens", len(examples), len(train_pairs), args.max_tokens_per_sentence
    )

    # 2. Model, optimizer, schedule
    torch.manual_seed(args.seed)
    if args.resume:
        model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    else:
        model = build_model(args, tokenizer)
        if args.init_from:
            (continue_from if args.model_type == "bart" else grow_from)(model, growth_source, args)
            del growth_source
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt_schedule(args.warmup_steps))
    state = {
        "step": 0, "epoch": 0, "batch_index": 0, "elapsed": 0.0, "best_score": -1.0, "target_tokens": 0,
        "evaluated_step": None,  # the step of the latest evaluation
    }  # fmt: skip
    if args.resume:
        saved = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["torch_rng"])
        random.setstate(saved["python_rng"])
        state = {"evaluated_step": None, **saved["state"]}  # checkpoints before evaluated_step lack it
        if "best_bleu" in state:  # checkpoints of the translation-only script
            state["best_score"] = state.pop("best_bleu")
        logger.info(
            "resumed from %s at step %d (epoch %d, batch %d)",
            checkpoint,
            state["step"],
            state["epoch"],
            state["batch_index"],
        )
    logger.info("model: %.2fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)

    def save_checkpoint() -> None:
        trainer_state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "state": dict(state),
            "args": asdict(args),
        }
        save_atomically(output_dir / "checkpoint-last", model, tokenizer, {"trainer_state.pt": trainer_state})
        logger.info("saved %s at step %d", output_dir / "checkpoint-last", state["step"])

    def run_evaluation() -> None:
        state["evaluated_step"] = state["step"]
        start = time.perf_counter()
        scores = evaluate_quality(model, tokenizer, eval_pairs, args.eval_batch_size, args.max_source_tokens)
        logger.info(
            "eval step %d: BLEU %.2f chrF %.2f ROUGE-1/2/L %.2f/%.2f/%.2f on %d validation rows (%.0f s)",
            state["step"], scores["bleu"], scores["chrf"], scores["rouge1"], scores["rouge2"], scores["rougeL"],
            len(eval_pairs), time.perf_counter() - start,
        )  # fmt: skip
        metric = TASKS[args.task]
        if scores[metric] > state["best_score"]:
            state["best_score"] = scores[metric]
            results = {"step": state["step"], "num_sentences": len(eval_pairs), **scores}
            save_atomically(output_dir / "best", model, tokenizer, {"eval_results.json": results})
            logger.info("new best %s %.2f saved to %s", metric, scores[metric], output_dir / "best")

    def step_evaluation_due() -> bool:
        """Whether `eval_every_steps` is set, the current step is a multiple of it, and it is not evaluated yet."""
        every, step = args.eval_every_steps, state["step"]
        return every is not None and step > 0 and step % every == 0 and state["evaluated_step"] != step

    # a run stopped on a step due for evaluation (a signal, max_hours) evaluates it on resuming, so that the steps
    # evaluated do not depend on when it was stopped
    if step_evaluation_due():
        run_evaluation()

    # 3. Loop: one optimizer step per token bucket
    session_start = time.time()
    elapsed_at_start = state["elapsed"]
    last_save = last_eval = time.time()
    window_loss, window_tokens, window_start = 0.0, 0, time.time()
    reason = "max_steps"
    while state["step"] < args.max_steps:
        batches = make_batches(
            examples, args.batch_target_tokens, args.seed + state["epoch"], args.batch_source_tokens
        )
        while state["batch_index"] < len(batches) and state["step"] < args.max_steps:
            batch = collate(
                examples, batches[state["batch_index"]], tokenizer.pad_token_id, model.config.decoder_start_token_id
            )
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"],
            ).logits  # (batch, tgt_len, vocab)
            num_tokens = int((batch["labels"] != -100).sum())
            loss = label_smoothed_loss(logits, batch["labels"], args.label_smoothing, tokenizer.pad_token_id)
            loss = loss / num_tokens
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            zero_pad_row_gradient(model)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            state["step"] += 1
            state["batch_index"] += 1
            state["target_tokens"] += num_tokens
            state["elapsed"] = elapsed_at_start + time.time() - session_start
            window_loss += loss.item() * num_tokens
            window_tokens += num_tokens

            if state["step"] % args.log_every_steps == 0:
                now = time.time()
                logger.info(
                    "step %d epoch %d loss %.4f lr %.2e tgt_tok/s %.0f elapsed %.1f min",
                    state["step"], state["epoch"], window_loss / window_tokens, scheduler.get_last_lr()[0],
                    window_tokens / (now - window_start), state["elapsed"] / 60,
                )  # fmt: skip
                window_loss, window_tokens, window_start = 0.0, 0, now
            if stop or state["elapsed"] > args.max_hours * 3600:
                break
            if args.eval_every_steps is not None:
                evaluation_due = step_evaluation_due()
            else:
                evaluation_due = time.time() - last_eval > args.eval_every_minutes * 60
            if evaluation_due:
                run_evaluation()
                last_eval = time.time()
            if time.time() - last_save > args.save_every_minutes * 60:
                save_checkpoint()
                last_save = time.time()
        if stop:
            reason = f"signal {stop.signal_name}"
            break
        if state["elapsed"] > args.max_hours * 3600:
            reason = "max_hours"
            break
        if state["batch_index"] >= len(batches):
            state["epoch"] += 1
            state["batch_index"] = 0
    if reason == "max_steps" and state["evaluated_step"] != state["step"]:
        # the last step is evaluated too, so that a run stopped at the step of a shipped checkpoint can yield it
        run_evaluation()
    save_checkpoint()
    logger.info("stopped (%s) at step %d after %.1f min of training", reason, state["step"], state["elapsed"] / 60)


def main() -> None:
    training_function(parse_args())


if __name__ == "__main__":
    main()
