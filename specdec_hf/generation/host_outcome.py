"""An iteration's acceptance, stop and commit settled on the host, from one read of the verifier's choices.

Greedy acceptance (β = 1, or the relaxed top-β / τ rule) with EOS and length stopping turns, per row, a few integers
(the verifier's top-1 at each verified position, the drafts, under the relaxed rule which drafts pass it) into the
tokens the row appends and whether it finished. The loop's tensor path (`accept`, `stop`, `commit` and the outcome's
read in `speculative_loop`) computes them with some forty small operators before its one read of the outcome; here
that read comes first, right after the argmax, and the rest is a few lines of Python per row and one write from a
tensor built once (the new tokens, the lengths and, when rows finish, the rows that go on).
On a CPU each of those operators costs microseconds of dispatch and a read waits for nothing, so the iteration is
shorter (docs/RESULTS.md); an accelerator keeps the tensor path, which reads the device once an iteration. The
outputs are the tensor path's exactly: the same argmax, the same leading run of accepted drafts, the same cut after
the first EOS and at `max_length`. The rule is the one of `acceptance.accept_all_positions`, `stopping.stop_at_eos`
and `speculative_loop._budgets`: a change to one side changes both (tests/generation/test_host_outcome.py compares
them on random inputs). Sampling, stopping criteria beyond EOS and length, and aligned rows keep the tensor path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

from ..acceptance import accept_drafts
from .loop_state import Outcome, Rows, SpeculativeLoopConfig

__all__ = ["commit_on_host", "settle_on_host", "settles_on_host", "settling_on_tensors"]

# set by `settling_on_tensors`: the accelerator's path on every device
_ON_TENSORS: ContextVar[bool] = ContextVar("specdec_hf_settling_on_tensors", default=False)


@contextlib.contextmanager
def settling_on_tensors() -> Iterator[None]:
    """Within the block, every iteration settles on tensors, as on an accelerator: to test or time that path on a
    CPU (the host-synchronisation counts, the two paths against each other)."""
    token = _ON_TENSORS.set(True)
    try:
        yield
    finally:
        _ON_TENSORS.reset(token)


def settles_on_host(config: SpeculativeLoopConfig, simple_stopping: bool, device: torch.device) -> bool:
    """Whether the loop settles its iterations with [`settle_on_host`]: on the CPU (where a read of a tensor waits
    for nothing), with greedy acceptance, only EOS and length stopping (`simple_stopping`), and rows leaving the
    batch as they finish, unless `settling_on_tensors` is in force. An accelerator keeps the tensor path, whose
    iteration reads the device once (its cost there against this path's read and write is not measured)."""
    if _ON_TENSORS.get():
        return False
    return device.type == "cpu" and not config.do_sample and simple_stopping and not config.aligned_rows


def settle_on_host(
    scores: torch.FloatTensor,
    drafts: torch.LongTensor,
    host_lengths: list[int],
    verify_counts: torch.LongTensor | None,
    value_facts: torch.LongTensor | None,
    eos_token_ids: frozenset[int] | None,
    config: SpeculativeLoopConfig,
    stream: bool = False,
) -> tuple[Outcome, list[list[int]]]:
    """Each active row's new tokens and the iteration's [`Outcome`], from one read of the verifier's choices and the drafts.

    Args:
        scores (`torch.FloatTensor` of shape `(rows, k + 1, vocab_size)`): The processed scores of every verified
            position.
        drafts (`torch.LongTensor` of shape `(rows, k)`): The drafts (k may be 0: a plain step).
        host_lengths (`list[int]`): Each row's committed length before this iteration.
        verify_counts (`torch.LongTensor` of shape `(rows,)`, *optional*): The drafts each row verifies, where the
            drafter or the confidence threshold cut them; `None`: all k.
        value_facts (`torch.LongTensor`, *optional*): The drafter's value facts, read along for
            `raise_for_value_facts`.
        eos_token_ids (`frozenset[int]`, *optional*): The EOS ids; `None` stops at `max_length` only.
        config ([`SpeculativeLoopConfig`]): β, τ and `max_length`.
        stream (`bool`): Whether the outcome carries row 0's new tokens, for a streamer.

    Returns:
        The [`Outcome`] (`accepted` as the tensor path counts it: the accepted drafts among the appended tokens;
        `verified` the row's budget: the drafts it verified, within its length limit) and each row's new tokens.
    """
    rows, k = drafts.shape
    top1 = scores.argmax(dim=-1)
    parts = [top1.flatten(), drafts.flatten()]
    relaxed = config.beta != 1 and k > 0
    if relaxed:  # which drafts pass top-β / τ at their own position, read with the rest
        parts.append(accept_drafts(scores[:, :k], drafts, config.beta, config.tau).flatten().long())
    if verify_counts is not None:
        parts.append(verify_counts.flatten())
    if value_facts is not None:  # computed where the drafter ran
        parts.append(value_facts.to(top1.device))
    values = torch.cat(parts).tolist()
    passed = counts = None
    chosen, offset = values[: rows * (k + 1)], rows * (k + 1)
    drafted, offset = values[offset : offset + rows * k], offset + rows * k
    if relaxed:
        passed, offset = values[offset : offset + rows * k], offset + rows * k
    if verify_counts is not None:
        counts, offset = values[offset : offset + rows], offset + rows
    new_tokens, outcome = [], Outcome([], [], [], [], None, values[offset:] if value_facts is not None else None)
    for row, length in enumerate(host_lengths):
        top = chosen[row * (k + 1) : (row + 1) * (k + 1)]
        row_drafts = drafted[row * k : (row + 1) * k]
        budget = min(k, config.max_length - 1 - length)
        if verify_counts is not None:
            budget = min(budget, counts[row])
        accepted = 0
        if relaxed:
            row_passed = passed[row * k : (row + 1) * k]
            while accepted < budget and row_passed[accepted]:
                accepted += 1
        else:
            while accepted < budget and row_drafts[accepted] == top[accepted]:
                accepted += 1
        tokens = row_drafts[:accepted] + top[accepted : accepted + 1]
        hit = False
        if eos_token_ids is not None:
            for index, token in enumerate(tokens):
                if token in eos_token_ids:
                    tokens, hit = tokens[: index + 1], True
                    break
        new_tokens.append(tokens)
        outcome.num_new.append(len(tokens))
        outcome.finished.append(hit or length + len(tokens) >= config.max_length)
        outcome.accepted.append(min(accepted, len(tokens)))
        outcome.verified.append(budget)
    if stream:
        outcome = outcome._replace(streamed=new_tokens[0])
    return outcome, new_tokens


def commit_on_host(
    rows: Rows, host_lengths: list[int], new_tokens: list[list[int]], finished: list[bool]
) -> torch.LongTensor | None:
    """Append each active row's new tokens to its committed tokens and keep the tensor copy of the lengths, all from
    one tensor built from the host's lists (which also carries the rows that go on, when some finish).

    Args:
        rows ([`Rows`]): The batch; its `sequences` and `active_lengths` are updated.
        host_lengths (`list[int]`): The active rows' committed lengths before this iteration.
        new_tokens (`list[list[int]]`): What each active row appends, as [`settle_on_host`] returned it.
        finished (`list[bool]`): Per active row, whether it finished.

    Returns:
        When a row finished, the local indices of the rows that go on, as a tensor (for `release_finished_rows`);
        else `None`.
    """
    row_index, columns, tokens = [], [], []
    for row, length, appended in zip(rows.active, host_lengths, new_tokens, strict=True):
        row_index += [row] * len(appended)
        columns += range(length, length + len(appended))
        tokens += appended
    lengths = [length + len(appended) for length, appended in zip(host_lengths, new_tokens, strict=True)]
    going_on = [local for local, done in enumerate(finished) if not done] if any(finished) else None
    count = len(tokens)
    packed = torch.tensor(
        row_index + columns + tokens + lengths + (going_on or []), dtype=torch.long, device=rows.sequences.device
    )
    rows.sequences[packed[:count], packed[count : 2 * count]] = packed[2 * count : 3 * count]
    rows.active_lengths = packed[3 * count : 3 * count + len(lengths)]
    return None if going_on is None else packed[3 * count + len(lengths) :]
