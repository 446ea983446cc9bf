"""The draft → verify → accept loop of Speculative Decoding (Xia et al., 2023, arXiv 2203.16487, Algorithm 1).

Every iteration, for every unfinished row of the batch:

1. **Draft**: one drafter call proposes k tokens.
2. **Verify**: one verifier decoder forward scores ``[uncached committed tokens, d_1..d_k]`` on its KV cache.
3. **Accept**: the top-β/τ rule (`specdec_hf.acceptance`) keeps a prefix of the drafts and appends the verifier's
   top-1 at the first rejection (or after all k drafts); logits processors and stopping criteria are applied per
   verified position with that position's exact prefix, as greedy decoding would.
4. **Discard**: the verifier's cache is cropped back to what every row has committed.

Rows advance by different amounts. BART, T5, Marian, mBART and Pegasus take decoder positions from the cache length
alone, so the cache holds one shared length ``C = min(committed length) - 1`` and each verify forward *re-feeds* a
row's committed-but-uncached tokens before its drafts, right-padded ("ragged re-feed": these families take no
per-row position ids, so a shared cache length is the only exact layout). Padding only ever
follows a row's real tokens, so causal attention never sees it; the cropped cache holds only committed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import EncoderDecoderCache
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList
from transformers.modeling_outputs import BaseModelOutput

from ..acceptance import accept_drafts, commit_accepted_prefix, count_accepted
from ..drafting import Drafter
from ..speculative_sampling import draft_distribution, sample_drafts, speculative_sampling_step
from .processor_gating import processors_acting_on
from .stats import SpeculativeDecodingStats

__all__ = ["LoopResult", "SpeculativeLoopConfig", "confident_draft_counts", "run_speculative_loop"]

# Processors that only reshape a distribution (sampling warpers): applied to the drafter's logits too, so that its
# proposal q resembles the verifier's warped p (any q keeps sampling exact; a closer one is accepted more often).
_WARPERS = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    TopHLogitsWarper,
)


@dataclass
class SpeculativeLoopConfig:
    """Settings of one speculative decoding run (already validated)."""

    block_size: int
    beta: int
    tau: float
    max_length: int
    pad_token_id: int
    vocab_size: int  # the verifier's, read once per generate() call
    eos_token_ids: torch.LongTensor | None
    do_sample: bool = False
    output_scores: bool = False
    output_logits: bool = False
    confidence_threshold: float | None = None


@dataclass
class LoopResult:
    """What the loop produced: padded sequences, statistics and, when asked, per-position scores / logits."""

    sequences: torch.LongTensor
    stats: SpeculativeDecodingStats
    scores: tuple[torch.FloatTensor, ...] | None
    logits: tuple[torch.FloatTensor, ...] | None


def run_speculative_loop(
    verifier,
    drafter: Drafter,
    drafter_state,
    input_ids: torch.LongTensor,
    encoder_outputs: BaseModelOutput,
    encoder_attention_mask: torch.LongTensor | None,
    cache: EncoderDecoderCache,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    config: SpeculativeLoopConfig,
    streamer=None,
) -> LoopResult:
    """Generate with draft-then-verify until every row is finished.

    Args:
        verifier (`PreTrainedModel`): The encoder-decoder model being accelerated.
        drafter (`Drafter`): Implements the drafting interface of `specdec_hf.drafting`.
        drafter_state: What `drafter.init_drafting_state` returned for this batch.
        input_ids (`torch.LongTensor` of shape `(batch_size, prompt_length)`): The decoder prompt (start tokens).
        encoder_outputs (`BaseModelOutput`): The verifier's encoder output for the batch.
        encoder_attention_mask (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*): Source mask.
        cache (`EncoderDecoderCache`): An empty dynamic cache for the verifier.
        logits_processor (`LogitsProcessorList`): Processors prepared by `generate()`.
        stopping_criteria (`StoppingCriteriaList`): Criteria prepared by `generate()`.
        config (`SpeculativeLoopConfig`): β, τ, k, lengths, special tokens, greedy or sampling.
        streamer (`BaseStreamer`, *optional*): Receives the prompt, then the tokens of every iteration as they are
            accepted (batch size 1).
    """
    batch_size, prompt_length = input_ids.shape
    device = input_ids.device
    pad = config.pad_token_id
    sequences = input_ids.new_full((batch_size, config.max_length + config.block_size + 1), pad)
    sequences[:, :prompt_length] = input_ids
    lengths = [prompt_length] * batch_size
    active = list(range(batch_size))  # original row index of each row still in the work
    active_index = torch.arange(batch_size, device=device)
    cache_length = 0
    stats = SpeculativeDecodingStats.for_batch(batch_size, config.block_size)
    record = config.output_scores or config.output_logits
    recorded = [[] for _ in range(batch_size)] if record else None
    simple_stopping = all(isinstance(c, (MaxLengthCriteria, EosTokenCriteria)) for c in stopping_criteria)
    position_limit = getattr(verifier.config, "max_position_embeddings", None)
    # EAGLE-style drafters read the verifier's decoder states: position p holds the state after reading token p;
    # the buffer's rows are the active rows, in order (compacted when rows finish, like the cache)
    state_layers = getattr(drafter, "verifier_state_layers", None)
    prefix_states = None
    if streamer is not None:
        streamer.put(input_ids.cpu())

    while active:
        row_lengths = [lengths[r] for r in active]
        longest, shortest = max(row_lengths), min(row_lengths)
        # k is capped by the largest remaining length budget (the shortest row's) and the verifier's positions.
        k = min(config.block_size, config.max_length - shortest - 1)
        if position_limit is not None:
            k = min(k, position_limit - longest)
        k = max(k, 0)
        if state_layers and prefix_states is None and longest > 1:
            # a decoder prompt of several tokens has no verifier states yet: verify it alone first (no drafts)
            k = 0
        committed = sequences.index_select(0, active_index)
        lengths_t = torch.tensor(row_lengths, device=device)

        # 1. Draft
        proposal_q = None
        verify_counts = None
        if k > 0:
            states_kwargs = {}
            if state_layers:
                states_kwargs["prefix_states"] = None if prefix_states is None else prefix_states[:, :longest]
            proposal = drafter.propose(drafter_state, committed[:, :longest], lengths_t, k, **states_kwargs)
            _check_proposal(proposal, len(active), k)
            drafter_state = proposal.state
            drafts = proposal.draft_ids[:, :k].to(device)
            stats.drafter_calls += 1
            stats.proposed_tokens += k * len(active)
            if config.do_sample:
                drafts, proposal_q = _sample_proposal(proposal, drafts, committed, logits_processor, config.vocab_size)
            # the confidence is the drafter's own (its draft_confidence, or derived from its logits at its own
            # draft_ids), whatever the loop sampled: cutting on it keeps greedy output and the sampling distribution
            # exactly as they are
            confidence = None if config.confidence_threshold is None else proposal.confidence()
            if confidence is not None:
                verify_counts = confident_draft_counts(confidence[:, :k].to(device), config.confidence_threshold)
                # verify only as far as the most confident row needs; the others stop at their own count
                k = int(verify_counts.max())
                drafts = drafts[:, :k]
                if proposal_q is not None:
                    proposal_q = proposal_q[:, :k]
        else:
            drafts = committed.new_empty((len(active), 0))

        # 2. Verify: one forward over every row's uncached committed tokens followed by its drafts
        decoder_input, logit_positions = _build_verifier_input(committed, lengths_t, cache_length, drafts, pad)
        outputs = verifier(
            decoder_input_ids=decoder_input,
            encoder_outputs=encoder_outputs,
            attention_mask=encoder_attention_mask,
            cache=cache,
            use_cache=True,
            output_hidden_states=bool(state_layers),
            return_dict=True,
        )
        stats.verifier_calls += 1
        if state_layers:
            prefix_states = _record_verifier_states(
                prefix_states, outputs.decoder_hidden_states, state_layers, cache_length, sequences.shape[1]
            )
        if logit_positions is None:
            logits = outputs.logits[:, -(k + 1) :].float()
        else:
            index = logit_positions.unsqueeze(-1).expand(-1, -1, outputs.logits.shape[-1])
            logits = outputs.logits.gather(1, index).float()
        del outputs
        # drafts a row may still accept so that its bonus token stays within max_length
        budgets = (config.max_length - 1 - lengths_t).clamp(max=k)
        if verify_counts is not None:
            budgets = torch.minimum(budgets, verify_counts)

        # 3. Select the accepted tokens (position by position only where a processor can change the scores)
        acting = processors_acting_on(logits_processor, shortest, longest + k)
        if len(acting) == 0 and not config.do_sample:
            scores = logits
            new_tokens, num_accepted = _accept_without_processors(scores, drafts, budgets, config)
        else:
            rule = _SamplingRule(proposal_q) if config.do_sample else _GreedyRule(config.beta, config.tau)
            scores, new_tokens, num_accepted = _judge_per_position(
                logits, drafts, budgets, committed, lengths_t, acting, rule
            )
        num_new = num_accepted + 1

        # 4. Apply stopping criteria at every appended position
        if simple_stopping:
            num_new, finished = _stop_at_eos(new_tokens, num_new, lengths_t, config)
        else:
            num_new, finished = _stop_by_criteria(
                new_tokens, num_new, committed, lengths_t, scores, stopping_criteria, pad
            )
            finished |= lengths_t + num_new >= config.max_length

        # 5. Commit the tokens, update the statistics, drop finished rows, crop the cache
        offsets = torch.arange(k + 1, device=device)
        keep_token = offsets.unsqueeze(0) < num_new.unsqueeze(1)
        sequences[active_index.unsqueeze(1), lengths_t.unsqueeze(1) + offsets] = torch.where(
            keep_token, new_tokens, pad
        )
        if streamer is not None:
            streamer.put(new_tokens[0, : int(num_new[0])].cpu())
        num_new_list = num_new.tolist()
        accepted_list = torch.minimum(num_accepted, num_new).tolist()
        drafted_list = budgets.tolist()
        finished_list = finished.tolist()
        for local, row in enumerate(active):
            lengths[row] += num_new_list[local]
            stats.iterations[row] += 1
            stats.generated_tokens[row] += num_new_list[local]
            stats.drafted_tokens[row] += drafted_list[local]
            stats.accepted_tokens[row] += accepted_list[local]
            for position in range(drafted_list[local]):
                stats.drafted_at_position[position] += 1
            for position in range(accepted_list[local]):
                stats.accepted_at_position[position] += 1
            if record:
                recorded[row].append((scores[local, : num_new_list[local]], logits[local, : num_new_list[local]]))

        fed_length = cache_length + decoder_input.shape[1]
        if any(finished_list):
            keep = [local for local, done in enumerate(finished_list) if not done]
            active = [active[local] for local in keep]
            if not active:
                break
            keep_t = torch.tensor(keep, device=device)
            active_index = active_index.index_select(0, keep_t)
            cache.batch_select_indices(keep_t)
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs.last_hidden_state.index_select(0, keep_t)
            )
            if encoder_attention_mask is not None:
                encoder_attention_mask = encoder_attention_mask.index_select(0, keep_t)
            drafter_state = drafter.select_rows(drafter_state, keep_t)
            if prefix_states is not None:
                prefix_states = prefix_states.index_select(0, keep_t)
        cache_length = min(lengths[r] for r in active) - 1
        if fed_length > cache_length:  # Cache.crop(0) is not a no-op on every transformers version
            cache.crop(cache_length - fed_length)

    if streamer is not None:
        streamer.end()
    total_length = max(lengths)
    scores_out, logits_out = (None, None)
    if record:
        scores_out, logits_out = _assemble_per_position(recorded, lengths, prompt_length, total_length, config)
    return LoopResult(sequences[:, :total_length], stats, scores_out, logits_out)


def confident_draft_counts(confidence: torch.FloatTensor, threshold: float) -> torch.LongTensor:
    """How many leading drafts of each row to verify: those whose running product of the drafter's confidence stays
    at or above `threshold`, and always at least one (adaptive draft length, as HF's `assistant_confidence_threshold`
    and SpecDec++ (Huang et al., 2024, arXiv 2405.19715) stop drafting once the drafter is unsure).

    Args:
        confidence (`torch.FloatTensor` of shape `(rows, k)`): The drafter's probability of each draft.
        threshold (`float`): In `[0, 1]`; 0 verifies every draft.

    Returns:
        `torch.LongTensor` of shape `(rows,)`, each in `[1, k]`.
    """
    confident = torch.cumprod(confidence.float(), dim=1) >= threshold
    return count_accepted(confident).clamp(min=1)


def _record_verifier_states(
    prefix_states: torch.FloatTensor | None,
    hidden_states: tuple[torch.FloatTensor, ...],
    layers: list[int],
    cache_length: int,
    max_positions: int,
) -> torch.FloatTensor:
    """Write the verify forward's decoder states into the per-row buffer, at the positions they were computed for.

    Row r's fed positions start at the shared cache length; states of drafts that end up rejected are overwritten by
    the next forward before the drafter reads them (it reads only positions below a row's committed length - 1,
    the same invariant as the verifier cache).

    Returns:
        `torch.FloatTensor` of shape `(active_rows, max_positions, feature_width)`: the buffer of the active rows.
    """
    first = hidden_states[layers[0]]  # (rows, width, hidden_size): every layer is written straight into its slice
    rows, fed, hidden_size = first.shape
    if prefix_states is None:
        prefix_states = first.new_zeros(rows, max_positions, hidden_size * len(layers))
    width = min(fed, max_positions - cache_length)
    for slot, index in enumerate(layers):
        features = slice(slot * hidden_size, (slot + 1) * hidden_size)
        prefix_states[:, cache_length : cache_length + width, features] = hidden_states[index][:, :width]
    return prefix_states


def _check_proposal(proposal, rows: int, block_size: int) -> None:
    """A drafter must return at least k drafts per active row; fewer would misalign verification silently."""
    shape = tuple(proposal.draft_ids.shape)
    if len(shape) != 2 or shape[0] != rows or shape[1] < block_size:
        raise ValueError(
            f"The drafter returned draft_ids of shape {shape}; expected ({rows}, {block_size}) (rows, block_size)."
        )
    logits = proposal.draft_logits
    if logits is not None and (logits.shape[0] != rows or logits.shape[1] < block_size):
        raise ValueError(
            f"The drafter returned draft_logits of shape {tuple(logits.shape)}; expected ({rows}, {block_size}, vocab)."
        )
    confidence = proposal.draft_confidence
    if confidence is not None and (
        confidence.dim() != 2 or confidence.shape[0] != rows or confidence.shape[1] < block_size
    ):
        raise ValueError(
            f"The drafter returned draft_confidence of shape {tuple(confidence.shape)}; expected ({rows}, {block_size})."
        )


def _build_verifier_input(
    committed: torch.LongTensor,
    lengths: torch.LongTensor,
    cache_length: int,
    drafts: torch.LongTensor,
    pad: int,
) -> tuple[torch.LongTensor, torch.LongTensor | None]:
    """Lay out ``[committed[C:len_r], d_1..d_k, pad...]`` per row.

    Returns:
        decoder_input (`torch.LongTensor` of shape `(rows, max_uncached + k)`) and, when rows differ in their
        number of uncached tokens, the `(rows, k + 1)` positions whose logits verify the drafts (`None` means the
        last k + 1 positions of every row).
    """
    uncached = lengths - cache_length
    k = drafts.shape[1]
    max_uncached = int(uncached.max())
    if committed.shape[0] == 1 or int(uncached.min()) == max_uncached:
        decoder_input = torch.cat([committed[:, cache_length : cache_length + max_uncached], drafts], dim=1)
        return decoder_input, None
    width = max_uncached + k
    offsets = torch.arange(width, device=committed.device).unsqueeze(0)
    uncached = uncached.unsqueeze(1)
    from_committed = committed[:, cache_length : cache_length + width]
    from_drafts = drafts.gather(1, (offsets - uncached).clamp(0, max(k - 1, 0))) if k > 0 else from_committed
    decoder_input = torch.where(
        offsets < uncached, from_committed, torch.where(offsets < uncached + k, from_drafts, pad)
    )
    logit_positions = uncached - 1 + torch.arange(k + 1, device=committed.device).unsqueeze(0)
    return decoder_input, logit_positions


def _accept_without_processors(
    scores: torch.FloatTensor, drafts: torch.LongTensor, budgets: torch.LongTensor, config: SpeculativeLoopConfig
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Vectorised acceptance when the scores need no processing: all k+1 positions at once."""
    top1 = scores.argmax(dim=-1)  # (rows, k + 1)
    k = drafts.shape[1]
    if config.beta == 1:
        accepted = drafts == top1[:, :k]
    else:
        accepted = accept_drafts(scores[:, :k], drafts, config.beta, config.tau)
    return commit_accepted_prefix(drafts, accepted, top1, budgets)


def _sample_proposal(proposal, drafts, committed, logits_processor, vocab_size):
    """Sampling mode: warp the drafter's logits like the verifier's, and draw the drafts from that proposal q."""
    if proposal.draft_logits is None:
        return drafts, draft_distribution(None, drafts, vocab_size)
    # a reduced head's logits cover some ids only; the warpers (temperature, top-k/p, ...) act on them the same way
    rows, k = drafts.shape
    logits = proposal.draft_logits[:, :k].to(committed.device).float().reshape(rows * k, -1)
    warpers = [processor for processor in logits_processor if isinstance(processor, _WARPERS)]
    if warpers:
        # warpers act row by row on the scores; the prefix ids only have to be a valid tensor of the right batch
        prefixes = committed.repeat_interleave(k, dim=0)
        for warper in warpers:
            logits = warper(prefixes, logits)
    q = draft_distribution(logits.reshape(rows, k, -1), drafts, vocab_size, proposal.draft_vocab_ids)
    return sample_drafts(q), q


def _drafts_after_committed(committed: torch.LongTensor, lengths: torch.LongTensor, drafts: torch.LongTensor):
    """Committed tokens followed by the drafts: verified position i of row r has the prefix `[r, :len_r + i]`."""
    prefixes = committed.clone()
    if drafts.shape[1] > 0:
        prefixes.scatter_(1, lengths.unsqueeze(1) + torch.arange(drafts.shape[1], device=drafts.device), drafts)
    return prefixes


def _judge_per_position(
    logits: torch.FloatTensor,
    drafts: torch.LongTensor,
    budgets: torch.LongTensor,
    committed: torch.LongTensor,
    lengths: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    rule: _GreedyRule | _SamplingRule,
) -> tuple[torch.FloatTensor, torch.LongTensor, torch.LongTensor]:
    """Judge the drafts position by position, each position's scores processed with its exact prefix.

    `rule` is one acceptance mode (`_GreedyRule` or `_SamplingRule`): `rule.prepare(processed)` is what it reads of
    a position's scores (computed once per position), `rule.judge(prepared, draft, rows, position)` says which
    running rows accept their draft and what each emits where it stops, and `rule.fresh(prepared)` is the token plain
    decoding would emit (after the last draft, or where a row's length budget ends).

    Returns the processed scores `(rows, k + 1, vocab)` (zeros where a row had already stopped), the tokens to
    append `(rows, k + 1)` and the number of accepted drafts per row.
    """
    rows, k = drafts.shape
    prefixes = _drafts_after_committed(committed, lengths, drafts)
    scores = torch.zeros_like(logits)
    new_tokens = torch.empty((rows, k + 1), dtype=torch.long, device=drafts.device)
    num_accepted = torch.zeros(rows, dtype=torch.long, device=drafts.device)
    running = torch.arange(rows, device=drafts.device)
    for position in range(k + 1):
        processed = _process_by_length(
            logits_processor, prefixes, lengths + position, running, logits[running, position]
        )
        scores[running, position] = processed
        prepared = rule.prepare(processed)
        if position == k:
            new_tokens[running, position] = rule.fresh(prepared)
            break
        draft = drafts[running, position]
        accepted, stop_token = rule.judge(prepared, draft, running, position)
        in_budget = budgets[running] > position
        if not bool(in_budget.all()):
            # the length budget, not the rule, ends these rows: emit what plain decoding would emit here
            stop_token = torch.where(in_budget, stop_token, rule.fresh(prepared))
            accepted &= in_budget
        new_tokens[running, position] = torch.where(accepted, draft, stop_token)
        num_accepted[running[accepted]] += 1
        running = running[accepted]
        if running.numel() == 0:
            break
    return scores, new_tokens, num_accepted


@dataclass
class _GreedyRule:
    """Greedy mode: the top-β/τ rule (`accept_drafts`); the verifier's top-1 where a row stops."""

    beta: int
    tau: float

    def prepare(self, processed):
        return processed  # the rule reads the processed scores themselves

    def judge(self, scores, draft, rows, position):
        top1 = scores.argmax(dim=-1)  # once: the β=1 rule and the stop token both read it
        accepted = draft == top1 if self.beta == 1 else accept_drafts(scores, draft, self.beta, self.tau)
        return accepted, top1

    def fresh(self, scores):
        return scores.argmax(dim=-1)


@dataclass
class _SamplingRule:
    """Sampling mode: speculative sampling of each draft against the processed p; a residual sample at a rejection."""

    proposal_q: torch.FloatTensor  # (rows, k, vocab)

    def prepare(self, processed):
        return torch.softmax(processed, dim=-1)  # p, once per position

    def judge(self, p, draft, rows, position):
        return speculative_sampling_step(p, self.proposal_q[rows, position], draft)

    def fresh(self, p):
        return torch.multinomial(p, 1).squeeze(1)


def _process_by_length(
    logits_processor: LogitsProcessorList,
    prefixes: torch.LongTensor,
    prefix_lengths: torch.LongTensor,
    rows: torch.LongTensor,
    raw_scores: torch.FloatTensor,
) -> torch.FloatTensor:
    """Run the processors on each group of rows whose prefixes have equal length (processors read the length)."""
    row_lengths = prefix_lengths[rows]
    processed = torch.empty_like(raw_scores)
    for length in row_lengths.unique().tolist():
        group = (row_lengths == length).nonzero().squeeze(1)
        processed[group] = logits_processor(prefixes[rows[group], :length], raw_scores[group].clone())
    return processed


def _stop_at_eos(
    new_tokens: torch.LongTensor, num_new: torch.LongTensor, lengths: torch.LongTensor, config: SpeculativeLoopConfig
) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """EOS and max-length stopping, vectorised: cut each row after its first appended EOS."""
    if config.eos_token_ids is not None:
        offsets = torch.arange(new_tokens.shape[1], device=new_tokens.device).unsqueeze(0)
        is_eos = torch.isin(new_tokens, config.eos_token_ids) & (offsets < num_new.unsqueeze(1))
        hit = is_eos.any(dim=1)
        num_new = torch.where(hit, is_eos.float().argmax(dim=1) + 1, num_new)
    else:
        hit = torch.zeros_like(num_new, dtype=torch.bool)
    finished = hit | (lengths + num_new >= config.max_length)
    return num_new, finished


def _stop_by_criteria(
    new_tokens: torch.LongTensor,
    num_new: torch.LongTensor,
    committed: torch.LongTensor,
    lengths: torch.LongTensor,
    scores: torch.FloatTensor,
    stopping_criteria: StoppingCriteriaList,
    pad: int,
) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """General stopping: evaluate the criteria after each appended token, on that row's exact sequence."""
    rows, width = new_tokens.shape
    device = new_tokens.device
    offsets = torch.arange(width, device=device).unsqueeze(0)
    extended = committed.clone()
    extended.scatter_(1, lengths.unsqueeze(1) + offsets, torch.where(offsets < num_new.unsqueeze(1), new_tokens, pad))
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    for position in range(int(num_new.max())):
        candidates = ((num_new > position) & ~finished).nonzero().squeeze(1)
        if candidates.numel() == 0:
            break
        stop = torch.zeros(candidates.numel(), dtype=torch.bool, device=device)
        candidate_lengths = lengths[candidates] + position + 1
        for length in candidate_lengths.unique().tolist():
            group = (candidate_lengths == length).nonzero().squeeze(1)
            rows_in_group = candidates[group]
            stop[group] = stopping_criteria(extended[rows_in_group, :length], scores[rows_in_group, position])
        stopped = candidates[stop]
        finished[stopped] = True
        num_new[stopped] = position + 1
    return num_new, finished


def _assemble_per_position(
    recorded: list[list[tuple[torch.FloatTensor, torch.FloatTensor]]],
    lengths: list[int],
    prompt_length: int,
    total_length: int,
    config: SpeculativeLoopConfig,
) -> tuple[tuple[torch.FloatTensor, ...] | None, tuple[torch.FloatTensor, ...] | None]:
    """Turn per-row chunks into `generate()`'s layout: one `(batch_size, vocab)` tensor per generated position."""
    steps = total_length - prompt_length
    vocab = recorded[0][0][0].shape[-1]
    batch_size = len(recorded)
    device = recorded[0][0][0].device
    scores = torch.zeros((batch_size, steps, vocab), device=device)
    logits = torch.zeros((batch_size, steps, vocab), device=device)
    for row, chunks in enumerate(recorded):
        generated = lengths[row] - prompt_length
        scores[row, :generated] = torch.cat([chunk[0] for chunk in chunks])
        logits[row, :generated] = torch.cat([chunk[1] for chunk in chunks])
    scores_out = tuple(scores.unbind(1)) if config.output_scores else None
    logits_out = tuple(logits.unbind(1)) if config.output_logits else None
    return scores_out, logits_out
