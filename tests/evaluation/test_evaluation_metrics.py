"""Quality metrics on hand-made hypotheses and references with known scores."""

from __future__ import annotations

import math

import pytest

from specdec_hf.evaluation import corpus_quality, fraction_identical


def test_identical_outputs_score_perfectly():
    texts = ["the cat sat on the mat", "a quick brown fox jumps over the dog"]
    scores = corpus_quality(texts, texts)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    for rouge_type in ("rouge1", "rouge2", "rougeL"):
        assert scores[rouge_type] == pytest.approx(1.0)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_disjoint_outputs_score_zero():
    scores = corpus_quality(["xxx yyy zzz qqq"], ["aaa bbb ccc ddd"])  # no shared word or character
    assert scores["bleu"] == 0.0
    assert scores["chrf"] == 0.0
    for rouge_type in ("rouge1", "rouge2", "rougeL"):
        assert scores[rouge_type] == 0.0


def test_hand_computed_case():
    # hypothesis vs reference, 6 tokens each (brevity penalty 1):
    # clipped n-gram precisions 5/6 ("the" counted once), 3/5, 2/4, 1/3
    scores = corpus_quality(["the cat sat on the mat"], ["the cat sat on a mat"])
    expected_bleu = 100 * math.exp((math.log(5 / 6) + math.log(3 / 5) + math.log(2 / 4) + math.log(1 / 3)) / 4)
    assert scores["bleu"] == pytest.approx(expected_bleu)  # 53.73
    assert scores["rouge1"] == pytest.approx(5 / 6)  # 5 shared unigrams, 6 on each side
    assert scores["rouge2"] == pytest.approx(3 / 5)  # the cat, cat sat, sat on
    assert scores["rougeL"] == pytest.approx(5 / 6)  # LCS "the cat sat on mat"


def test_corpus_bleu_is_not_an_average_of_sentences():
    # corpus BLEU pools n-gram counts: one perfect and one empty-overlap sentence do not average to 50
    scores = corpus_quality(["a b c d", "w x y z"], ["a b c d", "e f g h"])
    assert 0.0 < scores["bleu"] < 50.0
    assert scores["rouge1"] == pytest.approx(0.5)  # ROUGE is averaged over sentences


def test_bleu_tokenizer_is_configurable():
    scores = corpus_quality(["猫が座った"], ["猫が座った"], bleu_tokenize="zh")
    assert "tok:zh" in scores["bleu_signature"]
    assert scores["bleu"] == pytest.approx(100.0)


def test_quality_input_errors():
    with pytest.raises(ValueError, match="no hypotheses"):
        corpus_quality([], [])
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_quality(["a", "b"], ["a"])


def test_fraction_identical():
    greedy = [[5, 6, 1], [7, 1], [8, 9, 10]]
    assert fraction_identical(greedy, greedy) == 1.0
    assert fraction_identical([[5, 6, 1], [7, 2, 1], [8, 9]], greedy) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="2 outputs but 3"):
        fraction_identical(greedy[:2], greedy)
