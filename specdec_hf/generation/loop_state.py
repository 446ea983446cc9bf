"""What the speculative loop carries between its stages: its settings, the batch's rows and their context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers.modeling_outputs import BaseModelOutput

from .stats import SpeculativeDecodingStats

__all__ = ["ActiveBatch", "LoopResult", "Outcome", "Rows", "RowContext", "SpeculativeLoopConfig"]


@dataclass
class SpeculativeLoopConfig:
    """Settings of one speculative decoding run (already validated)."""

    num_draft_tokens: int
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
    # every row kept until all finish, advancing together (`specdec_hf.generation.aligned_rows`)
    aligned_rows: bool = False
    # finished rows append pad (greedy's rule with an EOS criterion); else, with aligned rows, they go on decoding
    pad_finished_rows: bool = True


@dataclass
class LoopResult:
    """What the loop produced: padded sequences, statistics and, when asked, per-position scores / logits."""

    sequences: torch.LongTensor
    stats: SpeculativeDecodingStats
    scores: tuple[torch.FloatTensor, ...] | None
    logits: tuple[torch.FloatTensor, ...] | None


@dataclass
class Rows:
    """The batch as the loop tracks it: every row's committed tokens, and which rows are still decoding.

    Args:
        sequences (`torch.LongTensor` of shape `(batch_size, capacity)`): Committed tokens, pad after; `capacity`
            leaves room for one iteration's k + 1 new tokens after the longest row, and grows with it.
        lengths (`list[int]`): Committed length of every row of the batch.
        active (`list[int]`): The batch index of each row still decoding, in order.
        active_index (`torch.LongTensor` of shape `(len(active),)`): `active` as a tensor.
        active_lengths (`torch.LongTensor` of shape `(len(active),)`): The active rows' committed lengths, kept on
            the device alongside `lengths` (so that no iteration copies them there).
        recorded (`list[list]`, *optional*): Per row, the `(scores, logits)` of each iteration's new tokens (only
            when `output_scores` / `output_logits` asked for them).
    """

    sequences: torch.LongTensor
    lengths: list[int]
    active: list[int]
    active_index: torch.LongTensor
    active_lengths: torch.LongTensor
    recorded: list[list[tuple[torch.FloatTensor, torch.FloatTensor]]] | None


class ActiveBatch(NamedTuple):
    """The active rows as an iteration starts.

    Args:
        committed (`torch.LongTensor` of shape `(rows, length)`): Their committed tokens, pad after.
        lengths (`torch.LongTensor` of shape `(rows,)`): Their committed lengths.
        host_lengths (`list[int]`): The same lengths, as the host knows them.
        shortest (`int`), longest (`int`): The smallest and largest of `lengths`.
    """

    committed: torch.LongTensor
    lengths: torch.LongTensor
    host_lengths: list[int]
    shortest: int
    longest: int


@dataclass
class RowContext:
    """What the loop keeps per active row besides its tokens; all of it follows the active rows when some finish.

    Args:
        encoder_outputs (`BaseModelOutput`): The verifier's encoder output.
        encoder_attention_mask (`torch.LongTensor` of shape `(rows, source_length)`, *optional*): The source mask.
        drafter_state: The drafter's opaque state.
        verifier_states (`torch.FloatTensor` of shape `(rows, capacity, feature_width)`, *optional*): The
            verifier's decoder states at every position fed so far (for drafters with `verifier_state_layers`).
    """

    encoder_outputs: BaseModelOutput
    encoder_attention_mask: torch.LongTensor | None
    drafter_state: object
    verifier_states: torch.FloatTensor | None = None


class Outcome(NamedTuple):
    """What an iteration's one read of the device brings over (or, settled on the host, its Python finds), per active
    row: the tokens appended, whether the row finished, the drafts it accepted and the drafts it verified (and row
    0's new tokens, for a streamer, and the drafter's value facts, when still to be checked)."""

    num_new: list[int]
    finished: list[bool]
    accepted: list[int]
    verified: list[int]
    streamed: list[int] | None
    value_facts: list[int] | None = None
