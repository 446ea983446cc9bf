"""Speculative sampling leaves the verifier's sampling distribution unchanged (chi-square on whole outputs)."""

from __future__ import annotations

import pytest
import torch
from oracle_drafters import OracleDrafter, RandomDrafter
from transformers import BartConfig, BartForConditionalGeneration

from specdec_hf import SpecDrafterModel, acceptance, speculative_generate

VOCAB = 8
SAMPLES = 20_000
NEW_TOKENS = 3
WARPING = {
    "temperature": dict(temperature=0.7, top_k=0),
    "top_k": dict(top_k=4),
    "top_p": dict(top_p=0.8, top_k=0),
}


@pytest.fixture(scope="module")
def verifier():
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=16,
        init_std=0.1,
        forced_eos_token_id=None,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    return BartForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def source():
    return torch.tensor([[3, 4, 5, 6, 7]]).repeat(SAMPLES, 1)


def _sample(verifier, source, seed, **kwargs):
    torch.manual_seed(seed)
    return verifier.generate(input_ids=source, do_sample=True, max_new_tokens=NEW_TOKENS, **kwargs)


def _drafter(name, verifier, source, warping):
    if name == "spec_drafter":  # untrained: a full but bad proposal distribution q
        torch.manual_seed(1)
        return SpecDrafterModel.from_verifier(verifier, max_draft_tokens=2, decoder_layers=1, d_model=16).eval()
    if name == "reduced_head_features":  # q over part of the vocabulary only, drafting from the verifier's states
        torch.manual_seed(1)
        return SpecDrafterModel.from_verifier(
            verifier,
            max_draft_tokens=3,
            draft_vocab_ids=list(range(0, VOCAB, 2)),
            decoder_layers=1,
            prefix_attention="causal",
            use_verifier_encoder=True,
            verifier_state_layers=[-1],
        ).eval()
    if name == "random":  # no distribution at all: q is a point mass on random tokens
        return RandomDrafter(VOCAB, num_draft_tokens=4, seed=2)
    # good: a point mass on the verifier's greedy continuation, its most likely one
    greedy = verifier.generate(input_ids=source[:1], do_sample=False, max_new_tokens=NEW_TOKENS)
    return OracleDrafter(greedy.repeat(len(source), 1), VOCAB, num_draft_tokens=4)


def chi_square_p_value(first: torch.Tensor, second: torch.Tensor) -> float:
    """Two-sample chi-square test of homogeneity on whole output sequences; rare outcomes pooled."""
    width = max(first.shape[1], second.shape[1])  # a batch stops early when all its rows end: pad like generate()
    first, second = (torch.nn.functional.pad(x, (0, width - x.shape[1]), value=1) for x in (first, second))
    outcomes, codes = torch.unique(torch.cat([first, second]), dim=0, return_inverse=True)
    counts = torch.stack([torch.bincount(c, minlength=len(outcomes)) for c in codes.split(len(first))]).double()
    expected = counts.sum(0, keepdim=True) * counts.sum(1, keepdim=True) / counts.sum()
    rare = expected.min(0).values < 5
    if rare.any():
        counts = torch.cat([counts[:, ~rare], counts[:, rare].sum(1, keepdim=True)], dim=1)
        expected = counts.sum(0, keepdim=True) * counts.sum(1, keepdim=True) / counts.sum()
    statistic = ((counts - expected) ** 2 / expected).sum()
    dof = counts.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.double), statistic / 2))


@pytest.mark.parametrize("drafter_name", ["spec_drafter", "random", "oracle", "reduced_head_features", "truncated"])
@pytest.mark.parametrize("warping", list(WARPING))
def test_output_distribution_matches_plain_sampling(verifier, source, drafter_name, warping):
    reference = _sample(verifier, source, seed=10, **WARPING[warping])
    # truncated: the Spec-Drafter, verifying only the drafts its confidence keeps
    truncation = {"draft_confidence_threshold": 0.5} if drafter_name == "truncated" else {}
    drafter = _drafter("spec_drafter" if truncation else drafter_name, verifier, source, WARPING[warping])
    speculative = _sample(
        verifier,
        source,
        seed=11,
        **WARPING[warping],
        **truncation,
        custom_generate=speculative_generate,
        drafter=drafter,
    )
    assert len(torch.unique(reference, dim=0)) > 5, "the fixture should have a spread-out output distribution"
    assert chi_square_p_value(reference, speculative) > 0.001


@pytest.mark.parametrize("warping", list(WARPING))
def test_a_call_decoded_without_drafting_samples_the_same_distribution(verifier, source, warping, monkeypatch):
    """`"auto"`'s calls without drafting run the loop with no drafter, rows leaving the batch as they finish (not
    transformers' loop): the output distribution is plain sampling's."""
    from specdec_hf.generation import draft_length

    monkeypatch.setattr(draft_length.DraftLengthSchedule, "drafts_this_call", lambda schedule, *args: False)
    reference = _sample(verifier, source, seed=10, **WARPING[warping])
    drafter = RandomDrafter(VOCAB, num_draft_tokens=3, seed=4)
    output = _sample(
        verifier,
        source,
        seed=11,
        **WARPING[warping],
        custom_generate=speculative_generate,
        drafter=drafter,
        num_draft_tokens="auto",
        return_dict_in_generate=True,
    )
    assert output.speculative_stats.drafter_calls == 0  # a call without drafting
    assert chi_square_p_value(reference, output.sequences) > 0.001


@pytest.mark.parametrize("drafter_name", ["spec_drafter", "random", "oracle"])
def test_broken_rule_is_detected(verifier, source, drafter_name, monkeypatch):
    """The same test rejects an implementation that always accepts the drafts: it has the power to fail."""

    def always_accept(p, q, draft_ids, generator=None):
        return torch.ones_like(draft_ids, dtype=torch.bool), draft_ids

    reference = _sample(verifier, source, seed=10, **WARPING["top_k"])
    drafter = _drafter(drafter_name, verifier, source, WARPING["top_k"])
    monkeypatch.setattr(acceptance, "speculative_sampling_step", always_accept)
    broken = _sample(
        verifier, source, seed=11, **WARPING["top_k"], custom_generate=speculative_generate, drafter=drafter
    )
    assert chi_square_p_value(reference, broken) < 0.001


def test_sampling_is_reproducible_with_manual_seed(verifier, source):
    drafter = RandomDrafter(VOCAB, num_draft_tokens=3, seed=4)
    first = _sample(verifier, source[:64], 5, custom_generate=speculative_generate, drafter=drafter)
    drafter = RandomDrafter(VOCAB, num_draft_tokens=3, seed=4)
    second = _sample(verifier, source[:64], 5, custom_generate=speculative_generate, drafter=drafter)
    assert torch.equal(first, second)


def test_num_return_sequences(verifier, source):
    drafter = RandomDrafter(VOCAB, num_draft_tokens=3, seed=4)
    out = _sample(
        verifier, source[:2], 5, num_return_sequences=3, custom_generate=speculative_generate, drafter=drafter
    )
    assert out.shape[0] == 6
