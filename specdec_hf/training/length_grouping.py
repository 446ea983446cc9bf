"""Length-grouped batches: examples of similar length share a batch, so little of each batch is padding.

Distilled sentence pairs vary widely in length (the Debian corpus: 18 source tokens on average, 241 at most); random
batches of 64 pad to about three times the mean length, and the verifier's encoder and the drafter's attention pay for
the padding. As in transformers' `group_by_length`, indices are shuffled, cut into mega-batches of
`mega_batch_factor * batch_size` examples, and each mega-batch is sorted by length; here the batches of a mega-batch
are shuffled too, and the order depends only on `(seed, epoch)`, so a resumed run draws exactly the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

__all__ = ["LengthGroupedSampler"]


class LengthGroupedSampler(Sampler[int]):
    """Yield dataset indices so that every run of `batch_size` consecutive indices holds examples of similar length.

    Args:
        lengths (`Sequence[int]`): Length of every example (e.g. source plus target tokens).
        batch_size (`int`): The DataLoader's batch size.
        seed (`int`): Seed of the shuffling; the order of epoch `e` is drawn from `(seed, e)` alone.
        mega_batch_factor (`int`, *optional*, defaults to 50): Batches per sorted mega-batch; larger groups lengths
            more tightly but makes batches less random.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, mega_batch_factor: int = 50):
        if batch_size < 1 or mega_batch_factor < 1:
            raise ValueError(
                f"`batch_size` and `mega_batch_factor` must be at least 1, got {batch_size} and {mega_batch_factor}."
            )
        self.lengths = torch.as_tensor(list(lengths))
        self.batch_size = batch_size
        self.seed = seed
        self.mega_batch_factor = mega_batch_factor
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order `__iter__` yields (called by the training loop at every epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator)
        mega_size = self.batch_size * self.mega_batch_factor
        for mega_batch in order.split(mega_size):
            by_length = mega_batch[torch.argsort(self.lengths[mega_batch], descending=True, stable=True)]
            batches = by_length.split(self.batch_size)
            for batch_index in torch.randperm(len(batches), generator=generator).tolist():
                yield from batches[batch_index].tolist()
