"""Output quality: corpus BLEU and chrF (sacrebleu) and ROUGE-1/2/L (rouge-score), and agreement with greedy.

Pure functions over detokenised strings (and token-id lists for the agreement), so they can be checked on
hand-made examples. sacrebleu and rouge-score are used directly (not through the `evaluate` library, whose name the
top-level `evaluate.py` shadows).
"""

from __future__ import annotations

from collections.abc import Sequence

import sacrebleu
from rouge_score import rouge_scorer

__all__ = ["ROUGE_TYPES", "corpus_quality", "fraction_identical"]

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def corpus_quality(
    hypotheses: Sequence[str],
    references: Sequence[str],
    bleu_tokenize: str | None = None,
) -> dict[str, float | str]:
    """Corpus-level quality of `hypotheses` against one reference each.

    Args:
        hypotheses (`Sequence[str]`): Detokenised system outputs.
        references (`Sequence[str]`): Detokenised references, aligned with `hypotheses`.
        bleu_tokenize (`str`, *optional*): sacrebleu's BLEU tokenizer (`13a` by default, `zh`, `ja-mecab`, ...).

    Returns:
        `dict` with `bleu` and `chrf` (0–100, sacrebleu), their signatures `bleu_signature` and `chrf_signature`,
        and `rouge1`, `rouge2`, `rougeL` (0–1, mean F-measure over the sentences, Porter stemming).

    Raises:
        ValueError: when the lists are empty or of different lengths.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references.")
    if not hypotheses:
        raise ValueError("no hypotheses to score.")
    hypotheses, references = list(hypotheses), list(references)
    bleu = sacrebleu.BLEU(tokenize=bleu_tokenize) if bleu_tokenize else sacrebleu.BLEU()
    chrf = sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        scores = scorer.score(reference, hypothesis)  # rouge-score takes (target, prediction)
        for rouge_type in ROUGE_TYPES:
            totals[rouge_type] += scores[rouge_type].fmeasure
    return {
        "bleu": bleu_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf.get_signature()),
        **{rouge_type: total / len(hypotheses) for rouge_type, total in totals.items()},
    }


def fraction_identical(outputs: Sequence[Sequence[int]], greedy_outputs: Sequence[Sequence[int]]) -> float:
    """Fraction of rows whose token ids equal greedy decoding's exactly (padding already removed)."""
    if len(outputs) != len(greedy_outputs):
        raise ValueError(f"{len(outputs)} outputs but {len(greedy_outputs)} greedy outputs.")
    if not outputs:
        raise ValueError("no outputs to compare.")
    same = sum(list(a) == list(b) for a, b in zip(outputs, greedy_outputs, strict=True))
    return same / len(outputs)
