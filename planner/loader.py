"""Feed your own trainer from hydraplan plans: the micro-batches one rank trains on, as packed tensors.

A plan names, per pipeline, its ranks and its micro-batches (sequence ids in packing order). For a rank,
`PlanLoader.micro_batches` builds its pipeline's micro-batches (tokens, labels, positions restarting per
document, cu_seqlens: the input of varlen attention) from a tokenized dataset's token ids, or synthetic
ids when it has none. It is the runtime's own code (hydraplan.runtime.batches), so a plan trains the same
tokens here as under `runtime/run_plan.py`. Every rank of a pipeline gets the same micro-batches (a
context-parallel rank shards them by the plan's `cp_shard`); a rank outside every pipeline gets none.

Loss. For training to equal single-process training on the global batch, each micro-batch contributes
sum(token losses) / labeled_tokens(plan), where labeled_tokens counts every pipeline's tokens, and the
ranks' gradients are summed, not averaged.

`read_plans` reads a run folder's plans in either form (JSON or compact). Needs torch (the `runtime`
extra) once a PlanLoader is made; importing this module does not import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hydraplan.core.schema import Plan
from hydraplan.store.datasets import Dataset, load_dataset
from hydraplan.store.planfile import read_plan
from hydraplan.store.runfolder import plan_files

if TYPE_CHECKING:
    import torch

    from hydraplan.runtime.batches import PackedBatch

__all__ = ["PackedBatch", "PlanLoader", "read_plan", "read_plans"]


def __getattr__(name: str) -> object:
    """`hydraplan.loader.PackedBatch` (the runtime's) on first use, so the import stays torch-free."""
    if name == "PackedBatch":
        from hydraplan.runtime.batches import PackedBatch

        return PackedBatch
    raise AttributeError(f"module 'hydraplan.loader' has no attribute {name!r}")


def read_plans(path: str | Path) -> Iterator[Plan]:
    """The plans of a plan file or of a run folder, JSON or compact (`pack --format compact`), in iteration
    order (`read_plan` reads one file)."""
    path = Path(path)
    for f in plan_files(path) if path.is_dir() else [path]:
        yield read_plan(f)


class PlanLoader:
    """Micro-batches of a plan for one rank, from `dataset` (a Dataset, or a spec for load_dataset) or,
    when it is None or has no token ids, synthetic ids below `vocab` seeded by the sequence id.

    Plans sampled from the dataset name its documents (`batch[].doc`); give the dataset untruncated, so a
    document cut to the context length keeps the label of its last kept token.
    """

    def __init__(self, dataset: Dataset | str | Path | None, *, vocab: int, device: torch.device | str = "cpu"):
        from hydraplan.runtime.batches import TokenData

        if isinstance(dataset, (str, Path)):
            dataset = load_dataset(dataset)
        tokenized = dataset is not None and dataset.has_tokens
        self.data = TokenData(vocab, dataset if tokenized else None)
        self.device = device

    def check(self, plan: Plan, source: str = "plan") -> None:
        """UserError (one line: field, value) unless the dataset holds every planned sequence with ids < vocab."""
        self.data.check(plan, source)

    def micro_batches(self, plan: Plan, rank: int) -> Iterator[PackedBatch]:
        """Rank `rank`'s micro-batches of this plan, in the plan's order."""
        from hydraplan.runtime.batches import rank_pipeline

        pipeline = rank_pipeline(plan, rank)
        if pipeline is not None:
            yield from self.data.micro_batches(plan, pipeline, self.device)

    def labeled_tokens(self, plan: Plan) -> int:
        """Tokens with a label in the whole plan (all ranks): the loss denominator of the global batch."""
        return self.data.labeled_tokens(plan)
