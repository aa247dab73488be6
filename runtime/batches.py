"""Token data of a plan's sequences, packed into micro-batches that every rank can rebuild on its own.

A sequence's tokens are a pure function of the plan entry: the dataset's token ids of its document when
a tokenized dataset is given, else synthetic ids from a torch.Generator seeded by the sequence id. So
every rank of a pipeline, and the single-process reference, derive identical micro-batches from the plan
alone: no data loader, no broadcast, and p2p activation shapes are known in advance ([tokens, hidden]).
The replay runtime, its reference and hydraplan.loader (for other trainers) all build them here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.core.errors import UserError
from hydraplan.core.schema import BatchSeq, Plan, PlanPipeline
from hydraplan.runtime.attention import Windows, documents

if TYPE_CHECKING:
    from hydraplan.runtime.device import Device
    from hydraplan.store.datasets import Dataset

IGNORE = -100
"""Label of a position with no next token (the last token of a document that ends inside the plan's length)."""


@dataclass(frozen=True)
class CPContext:
    """One CP rank's view of one micro-batch: how to gather the group's K/V and which keys each local run sees
    (built by context_parallel.shard_splits; defined here, with the PackedBatch that carries it, so the
    context-parallel code imports the batches and not the other way round).

    The gathered buffer holds the ranks' tokens one rank after another in process-group rank order
    (torch sorts a group's global ranks), `sizes` tokens each; `key_index` picks each run's key window
    out of it, back to back in the order of `windows`. Under Seq1F1B the buffer it indexes is the
    gathered buffers of the splits from the one starting at packed token `key_lo` to this one, concatenated."""

    group: dist.ProcessGroup
    sizes: list[int]
    key_index: torch.Tensor
    windows: Windows
    key_lo: int = 0


@dataclass(frozen=True)
class PackedBatch:
    """One micro-batch: documents back to back; labels are the next tokens of each document."""

    tokens: torch.Tensor  # [T] int64
    labels: torch.Tensor  # [T] int64, IGNORE where there is no next token
    positions: torch.Tensor  # [T] int64, restarting at 0 for each document (RoPE)
    cu_seqlens: torch.Tensor  # [n+1] int32 document offsets
    max_seqlen: int
    cp: CPContext | None = None  # a CP rank's share: its runs of documents and how to reach the others' K/V

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @functools.cached_property
    def windows(self) -> Windows:
        """Its documents as attention windows; their lengths are read to the host once, not per layer."""
        return documents(self.cu_seqlens, self.max_seqlen)


def micro_batch_seqs(plan: Plan, pipeline: PlanPipeline) -> list[list[BatchSeq]]:
    """The sequences of each of the pipeline's micro-batches, in packing order."""
    by_id = {s.id: s for s in plan.batch}
    return [[by_id[sid] for sid in mb.seqs] for mb in pipeline.micro_batches]


def rank_pipeline(plan: Plan, rank: int) -> PlanPipeline | None:
    """The pipeline rank `rank` belongs to in this plan (None: idle this iteration)."""
    return next((p for p in plan.pipelines if rank in p.ranks), None)


def to_device(t: torch.Tensor, device: Device | torch.device | str) -> torch.Tensor:
    """A host tensor on `device`; through the device seam when given one (pinned, non-blocking on CUDA)."""
    if isinstance(device, (torch.device, str)):
        return t.to(device)
    return device.to_device(t)


def synthetic_sequence(seq_id: int, length: int, vocab: int) -> torch.Tensor:
    """length+1 deterministic tokens for sequence `seq_id` (inputs are the first length, labels the last)."""
    gen = torch.Generator().manual_seed(int(seq_id))
    return torch.randint(0, vocab, (length + 1,), generator=gen)


@dataclass(frozen=True)
class TokenData:
    """Where tokens come from: `dataset` (tokenized, documents untruncated) or synthetic ids."""

    vocab: int
    dataset: Dataset | None = None

    def sequence(self, seq: BatchSeq) -> torch.Tensor:
        """Up to length+1 tokens: the inputs, then one more token if the document has it."""
        if self.dataset is None:
            return synthetic_sequence(seq.id, seq.length, self.vocab)
        return torch.from_numpy(self.dataset.tokens(seq.doc)[: seq.length + 1].astype(np.int64))

    def labeled(self, seq: BatchSeq) -> int:
        """Positions of `seq` that have a label (the loss is the mean over these, batch-wide)."""
        if self.dataset is None:
            return seq.length
        return min(seq.length, self.dataset.doc_length(seq.doc) - 1)

    def labeled_tokens(self, plan: Plan) -> int:
        """Positions with a label in the whole plan, every pipeline's: the denominator of the batch-mean loss."""
        used = {sid for p in plan.pipelines for mb in p.micro_batches for sid in mb.seqs}
        return sum(self.labeled(s) for s in plan.batch if s.id in used)

    def check(self, plan: Plan, source: str) -> None:
        """UserError unless the dataset can supply every planned sequence with ids the model knows."""
        if self.dataset is None:
            return
        ds = self.dataset
        for i, s in enumerate(plan.batch):
            where = f"{source}: field batch.{i}"
            if s.doc is None or not 0 <= s.doc < ds.documents:
                raise UserError(f"{where}.doc: {s.doc!r} is not a document of dataset {ds.name}")
            if s.length > ds.doc_length(s.doc):
                raise UserError(f"{where}.length: {s.length} exceeds document {s.doc}'s {ds.doc_length(s.doc)} "
                                f"tokens in {ds.name}")
            top = int(ds.tokens(s.doc)[: s.length + 1].max())
            if top >= self.vocab:
                raise UserError(f"{where}.doc: document {s.doc} of {ds.name} has token id {top} >= the model's "
                                f"vocab {self.vocab}")

    def pack(self, seqs: Sequence[BatchSeq], device: Device | torch.device | str = "cpu") -> PackedBatch:
        """Pack the sequences in the given order into one micro-batch of sum(length) tokens, built on the host and
        copied to `device` (a runtime Device: pinned and non-blocking on CUDA)."""
        data = [self.sequence(s) for s in seqs]
        lengths = torch.tensor([s.length for s in seqs], dtype=torch.int64)
        cu = torch.zeros(len(seqs) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(lengths, 0)
        total = int(cu[-1])
        labels = torch.full((total,), IGNORE, dtype=torch.int64)
        for start, d in zip(cu[:-1].tolist(), data):
            labels[start:start + len(d) - 1] = d[1:]
        return PackedBatch(
            tokens=to_device(torch.cat([d[:n] for d, n in zip(data, lengths.tolist())]), device),
            labels=to_device(labels, device),
            positions=to_device(torch.arange(total) - torch.repeat_interleave(cu[:-1], lengths, output_size=total), device),
            cu_seqlens=to_device(cu.to(torch.int32), device),
            max_seqlen=int(lengths.max()),
        )

    def micro_batches(self, plan: Plan, pipeline: PlanPipeline,
                      device: Device | torch.device | str = "cpu") -> list[PackedBatch]:
        """The pipeline's micro-batches in plan order: what each of its ranks trains on this iteration."""
        return [self.pack(seqs, device) for seqs in micro_batch_seqs(plan, pipeline)]
