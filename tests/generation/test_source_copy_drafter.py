"""The source-copy drafter: what it proposes, exact β=1 output alone and before a trained drafter, and its refusals."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB_SIZE, build_verifier, generate_with_drafter, make_source_batch
from oracle_drafters import OracleDrafter

from specdec_hf import SourceCopyDrafter
from specdec_hf.drafters import find_source_continuations
from specdec_hf.generation.speculative_loop import confident_draft_counts

GREEDY = dict(do_sample=False, num_beams=1)


pytestmark = pytest.mark.usefixtures("fresh_draft_length_measurements")


class UnsureOracle(OracleDrafter):
    """The oracle's drafts, each stated with confidence 0.5."""

    def propose(self, *args, **kwargs):
        proposal = super().propose(*args, **kwargs)
        proposal.draft_confidence = torch.full(proposal.draft_ids.shape, 0.5)
        return proposal


def test_continuation_of_the_longest_matching_ngram():
    source = torch.tensor([[5, 6, 7, 8, 9, 6, 7, 3, -1, -1]])
    # "6 7" occurs twice: the first occurrence is continued
    copied, counts = find_source_continuations(source, torch.tensor([[2, 6, 7]]), torch.tensor([3]), 3, 3)
    assert copied.tolist() == [[8, 9, 6]] and counts.tolist() == [3]
    # "9 6 7" (the longest n-gram) wins over the earlier "6 7"
    copied, counts = find_source_continuations(source, torch.tensor([[9, 6, 7]]), torch.tensor([3]), 3, 3)
    assert copied.tolist()[0][:1] == [3] and counts.tolist() == [1]  # then the source's padding: nothing more


def test_no_match_proposes_nothing_and_padding_never_matches():
    source = torch.tensor([[5, 6, -1, -1], [5, 6, 7, 8]])
    prefix = torch.tensor([[2, 4, 0], [2, 8, 0]])  # row 1's last token is the source's last: nothing follows it
    copied, counts = find_source_continuations(source, prefix, torch.tensor([2, 2]), 2, 2)
    assert counts.tolist() == [0, 0]
    # a padded prefix: only the row's own committed tokens are matched
    copied, counts = find_source_continuations(
        source, torch.tensor([[2, 5, 1, 1]]).expand(2, -1), torch.tensor([2, 2]), 2, 1
    )
    assert copied.tolist() == [[6, 0], [6, 7]] and counts.tolist() == [1, 2]


def test_min_ngram_size_rejects_shorter_matches():
    source = torch.tensor([[5, 6, 7, 8]])
    prefix = torch.tensor([[2, 9, 6]])
    assert find_source_continuations(source, prefix, torch.tensor([3]), 2, 2, min_ngram_size=2)[1].tolist() == [0]
    assert find_source_continuations(source, prefix, torch.tensor([3]), 2, 2, min_ngram_size=1)[1].tolist() == [2]


def _same_drafts(proposal, expected) -> bool:
    """The same counts, and the same drafts up to each row's count (what follows is never verified: after a hole
    in the source's mask the tensor search leaves tokens there, the lookup zeros)."""
    ids, counts = expected
    leading = torch.arange(ids.shape[1]) < counts[:, None]
    return torch.equal(proposal.num_drafts, counts) and torch.equal(proposal.draft_ids * leading, ids * leading)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("min_ngram_size", "max_ngram_size"), [(1, 3), (2, 3), (1, 1), (2, 4)])
def test_the_cpu_index_finds_what_the_tensor_search_finds(seed, min_ngram_size, max_ngram_size):
    """`SourceNgramIndex` (the CPU's lookup) and `find_source_continuations` (the device's search) agree on ragged,
    padded rows whose prefixes repeat spans of their source, near its end and at every prefix length."""
    generator = torch.Generator().manual_seed(seed)
    rows, length, num_tokens = 5, 12, 4
    source = torch.randint(3, 9, (rows, length), generator=generator)  # a small vocabulary: many repeats
    source_lengths = torch.randint(6, length + 1, (rows,), generator=generator)
    source = source.masked_fill(torch.arange(length) >= source_lengths[:, None], -1)
    prefix = torch.randint(3, 9, (rows, 9), generator=generator)
    for row in range(rows):  # a span of the source with a token after it ends each prefix of 8
        start = int(torch.randint(0, int(source_lengths[row]) - 3, (1,), generator=generator))
        prefix[row, 5:8] = source[row, start : start + 3]
    drafter = SourceCopyDrafter(vocab_size=16, min_ngram_size=min_ngram_size, max_ngram_size=max_ngram_size)
    state = drafter.init_drafting_state(source.clamp(min=0), (source >= 0).long(), None)
    assert state.ngram_indexes is not None and torch.equal(state.source_ids, source)
    matched = 0
    for prefix_length in [*range(1, prefix.shape[1] + 1), 8]:
        lengths = torch.randint(1, prefix_length + 1, (rows,), generator=generator)
        if prefix_length == 8:
            lengths = torch.full((rows,), 8)
        expected = find_source_continuations(source, prefix, lengths, num_tokens, max_ngram_size, min_ngram_size)
        proposal = drafter.propose(state, prefix, lengths, num_tokens)
        assert _same_drafts(proposal, expected)
        matched += int((expected[1] > 0).sum())
    assert matched > 0  # the rows found continuations, not only misses
    left_padded = source.clone()  # padding before the tokens too, and a row of padding only
    left_padded[1] = torch.cat([left_padded[1, -3:], left_padded[1, :-3]])
    left_padded[2] = -1
    left_state = drafter.init_drafting_state(left_padded.clamp(min=0), (left_padded >= 0).long(), None)
    lengths = torch.tensor([0, 3, 8, 9, 1])
    expected = find_source_continuations(left_padded, prefix, lengths, num_tokens, max_ngram_size, min_ngram_size)
    proposal = drafter.propose(left_state, prefix, lengths, num_tokens)
    assert _same_drafts(proposal, expected)
    searching = SourceCopyDrafter(16, min_ngram_size=min_ngram_size, max_ngram_size=max_ngram_size, cpu_index=False)
    assert searching.init_drafting_state(source.clamp(min=0), (source >= 0).long(), None).ngram_indexes is None
    kept = drafter.select_rows(state, torch.tensor([3, 0]))
    lengths = torch.tensor([9, 8])
    expected = find_source_continuations(
        source[[3, 0]], prefix[[3, 0]], lengths, num_tokens, max_ngram_size, min_ngram_size
    )
    proposal = drafter.propose(kept, prefix[[3, 0]], lengths, num_tokens)
    assert _same_drafts(proposal, expected)


def test_the_cpu_index_stays_in_the_state_when_a_fallback_drafts():
    """Rows the copy does not continue go to the fallback: the state it returns keeps the copy's n-gram index."""
    fallback = OracleDrafter(torch.tensor([[5, 6, 7, 8]]), vocab_size=VOCAB_SIZE)
    drafter = SourceCopyDrafter(VOCAB_SIZE, num_draft_tokens=2, fallback=fallback)
    state = drafter.init_drafting_state(torch.tensor([[9, 10, 11, 12]]), None, torch.zeros(1, 4, 8))
    proposal = drafter.propose(state, torch.tensor([[2, 3]]), torch.tensor([2]), 2)  # 3 is not in the source
    assert proposal.from_fallback.tolist() == [True]
    assert proposal.state.ngram_indexes is state.ngram_indexes is not None
    proposal = drafter.propose(proposal.state, torch.tensor([[2, 3, 10]]), torch.tensor([3]), 2)
    assert proposal.draft_ids.tolist() == [[11, 12]] and proposal.num_drafts.tolist() == [2]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("num_draft_tokens", [4, "auto"])
def test_source_copy_equals_greedy(family, batch_size, num_draft_tokens):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=6, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    drafter = SourceCopyDrafter.from_verifier(model, num_draft_tokens=4, max_ngram_size=2)
    output = generate_with_drafter(model, inputs, drafter, max_new_tokens=20, num_draft_tokens=num_draft_tokens)
    assert torch.equal(output.sequences, reference)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_source_copy_with_a_fallback_equals_greedy_and_uses_both(family, batch_size):
    model = build_verifier(family)
    inputs = make_source_batch(batch_size, seed=7, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=20)
    fallback = OracleDrafter(reference, VOCAB_SIZE, 4, "right")
    drafter = SourceCopyDrafter.from_verifier(model, num_draft_tokens=4, fallback=fallback)
    output = generate_with_drafter(model, inputs, drafter, max_new_tokens=20)
    assert torch.equal(output.sequences, reference)
    assert fallback.calls > 0  # rows the source did not continue were drafted by the fallback


def _two_rows_one_copied(fallback_class):
    """A copy drafter with a `fallback_class` oracle before it, and its first proposal for two rows: row 0's "40"
    occurs in its source, followed by 8 9 10; row 1 has no match, so the fallback (right) drafts it."""
    reference = torch.tensor([[2, 40, 41, 42, 43, 44], [2, 50, 51, 52, 53, 54]])
    fallback = fallback_class(reference, VOCAB_SIZE, 3, "right")
    drafter = SourceCopyDrafter(VOCAB_SIZE, num_draft_tokens=3, max_ngram_size=2, fallback=fallback)
    source = torch.tensor([[7, 40, 8, 9, 10], [11, 12, 13, 1, 1]])
    state = drafter.init_drafting_state(source, (source != 1).long(), torch.zeros(2, 5, 4))
    return fallback, drafter, drafter.propose(state, torch.tensor([[2, 40], [2, 50]]), torch.tensor([2, 2]), 3)


def test_each_row_takes_the_copy_where_the_source_continues_it_and_the_fallback_elsewhere():
    fallback, drafter, proposal = _two_rows_one_copied(OracleDrafter)
    # row 0: "40" occurs in its source, followed by 8 9 10; row 1: no match, the fallback's (right) drafts
    assert proposal.draft_ids.tolist() == [[8, 9, 10], [51, 52, 53]]
    assert proposal.num_drafts.tolist() == [3, 3]
    assert fallback.calls == 1
    # every row continued by its source: the fallback is not called
    proposal = drafter.propose(proposal.state, torch.tensor([[2, 40], [2, 12]]), torch.tensor([2, 2]), 3)
    assert proposal.draft_ids.tolist() == [[8, 9, 10], [13, 0, 0]] and proposal.num_drafts.tolist() == [3, 1]
    assert fallback.calls == 1


def test_copied_rows_are_certain_and_the_fallbacks_keep_its_scores_and_confidence():
    """Sampling and confidence-truncated verification judge each row by what proposed it."""
    _, _, proposal = _two_rows_one_copied(UnsureOracle)

    fallback_proposal = proposal.fallback_proposal
    before = fallback_proposal.draft_logits.clone()
    logits = proposal.draft_logits
    assert torch.equal(logits[1], fallback_proposal.draft_logits[1])  # the fallback's row: its own scores
    assert torch.equal(fallback_proposal.draft_logits, before)  # and its proposal left as it was
    copied = torch.softmax(logits[0], dim=-1)
    assert torch.equal(copied.argmax(-1), torch.tensor([8, 9, 10])) and torch.all(copied.max(-1).values == 1.0)
    confidence = proposal.confidence()
    assert torch.equal(confidence[0], torch.ones(3))
    assert torch.equal(confidence[1], torch.full((3,), 0.5))  # the fallback's own
    # what the loop verifies under a threshold: the copy whole, the fallback's row cut (0.5 x 0.5 < 0.4)
    assert confident_draft_counts(confidence, 0.4).tolist() == [3, 1]


def test_confidence_truncation_cuts_the_fallbacks_rows_only():
    model = build_verifier("bart")
    inputs = make_source_batch(2, seed=3, pad_token_id=model.config.pad_token_id)
    # a source made of the verifier's own output twice over: it continues many prefixes, not all
    output_ids = model.generate(**inputs, **GREEDY, max_new_tokens=10)[:, 1:]
    source = {"input_ids": torch.cat([output_ids, output_ids], dim=1)}
    reference = model.generate(**source, **GREEDY, max_new_tokens=10)
    fallback = UnsureOracle(reference, VOCAB_SIZE, 4, "right")
    drafter = SourceCopyDrafter.from_verifier(model, num_draft_tokens=4, fallback=fallback)

    output = generate_with_drafter(model, source, drafter, max_new_tokens=10, draft_confidence_threshold=0.4)

    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    # 0.5 x 0.5 < 0.4 cuts the fallback's rows to one draft; copies (confidence 1) verify past their first
    assert fallback.calls > 0 and stats.verified_at_position[1] > 0
    # the combined scores on the sampling path (a run that completes; sampling's exactness is the chi-squared tests'):
    # top_k=1 leaves only greedy's token
    sampled = generate_with_drafter(model, source, drafter, do_sample=True, top_k=1, max_new_tokens=10)
    assert torch.equal(sampled.sequences, reference)


def test_a_source_that_holds_the_output_is_copied():
    """A source made of the verifier's own greedy output: whatever the model does with it, drafts copied from a
    source that contains the continuation are accepted where they agree, and the output stays greedy's."""
    model = build_verifier("bart")
    inputs = make_source_batch(1, seed=8, pad_token_id=model.config.pad_token_id)
    first = model.generate(**inputs, **GREEDY, max_new_tokens=12)
    # the output of `first`'s source, repeated as a source, then decoded again: the model's output for a source it
    # was built from shares its tokens often enough to be copied
    source = torch.cat([first[:, 1:], first[:, 1:]], dim=1)
    reference = model.generate(input_ids=source, **GREEDY, max_new_tokens=12)
    drafter = SourceCopyDrafter.from_verifier(model, num_draft_tokens=4, max_ngram_size=1)
    output = generate_with_drafter(model, {"input_ids": source}, drafter, max_new_tokens=12)
    assert torch.equal(output.sequences, reference)
    stats = output.speculative_stats
    assert sum(stats.verified_tokens) > 0  # the source continued some prefixes


def test_sampling_with_copied_drafts_stays_in_the_verifiers_support():
    model = build_verifier("t5")
    inputs = make_source_batch(2, seed=9, pad_token_id=model.config.pad_token_id)
    reference = model.generate(**inputs, **GREEDY, max_new_tokens=16)
    drafter = SourceCopyDrafter.from_verifier(model, num_draft_tokens=4)
    output = generate_with_drafter(model, inputs, drafter, do_sample=True, top_k=1, max_new_tokens=16)
    assert torch.equal(output.sequences, reference)  # top_k=1: the only token sampling may emit is greedy's


def test_separate_vocabularies_are_refused():
    model = build_verifier("marian", share_encoder_decoder_embeddings=False)
    with pytest.raises(ValueError, match="share one vocabulary.*share_encoder_decoder_embeddings=False"):
        SourceCopyDrafter.from_verifier(model)


def test_no_source_ids_is_refused():
    model = build_verifier("bart")
    inputs = make_source_batch(1, pad_token_id=model.config.pad_token_id)
    embeds = model.get_encoder().embed_tokens(inputs["input_ids"])
    with pytest.raises(ValueError, match="copies from the source ids.*pass the source `input_ids`"):
        embedded = {"inputs_embeds": embeds, "attention_mask": inputs["attention_mask"]}
        generate_with_drafter(model, embedded, SourceCopyDrafter.from_verifier(model), max_new_tokens=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_draft_tokens=0), "`num_draft_tokens` must be an integer >= 1"),
        (dict(max_ngram_size=2, min_ngram_size=3), "`min_ngram_size` \\(3\\) must be at most"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SourceCopyDrafter(VOCAB_SIZE, **kwargs)


def test_k_defaults_to_the_fallbacks_and_any_k_goes_with_a_fallback_without_limit():
    fallback = OracleDrafter(torch.zeros(1, 2, dtype=torch.long), VOCAB_SIZE, num_draft_tokens=3)
    assert SourceCopyDrafter(VOCAB_SIZE, fallback=fallback).num_draft_tokens == 3
    alone = SourceCopyDrafter(VOCAB_SIZE)  # without a fallback: k chosen as decoding runs, up to 8
    assert (alone.num_draft_tokens, alone.max_draft_tokens) == ("auto", 8)
    assert SourceCopyDrafter(VOCAB_SIZE, num_draft_tokens=9, fallback=fallback).num_draft_tokens == 9


def test_rows_with_and_without_copied_drafts_in_one_batch_stay_greedy():
    """A padded batch in which the source continues some rows' prefixes and not others'."""
    model = build_verifier("bart")
    drafter = SourceCopyDrafter.from_verifier(model, num_draft_tokens=4, max_ngram_size=1)
    for seed in range(10, 60):  # the first batch whose outputs reuse a source token (random weights rarely copy)
        inputs = make_source_batch(3, seed=seed, pad_token_id=model.config.pad_token_id)
        reference = model.generate(**inputs, **GREEDY, max_new_tokens=12)
        output = generate_with_drafter(model, inputs, drafter, max_new_tokens=12)
        assert torch.equal(output.sequences, reference)
        drafted = output.speculative_stats.verified_tokens
        if 0 < sum(drafted) and 0 in drafted:
            return
    pytest.fail("no batch of these seeds has rows with and without copied drafts")
