"""The one batch type: the sequences one iteration trains, as the sampler, the outlier delay, the planner
and the compared methods all see them."""

from __future__ import annotations

import math
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
        arr = _lengths(lengths)
        return cls(iteration=iteration, ids=np.arange(arr.size, dtype=np.int64), lengths=arr)


def _lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Sequence lengths as int64, or UserError naming the first value that is not a positive integer (100.5
    is refused, not rounded: a length is a count of tokens)."""
    what = "plan: lengths must be a non-empty 1-D list of positive integers"
    try:
        arr = np.asarray(lengths)
    except ValueError:  # ragged nesting
        arr = np.asarray(lengths, dtype=object)
    if arr.ndim != 1 or arr.size == 0:
        raise UserError(f"{what} (got {lengths!r})" if arr.size <= 8 else f"{what} (got an array of shape {arr.shape})")
    if not (arr.dtype.kind in "iuf" and bool(np.all(np.isfinite(arr) & (arr >= 1) & (arr == np.floor(arr))))):
        values = arr.tolist() if isinstance(lengths, np.ndarray) else list(lengths)  # as given, not as numpy cast them
        i, x = next((i, x) for i, x in enumerate(values) if not _positive_integer(x))
        raise UserError(f"{what}: lengths[{i}] is {x!r}")
    return arr.astype(np.int64)


def _positive_integer(x: object) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 1
            and int(x) == x)


def as_batch(batch: Batch | Sequence[int] | np.ndarray, iteration: int = 0) -> Batch:
    """A Batch as it is, or plain lengths as a batch of `iteration`."""
    return batch if isinstance(batch, Batch) else Batch.of_lengths(batch, iteration)


def delayed_token_iters(lengths: np.ndarray, sampled: np.ndarray, iteration: int) -> int:
    """Sum over the tokens trained in `iteration` of the iterations each waited since it was sampled."""
    return int((np.asarray(lengths) * (iteration - np.asarray(sampled))).sum())
