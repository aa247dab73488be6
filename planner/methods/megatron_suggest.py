"""What `hydraplan megatron suggest` recommends: for each of Megatron's seams (hybrid CP, sequence packing, dynamic
CP), the setting where hydraplan's scheduler runs sampled global batches fastest, beside Megatron's own scheduler at
its best setting, every row on one objective (propagation, as Megatron's executors run the schedules:
core.executors), which seam to use, and the complete flags to paste.

Flags are Megatron-LM's, checked against megatron/training/arguments.py and the config dataclasses it turns into
flags (main d98e8a64dd, dev d48bd6be0a): the layout with sequence parallelism whenever TP > 1 (the profiles'
schemes assume it), `--use-distributed-optimizer` (the profiles shard optimizer states over every GPU), the
recompute granularity of the profile's schemes (full: every layer, `--recompute-method uniform
--recompute-num-layers 1`), and `--seq-length`, `--micro-batch-size 1` and `--global-batch-size` giving about the
tokens per iteration: packed samples of the context length for hybrid CP (its data are packed), one sequence a
sample for packing and dynamic CP (dev's variable-length data, `--use-varlen-dataset`), rounded up to a multiple of
the data-parallel size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.schema import Scheme
from hydraplan.methods.megatron_seams import (
    DynamicCPRun,
    HybridCPRun,
    PackingRun,
    best_run,
    dcp_runs,
    hybrid_cp_runs,
    packing_layouts,
    packing_run,
)

OBJECTIVE = "propagation"
VERSIONS = {"hybrid_cp": "megatron-core 0.17-0.19 and Megatron-LM main",
            "packing": "Megatron-LM dev; on main config fields only",
            "dynamic_cp": "Megatron-LM dev"}
TITLES = {"hybrid_cp": "hybrid CP", "packing": "sequence packing (dp_balanced)",
          "dynamic_cp": "dynamic CP (default_dynamic_cp)"}
RECOMPUTE_FLAGS = {"none": "", "selective": " --recompute-granularity selective",
                   "full": " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"}


def layout_flags(tp: int, pp: int, cp: int, recompute: str) -> str:
    sp = " --sequence-parallel" if tp > 1 else ""
    return (f"--tensor-model-parallel-size {tp}{sp} --pipeline-model-parallel-size {pp} --context-parallel-size {cp} "
            f"--use-distributed-optimizer{RECOMPUTE_FLAGS[recompute]}")


def batch_flags(seq_length: int, samples: float, dp: int) -> str:
    """`samples` per global batch, rounded up to a whole number of micro-batches of one sample on every replica."""
    global_batch = max(dp, -(-int(np.ceil(samples)) // dp) * dp)
    return f"--seq-length {seq_length} --micro-batch-size 1 --global-batch-size {global_batch}"


@dataclass(frozen=True)
class Pick:
    """One seam: hydraplan's fastest setting on the sampled batches and its seconds per global batch, Megatron's
    scheduler at its own fastest setting (None: it runs none), the flags to paste."""

    seam: str
    setting: str
    seconds: float
    tp: int
    max_seqlen_per_dp_cp_rank: int
    flags: str
    megatron_setting: str | None = None
    megatron_s: float | None = None

    @property
    def speedup(self) -> float | None:
        return self.megatron_s / self.seconds if self.megatron_s else None


@dataclass(frozen=True)
class Suggestion:
    """Every seam's runs and picks (a seam that runs no setting has no pick), and which seam to use."""

    hybrid: tuple[HybridCPRun, ...]
    packing: tuple[PackingRun, ...]
    dynamic: tuple[DynamicCPRun, ...]
    picks: dict[str, Pick]

    @property
    def use(self) -> str | None:
        """The seam whose pick is fastest."""
        return min(self.picks, key=lambda s: self.picks[s].seconds) if self.picks else None


def mean_propagation(run: PackingRun) -> float:
    return float(np.mean(run.propagation_s)) if run.propagation_s and not run.why_not else float("inf")


def hybrid_pick(runs: Sequence[HybridCPRun], gpus: int, context_len: int, tokens_per_iter: int,
                recompute: str) -> Pick | None:
    ours, theirs = best_run(runs, "hydraplan-hcp"), best_run(runs, "megatron-hcp")
    if ours is None:
        return None
    dpcp = gpus // ours.tp
    flags = (f"{layout_flags(ours.tp, 1, 1, recompute)} --hybrid-context-parallel --max-seqlen-per-dp-cp-rank "
             f"{ours.max_seqlen_per_rank} --calculate-per-token-loss --dataloader-type single "
             f"{batch_flags(context_len, tokens_per_iter / context_len, dpcp)}")
    return Pick("hybrid_cp", f"TP {ours.tp}", ours.mean_s, ours.tp, ours.max_seqlen_per_rank, flags,
                f"TP {theirs.tp}" if theirs else None, theirs.mean_s if theirs else None)


def packing_pick(runs: Sequence[PackingRun], gpus: int, context_len: int, sequences: float,
                 recompute: str) -> Pick | None:
    def fastest(method: str) -> PackingRun | None:
        ok = [r for r in runs if r.method == method and mean_propagation(r) < float("inf")]
        return min(ok, key=lambda r: (mean_propagation(r), r.scheme.gpus)) if ok else None

    ours, theirs = fastest("hydraplan-packing"), fastest("megatron-dp-balanced")
    if ours is None:
        return None
    s: Scheme = ours.scheme
    per_rank = ours.capacity // s.cp
    flags = (f"{layout_flags(s.tp, s.pp, s.cp, recompute)} --sequence-packing-scheduler dp_balanced "
             f"--max-seqlen-per-dp-cp-rank {per_rank} {batch_flags(context_len, sequences, ours.dp)}")
    return Pick("packing", ours.label, mean_propagation(ours), s.tp, per_rank, flags,
                theirs.label if theirs else None, mean_propagation(theirs) if theirs else None)


def dynamic_pick(runs: Sequence[DynamicCPRun], gpus: int, context_len: int, sequences: float,
                 recompute: str) -> Pick | None:
    def fastest(method: str) -> DynamicCPRun | None:
        ok = [r for r in runs if r.method == method and r.mean_s < float("inf") and not r.invalid]
        return min(ok, key=lambda r: (r.mean_s, r.tp)) if ok else None

    ours, theirs = fastest("hydraplan-dcp"), fastest("megatron-dcp")
    if ours is None:
        return None
    flags = (f"{layout_flags(ours.tp, 1, 1, recompute)} --dynamic-context-parallel --sequence-packing-scheduler "
             f"default_dynamic_cp --max-seqlen-per-dp-cp-rank {ours.max_seqlen_per_rank} "
             "--min-dynamic-context-parallel-size 1 --calculate-per-token-loss --dataloader-type single "
             f"{batch_flags(context_len, sequences, gpus // ours.tp)}")
    return Pick("dynamic_cp", f"TP {ours.tp}", ours.mean_s, ours.tp, ours.max_seqlen_per_rank, flags,
                f"TP {theirs.tp}, max_seqlen_per_dp_cp_rank {theirs.max_seqlen_per_rank}" if theirs else None,
                theirs.mean_s if theirs else None)


def suggest(cluster: Cluster, batches: Sequence[np.ndarray], context_len: int, tokens_per_iter: int,
            recompute: str = "none") -> Suggestion:
    """Every seam on these batches of `cluster`, `context_len` the longest sequence a setting must hold."""
    hybrid = tuple(hybrid_cp_runs(cluster.profile, batches, cluster.gpus, recompute))
    packing = tuple(packing_run(m, cluster, batches, s) for s in packing_layouts(cluster, context_len, recompute)
                    for m in ("megatron-dp-balanced", "hydraplan-packing"))
    dynamic = tuple(dcp_runs(cluster.profile, batches, cluster.gpus, context_len, recompute))
    sequences = float(np.mean([b.size for b in batches]))
    picks = {p.seam: p for p in (hybrid_pick(hybrid, cluster.gpus, context_len, tokens_per_iter, recompute),
                                 packing_pick(packing, cluster.gpus, context_len, sequences, recompute),
                                 dynamic_pick(dynamic, cluster.gpus, context_len, sequences, recompute))
             if p is not None}
    return Suggestion(hybrid, packing, dynamic, picks)
