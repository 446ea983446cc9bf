"""Padding id lists into a batch, and cutting generated rows after their first EOS (`specdec_hf.data.padding`)."""

from __future__ import annotations

import torch

from specdec_hf.data.padding import pad_token_ids, trim_at_eos


def test_trim_at_eos():
    bart_style = torch.tensor([[2, 5, 2, 1, 1], [2, 5, 6, 7, 8], [2, 2, 1, 1, 1]])  # starts from EOS (2)
    t5_style = torch.tensor([[0, 5, 1, 0], [0, 0, 5, 6]])  # starts from pad (0), EOS 1

    assert trim_at_eos(bart_style, 2) == [[2, 5, 2], [2, 5, 6, 7, 8], [2, 2]]
    assert trim_at_eos(t5_style, [1]) == [[0, 5, 1], [0, 0, 5, 6]]
    assert trim_at_eos(t5_style, None) == t5_style.tolist()


def test_trim_at_eos_without_the_prompt_drops_the_start_token_and_what_follows_eos():
    sequences = torch.tensor([[0, 5, 6, 1, 0, 0], [0, 7, 8, 9, 10, 11], [0, 1, 0, 0, 0, 0]])
    assert trim_at_eos(sequences, [1], keep_prompt=False) == [[5, 6, 1], [7, 8, 9, 10, 11], [1]]
    assert trim_at_eos(sequences, [1, 6], keep_prompt=False) == [[5, 6], [7, 8, 9, 10, 11], [1]]


def test_pad_token_ids():
    input_ids, attention_mask = pad_token_ids([[4, 5, 6], [7], torch.tensor([8, 9])], pad_token_id=1)
    assert input_ids.tolist() == [[4, 5, 6], [7, 1, 1], [8, 9, 1]]
    assert attention_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
