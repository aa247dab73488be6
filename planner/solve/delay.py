"""Outlier delay: hold rare long sequences back in FIFO queues and train them together later (WLB-LLM §4.2).

Why hydraplan delays: an iteration lasts at least as long as its longest sequence, so a batch holding one
30K document must give it a wide pipeline (e.g. <8,1,4>, 32 GPUs) that is fast but costly in GPU-seconds per
token, or let it set the iteration's pace. Several long documents in one iteration can each run on a narrow,
cheap pipeline side by side while the short documents fill the other GPUs for that longer iteration. So
grouping outliers lowers their GPU-seconds; spreading them out evenly does not (a one-per-iteration release
planned no faster than no delay; docs/results.md has the measured figures).

hydraplan's rule (`hydraplan_rule`), from the dataset's length tail and the token budget only, so a run's
rule is fixed by its arguments (what `pack --resume` relies on) and needs no candidates:
- outliers are the documents longer than the length above which the dataset holds less than one document
  per iteration: those are in only some batches, so they make iterations differ; shorter ones are in almost
  every batch and are what the proposed candidates are built for;
- one queue, released whole once it holds one iteration's token budget: the release iteration then carries
  about twice the usual tokens, long enough for every outlier to run on a narrow pipeline; a smaller group
  leaves outliers nearly alone again, a larger one adds delay for little gain;
- anything queued `max_wait` iterations (twice the expected time to fill the queue) is released regardless,
  so no token waits longer than that, and the last iteration of a finite run drains the queue.
The gain needs a candidate with several narrow pipelines that hold outliers, such as the static baseline's
homogeneous layout that `pack` and `compare` add to the proposal (with the proposed candidates alone the
delay gained next to nothing).
One level suffices because hydraplan's dispatcher places each outlier on a pipeline that holds it; WLB-LLM
uses two so that each of its fixed micro-batches gets one outlier of similar size (`wlb_rule`).
The rule needs no objective: the delayed batches are
planned like any other, so under the default end-to-end objective (the engine) the release
iterations' candidates, dispatch and selection minimize iteration time including exposed sync.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hydraplan.core.batch import Batch


@dataclass(frozen=True)
class DelayRule:
    """Queue q holds sequences longer than thresholds[q] and not longer than thresholds[q + 1]. A queue is
    full once it holds `count` sequences or `tokens` tokens (whichever is set); then `take` of them, oldest
    first (None: all), join the iteration. A sequence queued `max_wait` iterations joins regardless."""

    thresholds: tuple[int, ...]
    count: int | None = None
    tokens: int | None = None
    take: int | None = None
    max_wait: int | None = None


@dataclass(frozen=True, eq=False)
class _Seqs:
    ids: np.ndarray
    lengths: np.ndarray
    sampled: np.ndarray
    docs: np.ndarray | None

    def __getitem__(self, sel: Any) -> _Seqs:
        return _Seqs(self.ids[sel], self.lengths[sel], self.sampled[sel], None if self.docs is None else self.docs[sel])

    @staticmethod
    def concat(parts: Sequence[_Seqs]) -> _Seqs:
        docs = None if parts[0].docs is None else np.concatenate([p.docs for p in parts])  # all or none have docs
        ids, lengths, sampled = (np.concatenate([getattr(p, f) for p in parts]) for f in ("ids", "lengths", "sampled"))
        return _Seqs(ids, lengths, sampled, docs)


def _released(queue: _Seqs, rule: DelayRule, iteration: int, last: bool) -> int:
    """How many of the queue's oldest sequences join this iteration."""
    n = queue.lengths.size
    if last or n == 0:
        return n
    full = (rule.count is not None and n >= rule.count) or (rule.tokens is not None and int(queue.lengths.sum()) >= rule.tokens)
    k = (n if rule.take is None else min(rule.take, n)) if full else 0
    if rule.max_wait is not None:  # FIFO: the overdue sequences are the oldest, a prefix
        k = max(k, int(np.count_nonzero(iteration - queue.sampled >= rule.max_wait)))
    return k


def outlier_delay(batches: Iterable[Batch], rule: DelayRule, iterations: int | None = None) -> Iterator[Batch]:
    """Apply the queues to a stream of batches (iteration k is the k-th): each batch trained holds its own
    non-outliers (stream order), then the released outliers queue by queue, oldest first, `sampled` saying the
    iteration each one was sampled in. With `iterations`, iteration `iterations - 1` drains every queue, so the run trains
    exactly the sampled sequences. Lazy and deterministic: a resumed run replays the stream from the start."""
    limits = np.asarray(rule.thresholds, dtype=np.int64)
    queues: list[_Seqs] | None = None
    for it, batch in enumerate(batches):
        lengths = np.asarray(batch.lengths, dtype=np.int64)
        fresh = _Seqs(np.asarray(batch.ids, dtype=np.int64), lengths, np.full(lengths.size, it, dtype=np.int64),
                      None if batch.docs is None else np.asarray(batch.docs, dtype=np.int64))
        if queues is None:
            queues = [fresh[:0] for _ in limits]
        level = np.searchsorted(limits, lengths, side="left") - 1
        parts = [fresh[level < 0]]
        last = iterations is not None and it >= iterations - 1
        for q in range(limits.size):
            queue = _Seqs.concat([queues[q], fresh[level == q]])
            k = _released(queue, rule, it, last)
            parts.append(queue[:k])
            queues[q] = queue[k:]
        out = _Seqs.concat(parts)
        yield Batch(iteration=it, ids=out.ids, lengths=out.lengths, docs=out.docs, sampled=out.sampled)


def stream_batches(batches: Sequence[np.ndarray]) -> list[Batch]:
    """Plain per-iteration length arrays as a stream: ids are positions in the concatenated stream."""
    starts = np.cumsum([0, *(len(b) for b in batches)])
    return [Batch(iteration=it, ids=np.arange(starts[it], starts[it + 1], dtype=np.int64),
                  lengths=np.asarray(b, dtype=np.int64), sampled=np.full(len(b), it, dtype=np.int64))
            for it, b in enumerate(batches)]


def hydraplan_rule(lengths: np.ndarray, tokens_per_iter: int) -> DelayRule:
    """The module docstring's rule for a dataset (lengths after truncation) and token budget. The
    threshold is the (E+1)-th longest length, E = dataset tokens / tokens_per_iter: at most E documents
    (one per iteration's worth of tokens) are longer. No outliers when an iteration holds about one document."""
    desc = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    per_iter = int(desc.sum()) // tokens_per_iter
    threshold = int(desc[per_iter]) if per_iter < desc.size else int(desc[0])
    share = float(desc[desc > threshold].sum()) / float(desc.sum())
    max_wait = math.ceil(2.0 / share) if share > 0 else 1
    return DelayRule(thresholds=(threshold,), tokens=tokens_per_iter, max_wait=max_wait)


def wlb_rule(thresholds: Sequence[int], micro_batches: int) -> DelayRule:
    """WLB-LLM Algorithm 1: a queue waits for one outlier per micro-batch, then releases exactly that many."""
    return DelayRule(thresholds=tuple(int(t) for t in thresholds), count=micro_batches, take=micro_batches)
