"""LengthGroupedSampler: a permutation per epoch, reproducible from (seed, epoch), with batches of similar length."""

from __future__ import annotations

import pytest
import torch

from specdec_hf.training import LengthGroupedSampler


def padded_size(order: list[int], lengths: torch.Tensor, batch_size: int) -> int:
    """Tokens a padded batch of each `batch_size` run of `order` holds."""
    return sum(int(lengths[batch].max()) * len(batch) for batch in torch.tensor(order).split(batch_size))


@pytest.fixture
def lengths() -> torch.Tensor:
    return torch.randint(1, 120, (1000,), generator=torch.Generator().manual_seed(0))


def test_every_epoch_is_a_permutation(lengths):
    sampler = LengthGroupedSampler(lengths.tolist(), batch_size=16, seed=3, mega_batch_factor=8)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sorted(sampler) == list(range(len(lengths)))
    assert len(sampler) == len(lengths)


def test_order_depends_only_on_seed_and_epoch(lengths):
    first = LengthGroupedSampler(lengths.tolist(), batch_size=16, seed=3)
    second = LengthGroupedSampler(lengths.tolist(), batch_size=16, seed=3)
    second.set_epoch(1)
    list(second)  # iterating an epoch must not change what another epoch yields
    second.set_epoch(0)
    assert list(first) == list(second)
    first.set_epoch(1)
    assert list(first) != list(second)
    assert list(LengthGroupedSampler(lengths.tolist(), batch_size=16, seed=4)) != list(second)


def test_batches_hold_far_less_padding_than_random_batches(lengths):
    batch_size = 16
    grouped = list(LengthGroupedSampler(lengths.tolist(), batch_size=batch_size, seed=0, mega_batch_factor=10))
    shuffled = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist()
    real = int(lengths.sum())
    grouped_padding = padded_size(grouped, lengths, batch_size) - real
    random_padding = padded_size(shuffled, lengths, batch_size) - real
    assert grouped_padding < 0.2 * random_padding


def test_rejects_a_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        LengthGroupedSampler([3, 4], batch_size=0, seed=0)
