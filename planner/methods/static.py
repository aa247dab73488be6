"""The static baseline `pack` scores every iteration against: Megatron-style, one homogeneous scheme."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.schema import Scheme
from hydraplan.methods.baselines import best_static, holding, megatron, objective_score, plan_iteration_s
from hydraplan.store.datasets import Dataset, sample_iterations

BASELINE_PROBE_ITERATIONS = 8
BASELINE_PROBE_SEQUENCES = 4000  # ... but no more batches than needed to see this many sequences


@dataclass(frozen=True)
class StaticBaseline:
    """What the user runs today, scored next to every planned iteration: Megatron-style, one homogeneous
    scheme replicated, FFD packing to the context length, micro-batches dealt round-robin."""

    scheme: Scheme
    cluster: Cluster
    context_len: int

    @property
    def label(self) -> str:
        return f"megatron {self.scheme.label}x{self.cluster.gpus // self.scheme.gpus}"

    def estimates_s(self, lengths: np.ndarray) -> tuple[float, float]:
        """(propagation, end-to-end) of the baseline's plan for this batch, sync paid with the same formula."""
        plan = megatron(lengths, self.scheme, self.cluster.gpus, self.context_len)
        return plan.estimate_s, plan_iteration_s(plan, self.cluster)


def static_baseline(cluster: Cluster, dataset: Dataset, context_len: int, tokens_per_iter: int, iterations: int,
                    seed: int) -> StaticBaseline | None:
    """The homogeneous scheme with the lowest mean Megatron estimate in the cluster's objective on the run's
    first batches (up to BASELINE_PROBE_ITERATIONS, stopping once BASELINE_PROBE_SEQUENCES sequences are seen;
    the same choice `compare` makes on all of its batches); None when no single scheme holds the context length."""
    schemes = holding(cluster.schemes, context_len, cluster.gpus)
    if not schemes:
        return None
    probe: list[np.ndarray] = []
    for b in sample_iterations(dataset, tokens_per_iter, min(iterations, BASELINE_PROBE_ITERATIONS), seed):
        if sum(p.size for p in probe) >= BASELINE_PROBE_SEQUENCES:
            break  # at thousands of GPUs one batch is enough: more only repeat FFD for the same choice
        probe.append(np.asarray(b.lengths, dtype=np.int64))
    scheme, _ = best_static(schemes, lambda s: [megatron(b, s, cluster.gpus, context_len) for b in probe], "baseline",
                            objective_score(cluster))
    return StaticBaseline(scheme, cluster, context_len)
