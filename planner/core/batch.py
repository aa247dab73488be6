"""The one batch type: the sequences one iteration trains, as the sampler, the outlier delay, the planner
and the compared methods all see them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.errors import UserError


@dataclass(frozen=True, eq=False)
class Batch:
    """One iteration's sequences in training order. `ids` are positions in the run's sampled stream (unique
    across epochs), `docs` the documents' rows in the dataset file (None for histograms or plain lengths),
    `sampled` the iteration each sequence was sampled in when an outlier delay moved some (None: all in this
    one)."""

    iteration: int
    ids: np.ndarray
    lengths: np.ndarray
    docs: np.ndarray | None = None
    sampled: np.ndarray | None = None

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def delayed_token_iters(self) -> int:
        """Sum over the batch's tokens of the iterations each waited since it was sampled."""
        if self.sampled is None:
            return 0
        return delayed_token_iters(self.lengths, self.sampled, self.iteration)

    @classmethod
    def of_lengths(cls, lengths: Sequence[int] | np.ndarray, iteration: int = 0) -> Batch:
        """A batch of plain sequence lengths, numbered 0..n-1 (what a data loader hands `Planner.plan`)."""
        arr = np.asarray(lengths, dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0 or arr.min() < 1:
            raise UserError(f"plan: lengths must be a non-empty 1-D list of positive integers (got shape {arr.shape})")
        return cls(iteration=iteration, ids=np.arange(arr.size, dtype=np.int64), lengths=arr)


def as_batch(batch: Batch | Sequence[int] | np.ndarray, iteration: int = 0) -> Batch:
    """A Batch as it is, or plain lengths as a batch of `iteration`."""
    return batch if isinstance(batch, Batch) else Batch.of_lengths(batch, iteration)


def delayed_token_iters(lengths: np.ndarray, sampled: np.ndarray, iteration: int) -> int:
    """Sum over the tokens trained in `iteration` of the iterations each waited since it was sampled."""
    return int((np.asarray(lengths) * (iteration - np.asarray(sampled))).sum())
