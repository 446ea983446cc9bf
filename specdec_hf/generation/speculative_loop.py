"""The draft → verify → accept loop of Speculative Decoding (Xia et al., 2023, arXiv 2203.16487, Algorithm 1).

Every iteration, for every unfinished row of the batch, runs these stages, each a function below:

1. **Draft** ([`draft`]): one drafter call proposes k tokens (drawn from its distribution when sampling; cut per row
   by the drafter's confidence when `draft_confidence_threshold` is set).
2. **Verify** ([`verify`]): one verifier decoder forward scores ``[uncached committed tokens, d_1..d_k]`` on its KV
   cache (and, for drafters that read them, records its decoder states).
3. **Accept** ([`accept`]): the rules of `specdec_hf.acceptance` keep a prefix of the drafts and append the token the
   verifier emits where it stops; logits processors are applied per verified position with that position's exact
   prefix, as greedy decoding would.
4. **Stop** ([`stop`]): stopping criteria cut each row after the token that finishes it.
5. **Commit** ([`commit`]): the tokens are written, the statistics counted, finished rows dropped, and the verifier's
   cache cropped back to what every row has committed.

After the last iteration, [`assemble`] lays the outputs out as `generate()` returns them.

Rows advance by different amounts. BART, T5, Marian, mBART and Pegasus take decoder positions from the cache length
alone, so the cache holds one shared length ``C = min(committed length) - 1`` and each verify forward *re-feeds* a
row's committed-but-uncached tokens before its drafts, right-padded ("ragged re-feed": these families take no
per-row position ids, so a shared cache length is the only exact layout). Padding only ever follows a row's real
tokens, so causal attention never sees it; the cropped cache holds only committed tokens.
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.nn.functional as F
from transformers import EncoderDecoderCache
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList
from transformers.modeling_outputs import BaseModelOutput

from ..acceptance import (
    SamplingRule,
    accept_all_positions,
    count_accepted,
    judge_per_position,
    sample_proposal,
)
from ..drafting import Drafter
from .aligned_rows import criteria_read_scores, reads_row_index, stop_aligned
from .draft_length import DraftLengthSchedule
from .host_outcome import commit_on_host, settle_on_host, settles_on_host
from .loop_state import ActiveBatch, LoopResult, Outcome, RowContext, Rows, SpeculativeLoopConfig
from .position_processing import process_every_position
from .processor_gating import check_processor_arguments, processors_acting_on
from .proposal_checks import check_proposal, make_safe, raise_for_value_facts
from .stats import SpeculativeDecodingStats
from .stopping import stop_at_eos, stop_by_criteria
from .verifier_mask import CausalMaskTable

__all__ = [
    "accept",
    "assemble",
    "commit",
    "confident_draft_counts",
    "draft",
    "position_limit_of",
    "release_finished_rows",
    "run_speculative_loop",
    "stop",
    "verify",
]


# new tokens the sequence buffer holds room for at the start; longer generations grow it
_INITIAL_NEW_TOKENS = 256


def run_speculative_loop(
    verifier,
    drafter: Drafter | None,
    drafter_state,
    input_ids: torch.LongTensor,
    encoder_outputs: BaseModelOutput,
    encoder_attention_mask: torch.LongTensor | None,
    cache: EncoderDecoderCache,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    config: SpeculativeLoopConfig,
    streamer=None,
    stream_prompt: bool = True,
    draft_length_schedule: DraftLengthSchedule | None = None,
) -> LoopResult:
    """Generate with draft-then-verify until every row is finished.

    Args:
        verifier (`PreTrainedModel`): The encoder-decoder model being accelerated.
        drafter (`Drafter`, *optional*): Implements the drafting contract of `specdec_hf.drafting`; `None` decodes
            without drafting, every iteration a plain verifier step (with `config.num_draft_tokens` 0).
        drafter_state: What `drafter.init_drafting_state` returned for this batch (`None` without a drafter).
        input_ids (`torch.LongTensor` of shape `(batch_size, prompt_length)`): The decoder prompt (start tokens).
        encoder_outputs (`BaseModelOutput`): The verifier's encoder output for the batch.
        encoder_attention_mask (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*): Source mask.
        cache (`EncoderDecoderCache`): An empty dynamic cache for the verifier.
        logits_processor (`LogitsProcessorList`): Processors prepared by `generate()`.
        stopping_criteria (`StoppingCriteriaList`): Criteria prepared by `generate()`.
        config (`SpeculativeLoopConfig`): β, τ, k, lengths, special tokens, greedy or sampling.
        streamer (`BaseStreamer`, *optional*): Receives the prompt, then the tokens of every iteration as they are
            accepted (batch size 1).
        stream_prompt (`bool`, *optional*, defaults to `True`): Put the prompt to `streamer` first; `False` when
            `generate()` already has.
        draft_length_schedule ([`DraftLengthSchedule`], *optional*): Chooses each iteration's k, up to
            `config.num_draft_tokens` (0: a plain verifier step); `None` drafts `config.num_draft_tokens` every time.
    """
    if drafter is None and config.num_draft_tokens != 0:
        raise RuntimeError(
            f"internal: no drafter for k={config.num_draft_tokens}: decoding without drafting takes k=0"
        )
    check_processor_arguments(logits_processor)
    rows = _start(input_ids, config)
    if encoder_attention_mask is not None and bool(encoder_attention_mask.all()):
        # no padding: an all-ones mask would only make the verifier's mask code inspect it at every call
        encoder_attention_mask = None
    context = RowContext(encoder_outputs, encoder_attention_mask, drafter_state)
    causal_masks = CausalMaskTable(verifier)
    stats = SpeculativeDecodingStats.for_batch(input_ids.shape[0], config.num_draft_tokens)
    # only EOS and length criteria (generate()'s defaults): the stop stage applies them vectorised
    simple = all(
        isinstance(c, (MaxLengthCriteria, EosTokenCriteria)) and not reads_row_index(c) for c in stopping_criteria
    )
    on_host = settles_on_host(config, simple, input_ids.device)
    eos_token_ids = None
    if on_host and config.eos_token_ids is not None:
        eos_token_ids = frozenset(config.eos_token_ids.tolist())
    # the verifier's learned positions and the drafter's: k shrinks near either limit
    position_limit = position_limit_of(verifier, drafter)
    state_layers = getattr(drafter, "verifier_state_layers", None)
    cache_length = 0
    # aligned rows: those finished so far (kept in the batch, appending pad), on the device and the host
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    done_list = [False] * input_ids.shape[0]
    # the processed scores of the committed steps, one (rows, vocab_size) tensor each, as greedy hands criteria
    # `scores`: kept only when a criterion may read them, and only where every step covers the whole batch (a single
    # row, or aligned rows: with several rows `output_scores` aligns them)
    score_history = None
    if config.output_scores and criteria_read_scores(stopping_criteria):
        if not (config.aligned_rows or input_ids.shape[0] == 1):
            raise RuntimeError("internal: criteria reading scores at batch > 1 need aligned rows")
        score_history = ()
    if streamer is not None and stream_prompt:
        streamer.put(input_ids.cpu())

    while rows.active:
        _reserve_columns(rows, config)
        batch = _active_batch(rows)
        k = _iteration_k(config, batch, position_limit, state_layers, context.verifier_states)
        scheduled = draft_length_schedule is not None and k > 0
        if scheduled:
            k = draft_length_schedule.next_k(len(rows.active), k)
        elif draft_length_schedule is not None:
            draft_length_schedule.skip()
        # 1. Draft
        drafts, proposal_q, verify_counts, value_facts = draft(
            drafter, context, batch, k, logits_processor, config, stats
        )
        if config.pad_finished_rows and any(done_list):  # aligned rows: a finished row is fed pad, as greedy does
            drafts = torch.where(done.unsqueeze(1), config.pad_token_id, drafts)
        # 2. Verify (timed by the schedule while it calibrates what a forward costs)
        verification = functools.partial(
            verify, verifier, context, cache, cache_length, batch, drafts, state_layers, config, causal_masks
        )
        logits, fed_length = draft_length_schedule.run_verification(verification) if scheduled else verification()
        # 3. Accept, each row within its budget (the processors applied at every verified position first);
        # 4. stop; 5. commit and read the outcome
        acting = processors_acting_on(logits_processor, batch.shortest, batch.longest + drafts.shape[1])
        scores = process_every_position(acting, batch.committed, batch.lengths, batch.host_lengths, drafts, logits)
        if on_host:  # in Python, from one read of the verifier's choices
            outcome, new_tokens = settle_on_host(
                scores, drafts, batch.host_lengths, verify_counts, value_facts, eos_token_ids, config,
                stream=streamer is not None,
            )  # fmt: skip
            going_on = commit_on_host(rows, batch.host_lengths, new_tokens, outcome.finished)
            finished = None  # the host path has no aligned rows, and `going_on` whenever a row finished
        else:
            outcome, finished = _settle_on_device(
                rows, batch, scores, drafts, verify_counts, value_facts, proposal_q, score_history, stopping_criteria,
                simple, done, streamer is not None, config,
            )  # fmt: skip
            going_on = None  # found from `finished` where the device has it, if a row finished
        if outcome.value_facts is not None:
            raise_for_value_facts(outcome.value_facts, drafter, config.vocab_size)
        if streamer is not None:
            # a host tensor, as generate() hands its streamers, built from the tokens the transfer brought over
            streamer.put(torch.tensor(outcome.streamed[: outcome.num_new[0]]))
        if scheduled:  # rows finished earlier (aligned rows) drafted pad: not what the drafts are worth
            running = outcome.accepted
            if any(done_list):  # aligned rows: done_list is per active row
                running = [count for count, finished in zip(running, done_list, strict=True) if not finished]
            draft_length_schedule.observe(running)
        _advance_lengths(rows, outcome.num_new)
        _count_iteration(stats, rows.active, outcome, done_list)
        if rows.recorded is not None:
            _record_scores(rows, outcome.num_new, scores, logits)
        if score_history is not None:  # every row appended as many tokens (aligned rows, or a single row)
            score_history += tuple(scores[:, : outcome.num_new[0]].unbind(1))
        if config.aligned_rows:  # rows leave together, when the last one finishes
            done, done_list = finished, outcome.finished
            if not all(done_list):
                outcome = outcome._replace(finished=[False] * len(done_list))
        if going_on is None and any(outcome.finished) and not all(outcome.finished):
            going_on = torch.argsort(finished.to(torch.uint8), stable=True)[: outcome.finished.count(False)]
        cache_length = release_finished_rows(rows, context, cache, drafter, outcome.finished, going_on, fed_length)

    if streamer is not None:
        streamer.end()
    return assemble(rows, input_ids.shape[1], stats, config)


def _start(input_ids: torch.LongTensor, config: SpeculativeLoopConfig) -> Rows:
    """Every row active, holding its decoder prompt."""
    batch_size, prompt_length = input_ids.shape
    capacity = _capacity(prompt_length + _INITIAL_NEW_TOKENS, 0, config)
    sequences = input_ids.new_full((batch_size, capacity), config.pad_token_id)
    sequences[:, :prompt_length] = input_ids
    record = config.output_scores or config.output_logits
    return Rows(
        sequences=sequences,
        lengths=[prompt_length] * batch_size,
        active=list(range(batch_size)),
        active_index=torch.arange(batch_size, device=input_ids.device),
        active_lengths=torch.full((batch_size,), prompt_length, dtype=torch.long, device=input_ids.device),
        recorded=[[] for _ in range(batch_size)] if record else None,
    )


def _capacity(length: int, current: int, config: SpeculativeLoopConfig) -> int:
    """Columns of the sequence buffer for rows of up to `length` committed tokens: room for one iteration's k + 1 new
    tokens after them, at least twice the `current` columns (growth amortised over the iterations), and never more
    than `max_length` needs."""
    headroom = config.num_draft_tokens + 1
    return min(max(length + headroom, 2 * current), config.max_length + headroom)


def _reserve_columns(rows: Rows, config: SpeculativeLoopConfig) -> None:
    """Grow the sequence buffer (with pad) when the longest active row could outgrow it this iteration.

    The buffer follows what is generated rather than `max_length`, which may be far beyond what any row reaches
    (`max_new_tokens=10**11` with an early EOS); the lengths are on the host, so this costs no synchronisation.
    """
    longest = max(rows.lengths[row] for row in rows.active)
    current = rows.sequences.shape[1]
    if longest + config.num_draft_tokens + 1 <= current:
        return
    extra = _capacity(longest, current, config) - current
    padding = rows.sequences.new_full((rows.sequences.shape[0], extra), config.pad_token_id)
    rows.sequences = torch.cat([rows.sequences, padding], dim=1)


def _active_batch(rows: Rows) -> ActiveBatch:
    row_lengths = [rows.lengths[r] for r in rows.active]
    committed = rows.sequences.index_select(0, rows.active_index)
    return ActiveBatch(committed, rows.active_lengths, row_lengths, min(row_lengths), max(row_lengths))


def position_limit_of(verifier, drafter) -> int | None:
    """The most positions the verifier's learned positions and the drafter's allow (`None`: no limit)."""
    limits = [getattr(verifier.config, "max_position_embeddings", None), getattr(drafter, "max_positions", None)]
    return min((operator.index(limit) for limit in limits if limit is not None), default=None)


def _iteration_k(
    config: SpeculativeLoopConfig,
    batch: ActiveBatch,
    position_limit: int | None,
    state_layers: list[int] | None,
    verifier_states: torch.FloatTensor | None,
) -> int:
    """This iteration's k: capped by the largest remaining length budget (the shortest row's) and the positions the
    verifier and the drafter can place; 0 when a drafter that reads verifier states has none yet for a decoder prompt
    of several tokens (the prompt is then verified alone first)."""
    k = min(config.num_draft_tokens, config.max_length - batch.shortest - 1)
    if position_limit is not None:
        k = min(k, position_limit - batch.longest)
    if state_layers and verifier_states is None and batch.longest > 1:
        return 0
    return max(k, 0)


def _budgets(
    lengths: torch.LongTensor, k: int, verify_counts: torch.LongTensor | None, config: SpeculativeLoopConfig
) -> torch.LongTensor:
    """The most drafts each row may accept: those it verified, and only so many that its bonus token stays within
    `max_length`."""
    budgets = (config.max_length - 1 - lengths).clamp(max=k)
    return budgets if verify_counts is None else torch.minimum(budgets, verify_counts)


def draft(
    drafter: Drafter | None,
    context: RowContext,
    batch: ActiveBatch,
    k: int,
    logits_processor: LogitsProcessorList,
    config: SpeculativeLoopConfig,
    stats: SpeculativeDecodingStats,
) -> tuple[torch.LongTensor, torch.FloatTensor | None, torch.LongTensor | None, torch.LongTensor | None]:
    """Stage 1: the drafts of every active row (updates `context.drafter_state` and the drafter counters).

    Args:
        drafter (`Drafter`, *optional*): `None` only with k = 0.
        batch ([`ActiveBatch`]): The active rows.
        k (`int`): Drafts to ask for; 0 skips the drafter.

    Returns:
        `drafts` `(rows, k')` with k' ≤ k (fewer when the drafter's `num_drafts` or confidence truncation cut every
        row shorter), `proposal_q` `(rows, k', vocab_size)` when sampling (else `None`), `verify_counts`
        `(rows,)`, the drafts each row verifies when either cut them (else `None`), and the proposal's value facts
        for `raise_for_value_facts` once read (`None` on the drafter's first call, checked at once, and at k = 0).
    """
    committed, longest = batch.committed, batch.longest
    if k == 0:
        return committed.new_empty((committed.shape[0], 0)), None, None, None
    verifier_states = context.verifier_states
    if verifier_states is not None:
        verifier_states = verifier_states[:, :longest]
    proposal = drafter.propose(context.drafter_state, committed[:, :longest], batch.lengths, k, verifier_states)
    value_facts = check_proposal(
        proposal,
        drafter,
        committed.shape[0],
        k,
        config.vocab_size,
        first_call=stats.drafter_calls == 0,
        do_sample=config.do_sample,
        confidence_threshold=config.confidence_threshold,
    )
    context.drafter_state = proposal.state
    drafts = proposal.draft_ids[:, :k].to(committed.device)
    draft_logits = proposal.draft_logits if config.do_sample else None
    if value_facts is not None:  # not read yet: only safe values reach the verifier and the sampler meanwhile
        drafts, draft_logits = make_safe(drafts, draft_logits, config.vocab_size)
    stats.drafter_calls += 1
    proposal_q = None
    if config.do_sample:
        drafts, proposal_q = sample_proposal(draft_logits, drafts, committed, logits_processor, config.vocab_size)
    verify_counts = proposed = None
    if proposal.num_drafts is None:
        stats.proposed_tokens += k * committed.shape[0]
    else:
        verify_counts = proposal.num_drafts.to(committed.device).clamp(0, k)
        proposed = verify_counts.sum()  # read with the widest count below: one host read for both
    # the confidence is the drafter's own (its draft_confidence, or derived from its logits at its own draft_ids),
    # whatever the loop sampled: cutting on it keeps greedy output and the sampling distribution exactly as they are
    confidence = None if config.confidence_threshold is None else proposal.confidence()
    if confidence is not None:
        confident = confident_draft_counts(confidence[:, :k].to(committed.device), config.confidence_threshold)
        verify_counts = confident if verify_counts is None else torch.minimum(verify_counts, confident)
    if verify_counts is None:
        return drafts, proposal_q, None, value_facts
    # verify only as far as the row that verifies the most needs; the others stop at their own count
    if proposed is None:
        k = int(verify_counts.max())
    else:
        k, proposed = torch.stack([verify_counts.max(), proposed]).tolist()
        stats.proposed_tokens += proposed
    return drafts[:, :k], None if proposal_q is None else proposal_q[:, :k], verify_counts, value_facts


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


def verify(
    verifier,
    context: RowContext,
    cache: EncoderDecoderCache,
    cache_length: int,
    batch: ActiveBatch,
    drafts: torch.LongTensor,
    state_layers: list[int] | None,
    config: SpeculativeLoopConfig,
    causal_masks: CausalMaskTable | None = None,
) -> tuple[torch.FloatTensor, int]:
    """Stage 2: one verifier forward over every row's uncached committed tokens followed by its drafts.

    Writes the fed positions' decoder states into `context.verifier_states` when the drafter reads them.

    Args:
        cache_length (`int`): Positions in the verifier's cache, shared by all rows.
        drafts (`torch.LongTensor` of shape `(rows, k)`): The drafts (k may be 0).
        causal_masks ([`CausalMaskTable`], *optional*): Prepares the forward's causal mask where the verifier takes
            one; without it the decoder builds its own.

    Returns:
        `logits` `(rows, k + 1, vocab_size)` in float32, the verifier's scores for the positions after each row's
        last committed token and after each draft; and the cache length after the forward.
    """
    committed = batch.committed
    decoder_input, logit_positions = _verifier_input(batch, cache_length, drafts, config.pad_token_id)
    rows, fed = decoder_input.shape
    causal_mask = None if causal_masks is None else causal_masks.mask(rows, cache_length, fed, decoder_input.device)
    outputs = verifier(
        decoder_input_ids=decoder_input,
        decoder_attention_mask=causal_mask,
        encoder_outputs=context.encoder_outputs,
        attention_mask=context.encoder_attention_mask,
        cache=cache,
        use_cache=True,
        output_hidden_states=bool(state_layers),
        return_dict=True,
    )
    if state_layers:
        context.verifier_states = _record_verifier_states(
            context.verifier_states, outputs.decoder_hidden_states, state_layers, cache_length, committed.shape[1]
        )
    k = drafts.shape[1]
    if logit_positions is None:
        logits = outputs.logits[:, -(k + 1) :].float()
    else:
        index = logit_positions.unsqueeze(-1).expand(-1, -1, outputs.logits.shape[-1])
        logits = outputs.logits.gather(1, index).float()
    return logits, cache_length + fed


def _verifier_input(
    batch: ActiveBatch, cache_length: int, drafts: torch.LongTensor, pad: int
) -> tuple[torch.LongTensor, torch.LongTensor | None]:
    """Lay out ``[committed[C:len_r], d_1..d_k, pad...]`` per row.

    Returns:
        decoder_input (`torch.LongTensor` of shape `(rows, max_uncached + k)`) and, when rows differ in their
        number of uncached tokens, the `(rows, k + 1)` positions whose logits verify the drafts (`None` means the
        last k + 1 positions of every row).
    """
    committed = batch.committed
    k = drafts.shape[1]
    max_uncached = batch.longest - cache_length  # the host's lengths: no read of the device's
    if batch.shortest == batch.longest:
        uncached = committed[:, cache_length : cache_length + max_uncached]
        # a plain step feeds the slice itself, contiguous as the concatenation was (a decoder may flatten its ids)
        return (torch.cat([uncached, drafts], dim=1) if k > 0 else uncached.contiguous()), None
    width = max_uncached + k
    offsets = torch.arange(width, device=committed.device).unsqueeze(0)
    uncached = (batch.lengths - cache_length).unsqueeze(1)
    from_committed = committed[:, cache_length : cache_length + width]
    from_drafts = drafts.gather(1, (offsets - uncached).clamp(0, max(k - 1, 0))) if k > 0 else from_committed
    decoder_input = torch.where(
        offsets < uncached, from_committed, torch.where(offsets < uncached + k, from_drafts, pad)
    )
    logit_positions = uncached - 1 + torch.arange(k + 1, device=committed.device).unsqueeze(0)
    return decoder_input, logit_positions


def _record_verifier_states(
    verifier_states: torch.FloatTensor | None,
    hidden_states: tuple[torch.FloatTensor, ...],
    layers: list[int],
    cache_length: int,
    capacity: int,
) -> torch.FloatTensor:
    """Write the verify forward's decoder states into the per-row buffer, at the positions they were computed for.

    Row r's fed positions start at the shared cache length; states of drafts that end up rejected are overwritten by
    the next forward before the drafter reads them (it reads only positions below a row's committed length - 1,
    the same invariant as the verifier cache). `capacity` is the sequence buffer's width (not a position limit of
    either model): the buffer grows to it.

    Returns:
        `torch.FloatTensor` of shape `(active_rows, capacity, feature_width)`: the buffer of the active rows.
    """
    first = hidden_states[layers[0]]  # (rows, width, hidden_size)
    rows, fed, hidden_size = first.shape
    if verifier_states is None:
        verifier_states = first.new_zeros(rows, capacity, hidden_size * len(layers))
    elif verifier_states.shape[1] < capacity:  # the sequence buffer grew: grow with it
        verifier_states = F.pad(verifier_states, (0, 0, 0, capacity - verifier_states.shape[1]))
    width = min(fed, capacity - cache_length)
    # the layers side by side in one write (a write per layer cost three times the operators)
    states = [hidden_states[index][:, :width] for index in layers]
    verifier_states[:, cache_length : cache_length + width] = (
        torch.cat(states, dim=-1) if len(states) > 1 else states[0]
    )
    return verifier_states


def _settle_on_device(
    rows: Rows,
    batch: ActiveBatch,
    scores: torch.FloatTensor,
    drafts: torch.LongTensor,
    verify_counts: torch.LongTensor | None,
    value_facts: torch.LongTensor | None,
    proposal_q: torch.FloatTensor | None,
    score_history: tuple[torch.FloatTensor, ...] | None,
    stopping_criteria: StoppingCriteriaList,
    simple_stopping: bool,
    done: torch.BoolTensor,
    stream: bool,
    config: SpeculativeLoopConfig,
) -> tuple[Outcome, torch.BoolTensor]:
    """Stages 3-5 on tensors (sampling, criteria beyond EOS and length, aligned rows): accept, stop and commit on
    the device, then read the outcome in one transfer.

    Returns:
        The iteration's [`Outcome`] and `finished` `(rows,)`, on the device.
    """
    budgets = _budgets(batch.lengths, drafts.shape[1], verify_counts, config)
    new_tokens, num_accepted = accept(scores, drafts, budgets, proposal_q, config)
    if config.aligned_rows:
        new_tokens, num_new, finished = stop_aligned(
            new_tokens, num_accepted + 1, batch.committed, batch.longest, scores, score_history, stopping_criteria,
            done, config.max_length, config.pad_token_id, config.pad_finished_rows,
        )  # fmt: skip
    else:
        num_new, finished = stop(
            new_tokens, num_accepted + 1, batch, scores, score_history, stopping_criteria, simple_stopping, config
        )
    commit(rows, batch.lengths, new_tokens, num_new, config.pad_token_id)
    outcome = _read_outcome(
        num_new, finished, torch.minimum(num_accepted, num_new), budgets, new_tokens[0] if stream else None,
        value_facts,
    )  # fmt: skip
    return outcome, finished


def accept(
    scores: torch.FloatTensor,
    drafts: torch.LongTensor,
    budgets: torch.LongTensor,
    proposal_q: torch.FloatTensor | None,
    config: SpeculativeLoopConfig,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Stage 3: the accepted drafts of every row and the token the verifier emits where the row stops.

    Greedy decoding judges all positions at once; sampling judges them in turn (`specdec_hf.acceptance`).

    Args:
        scores (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The verifier's scores, processed at every
            position with its own prefix (`position_processing`).
        budgets (`torch.LongTensor` of shape `(rows,)`): The most drafts each row may accept.
        proposal_q (`torch.FloatTensor` of shape `(rows, k, vocab_size)`, *optional*): The drafts' q when sampling.

    Returns:
        `new_tokens` `(rows, k + 1)` whose first `num_accepted + 1` are appended, and `num_accepted` `(rows,)`.
    """
    if config.do_sample:
        return judge_per_position(scores, drafts, budgets, SamplingRule(proposal_q))
    return accept_all_positions(scores, drafts, budgets, config.beta, config.tau)


def stop(
    new_tokens: torch.LongTensor,
    num_new: torch.LongTensor,
    batch: ActiveBatch,
    scores: torch.FloatTensor,
    score_history: tuple[torch.FloatTensor, ...] | None,
    stopping_criteria: StoppingCriteriaList,
    simple_stopping: bool,
    config: SpeculativeLoopConfig,
) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """Stage 4: cut each row after the appended token that finishes it.

    With only EOS and max-length criteria (what `generate()` sets up by default; `simple_stopping`) both are applied
    vectorised; otherwise the criteria are evaluated after each appended token on that row's exact sequence, and
    `max_length` ends a row as well.

    Args:
        new_tokens (`torch.LongTensor` of shape `(rows, k + 1)`), num_new (`torch.LongTensor` of shape `(rows,)`):
            The tokens the row would append and how many.
        scores (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The processed scores.
        score_history (`tuple[torch.FloatTensor]`, *optional*): The processed scores of the earlier generated
            tokens, one `(rows, vocab_size)` tensor per step, when criteria read them (greedy hands them so).

    Returns:
        `num_new` `(rows,)`, cut at a stop, and `finished` `(rows,)`.
    """
    if simple_stopping:
        return stop_at_eos(new_tokens, num_new, batch.lengths, config.eos_token_ids, config.max_length)
    num_new, finished = stop_by_criteria(
        new_tokens,
        num_new,
        batch.committed,
        batch.lengths,
        scores,
        score_history,
        stopping_criteria,
        config.pad_token_id,
    )
    return num_new, finished | (batch.lengths + num_new >= config.max_length)


def commit(
    rows: Rows, lengths: torch.LongTensor, new_tokens: torch.LongTensor, num_new: torch.LongTensor, pad_token_id: int
) -> None:
    """Stage 5: append each active row's first `num_new` new tokens to its committed tokens, on the device.

    Args:
        lengths (`torch.LongTensor` of shape `(rows,)`): Committed lengths before this iteration.
        new_tokens (`torch.LongTensor` of shape `(rows, k + 1)`), num_new (`torch.LongTensor` of shape `(rows,)`):
            The tokens and how many of them each row appends.
    """
    offsets = torch.arange(new_tokens.shape[1], device=new_tokens.device)
    keep_token = offsets.unsqueeze(0) < num_new.unsqueeze(1)
    rows.sequences[rows.active_index.unsqueeze(1), lengths.unsqueeze(1) + offsets] = torch.where(
        keep_token, new_tokens, pad_token_id
    )
    rows.active_lengths = lengths + num_new


def _read_outcome(
    num_new: torch.LongTensor,
    finished: torch.BoolTensor,
    accepted: torch.LongTensor,
    verified: torch.LongTensor,
    streamed: torch.LongTensor | None,
    value_facts: torch.LongTensor | None = None,
) -> Outcome:
    """The iteration's outcome on the host, in one transfer (each read of a device value waits for the device;
    the statistics and the drafter's value facts ride along with what the loop must read anyway)."""
    rows = num_new.shape[0]
    parts = [num_new, finished.long(), accepted, verified]
    if streamed is not None:
        parts.append(streamed)
    if value_facts is not None:  # computed where the drafter ran
        parts.append(value_facts.to(num_new.device))
    values = torch.cat(parts).tolist()
    facts_start = len(values) - (0 if value_facts is None else value_facts.shape[0])
    return Outcome(
        num_new=values[:rows],
        finished=[bool(done) for done in values[rows : 2 * rows]],
        accepted=values[2 * rows : 3 * rows],
        verified=values[3 * rows : 4 * rows],
        streamed=values[4 * rows : facts_start] if streamed is not None else None,
        value_facts=values[facts_start:] if value_facts is not None else None,
    )


def _count_iteration(stats: SpeculativeDecodingStats, active: list[int], outcome: Outcome, done: list[bool]):
    """Count the iteration for the active rows, leaving out aligned rows already finished (their pad is not
    generated)."""
    if not any(done):
        stats.count_iteration(active, outcome.num_new, outcome.verified, outcome.accepted)
        return
    running = [local for local, finished in enumerate(done) if not finished]
    stats.count_iteration(
        [active[i] for i in running],
        [outcome.num_new[i] for i in running],
        [outcome.verified[i] for i in running],
        [outcome.accepted[i] for i in running],
    )


def _advance_lengths(rows: Rows, num_new: list[int]) -> None:
    """The host's copy of the committed lengths, advanced by what each active row appended."""
    for local, row in enumerate(rows.active):
        rows.lengths[row] += num_new[local]


def _record_scores(rows: Rows, num_new: list[int], scores: torch.FloatTensor, logits: torch.FloatTensor) -> None:
    """Keep the processed scores and raw logits of each row's new tokens, for `output_scores` / `output_logits`."""
    for local, row in enumerate(rows.active):
        rows.recorded[row].append((scores[local, : num_new[local]], logits[local, : num_new[local]]))


def release_finished_rows(
    rows: Rows,
    context: RowContext,
    cache: EncoderDecoderCache,
    drafter: Drafter | None,
    finished: list[bool],
    going_on: torch.LongTensor | None,
    fed_length: int,
) -> int:
    """Stage 5 (end): drop finished rows from everything the loop holds per row, and crop the verifier's cache to
    what every remaining row has committed.

    Args:
        finished (`list[bool]`): Per active row, whether it stops after this iteration (read with the outcome).
        going_on (`torch.LongTensor`, *optional*): When a row finished, the local indices of the rows that do not,
            in order, on the device.
        fed_length (`int`): The verifier cache's length after this iteration's forward.

    Returns:
        The verifier cache's new length: the shortest active row's committed length minus one (0 when no row is
        left).
    """
    if any(finished):
        rows.active = [row for row, done in zip(rows.active, finished, strict=True) if not done]
        if not rows.active:
            return 0
        if going_on is None:
            raise RuntimeError("internal: rows finished and others go on, but their indices were not given")
        rows.active_index = rows.active_index.index_select(0, going_on)
        rows.active_lengths = rows.active_lengths.index_select(0, going_on)
        cache.batch_select_indices(going_on)
        _select_rows(context, drafter, going_on)
    cache_length = min(rows.lengths[r] for r in rows.active) - 1
    if fed_length > cache_length:  # Cache.crop(0) is not a no-op on every transformers version
        cache.crop(cache_length - fed_length)
    return cache_length


def _select_rows(context: RowContext, drafter: Drafter | None, keep: torch.LongTensor) -> None:
    """Keep only the rows `keep` (indices into the active rows) of everything the loop holds per row."""
    context.encoder_outputs = BaseModelOutput(
        last_hidden_state=context.encoder_outputs.last_hidden_state.index_select(0, keep)
    )
    if context.encoder_attention_mask is not None:
        context.encoder_attention_mask = context.encoder_attention_mask.index_select(0, keep)
    if drafter is not None:
        context.drafter_state = drafter.select_rows(context.drafter_state, keep)
    if context.verifier_states is not None:
        context.verifier_states = context.verifier_states.index_select(0, keep)


def assemble(rows: Rows, prompt_length: int, stats: SpeculativeDecodingStats, config: SpeculativeLoopConfig):
    """The loop's output: the sequences cut to the longest row, and `generate()`'s per-position scores / logits
    (one `(batch_size, vocab_size)` tensor per generated position) when they were asked for.

    Returns:
        [`LoopResult`]
    """
    total_length = max(rows.lengths)
    scores_out = logits_out = None
    if rows.recorded is not None:
        scores, logits = _per_position(rows.recorded, rows.lengths, prompt_length, total_length)
        scores_out = tuple(scores.unbind(1)) if config.output_scores else None
        logits_out = tuple(logits.unbind(1)) if config.output_logits else None
    # contiguous, as generate() returns its sequences (the buffer holds room for k + 1 tokens after the longest row:
    # a slice of it would refuse `view` and cost strided reads)
    return LoopResult(rows.sequences[:, :total_length].contiguous(), stats, scores_out, logits_out)


def _per_position(
    recorded: list[list[tuple[torch.FloatTensor, torch.FloatTensor]]],
    lengths: list[int],
    prompt_length: int,
    total_length: int,
) -> tuple[torch.FloatTensor, torch.FloatTensor]:
    """Per-row chunks of scores and logits -> `(batch_size, generated, vocab_size)` each, zeros after a row ends."""
    first = recorded[0][0][0]
    shape = (len(recorded), total_length - prompt_length, first.shape[-1])
    scores = torch.zeros(shape, device=first.device)
    logits = torch.zeros(shape, device=first.device)
    for row, chunks in enumerate(recorded):
        generated = lengths[row] - prompt_length
        scores[row, :generated] = torch.cat([chunk[0] for chunk in chunks])
        logits[row, :generated] = torch.cat([chunk[1] for chunk in chunks])
    return scores, logits
