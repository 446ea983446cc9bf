"""Build an n-gram store drafter from a verifier's distilled outputs (no training):

    python -m specdec_hf.drafters.build_ngram_store --verifier models/demo-sum/verifier \
        --distilled_data data/distilled/debian_sum/train --output_dir models/demo-sum/ngram_store

It counts the verifier's greedy outputs that `python -m specdec_hf.distillation` wrote (the same data a Spec-Drafter
trains on), keeps the store's settings and the drafter's, and saves it where `evaluate.py`'s `drafters` and
`NgramStoreDrafter.from_pretrained` read it. The verifier gives the vocabulary size, the special ids the source's
preference ignores, and whether its source and target share one vocabulary (the preference is off where they do not).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from ..auto_draft_length import AUTO
from ..config_parsing import parse_yaml_and_cli
from ..model_files import load_pretrained
from .ngram_store import NgramStore
from .ngram_store_drafter import NgramStoreDrafter
from .source_copy import shares_vocabulary

logger = logging.getLogger(__name__)


@dataclass
class NgramStoreArguments:
    """What `build_ngram_store` reads, counts and writes."""

    verifier: str = field(metadata={"help": "The verifier whose outputs were distilled (a directory or a Hub id)."})
    distilled_data: str = field(metadata={"help": "A finished `specdec_hf.distillation` run (its output_dir)."})
    output_dir: str = field(
        metadata={"help": "Where the drafter goes (ngram_store.safetensors, ngram_store.json, config.json)."}
    )
    max_ngram_size: int = field(default=2, metadata={"help": "The longest context counted."})
    max_continuations: int = field(default=4, metadata={"help": "Continuations kept per context (at most 255)."})
    min_count: int = field(default=2, metadata={"help": "Contexts seen fewer times are left out."})
    source_bias: float | None = field(
        default=None,
        metadata={
            "help": "Added to the share of a continuation found in the row's source. Default: 0.3 for a verifier "
            "whose source and target share one vocabulary, 0 otherwise."
        },
    )
    num_draft_tokens: str = field(default=AUTO, metadata={"help": f"The drafter's default k: an integer or {AUTO!r}."})


def build_ngram_store(args: NgramStoreArguments) -> NgramStoreDrafter:
    """Count `args.distilled_data`'s outputs into a drafter for `args.verifier` and save it to `args.output_dir`.

    Raises:
        ValueError: for a `source_bias` above 0 with a verifier whose source and target vocabularies differ, or a
            `num_draft_tokens` that is neither an integer nor `"auto"`.
    """
    num_draft_tokens = args.num_draft_tokens
    if num_draft_tokens != AUTO:
        if not num_draft_tokens.isdigit():
            raise ValueError(f"`num_draft_tokens` must be an integer >= 1 or {AUTO!r}, got {num_draft_tokens!r}.")
        num_draft_tokens = int(num_draft_tokens)
    # the embeddings tell whether source ids mean target tokens (the config alone does not, for every family)
    verifier = load_pretrained(AutoModelForSeq2SeqLM.from_pretrained, args.verifier, "verifier")
    shared = shares_vocabulary(verifier)
    vocab_size = verifier.config.get_text_config(decoder=True).vocab_size
    del verifier
    source_bias = args.source_bias
    if source_bias is None:
        source_bias = 0.3 if shared else 0.0
        logger.info("source_bias %s (%s vocabulary)", source_bias, "a shared" if shared else "no shared")
    elif source_bias > 0 and not shared:
        raise ValueError(
            f"`source_bias` {source_bias}: {args.verifier}'s source and target vocabularies differ, so source ids "
            "are no target tokens: leave it unset (0 for such a verifier) or set it to 0."
        )
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, args.verifier, "verifier")
    store = NgramStore.from_distilled(
        args.distilled_data,
        vocab_size,
        max_ngram_size=args.max_ngram_size,
        max_continuations=args.max_continuations,
        min_count=args.min_count,
    )
    drafter = NgramStoreDrafter(
        store,
        num_draft_tokens=num_draft_tokens,
        source_bias=source_bias,
        ignored_source_ids=sorted(tokenizer.all_special_ids),
    )
    drafter.save_pretrained(args.output_dir)
    return drafter


def main(argv: list[str] | None = None) -> None:
    """Command line: `NgramStoreArguments` from `--config <yaml>` and flags; builds and saves the drafter."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    (args,) = parse_yaml_and_cli([NgramStoreArguments], argv)
    drafter = build_ngram_store(args)
    settings = drafter.store.build_settings
    print(
        f"counted {settings['num_sequences']} outputs into {len(drafter.store)} contexts; saved the n-gram store "
        f"drafter to {args.output_dir}"
    )


if __name__ == "__main__":
    main()
