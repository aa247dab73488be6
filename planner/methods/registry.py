"""The methods `hydraplan compare` runs, in one table: name, what it is, its colour in the report, how it runs.

`compare` runs them in this order, `report` draws each in its colour and `hydraplan compare --help` lists them;
adding a method is one entry here and its plans (methods/baselines.py, compare.py's BASELINE_RUNS for a baseline).
No imports beyond the standard library: the CLI reads the names for its help without loading the planner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["baseline", "hydra", "cad", "seam"]


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    color: str  # the report's colour for it
    # baseline: planned alone by compare.BASELINE_RUNS[name]; hydra: from hydraplan's proposal, planned together
    # (methods/hydra.py); cad: core-attention disaggregation and the per-iteration chooser (methods/cad.py); seam:
    # a schedule for one of Megatron-LM's executors, scored as it runs them (methods/megatron_seams.py), run when named
    family: Family
    reports_delay: bool = False  # its summary gives the average delay per token (outlier queues, or none)


METHODS: tuple[Method, ...] = (
    Method("megatron", "static homogeneous scheme, FFD packing to the context length, micro-batches dealt round-robin",
           "#7f7f7f", "baseline"),
    Method("hotspa", "one homogeneous scheme per length range (<4K, 4K-16K, 16K+), switched within the iteration",
           "#bcbd22", "baseline"),
    Method("wlb-llm", "static homogeneous scheme, var-len packing with 2-level outlier delay queues", "#17becf",
           "baseline", reports_delay=True),
    Method("wlb-nodelay", "wlb-llm without the outlier queues: var-len packing of each iteration's own batch",
           "#9edae5", "baseline", reports_delay=True),
    Method("flexsp", "sorted sequences chunked into memory-balanced steps (Eq. 23-24), flexible pp=1 groups",
           "#8c564b", "baseline"),
    Method("homo-maxlen", "ablation (a): static homogeneous scheme, Eq. 3 dispatch, max-length packing", "#c5b0d5",
           "hydra"),
    Method("homo-pack", "ablation (b): static homogeneous scheme, Eq. 3 dispatch, Eq. 1 packing", "#9467bd", "hydra"),
    Method("hetero-static", "ablation (c): best static heterogeneous candidate holding the context length", "#ff7f0e",
           "hydra"),
    Method("hydraplan", "propose + dispatch + pack, strategy chosen per iteration", "#d62728", "hydra"),
    Method("hydraplan-delay", "hydraplan on batches whose long outliers are queued and released in one-iteration "
           "groups", "#e377c2", "hydra", reports_delay=True),
    Method("cad", "core-attention disaggregation (DistCA-style): homogeneous cp=1 replicas, token-balanced linear part, "
           "attention tasks balanced across replicas under a communication budget", "#2ca02c", "cad"),
    Method("hydraplan-cad", "per iteration, the faster (in the objective) of hydraplan's plan and the CAD plan",
           "#1f77b4", "cad"),
    Method("megatron-hcp", "Megatron-LM's BalancedCPScheduler (hybrid CP): L^2/cp balanced, CP size from L / limit",
           "#525252", "seam"),
    Method("hydraplan-hcp", "hydraplan's hybrid-CP scheduler (integrations.megatron): CP size and placement from the "
           "cost model", "#ff9896", "seam"),
    Method("megatron-dp-balanced", "Megatron-LM's dp_balanced packing scheduler: in-order packs, pack i*dp + d to "
           "replica d", "#a5a5a5", "seam"),
    Method("hydraplan-packing", "hydraplan's packing scheduler (integrations.megatron): dispatch + Eq. 1 packing, one V "
           "per replica", "#c49c94", "seam"),
    Method("megatron-dcp", "Megatron-LM's DefaultDynamicCPScheduler (dynamic CP, dev): L^2/cp balanced one micro-batch at "
           "a time, CP size from L / limit", "#3b3b3b", "seam"),
    Method("hydraplan-dcp", "hydraplan's dynamic-CP scheduler (integrations.megatron): block sizes, packs and micro-batches "
           "from the cost model", "#f7b6d2", "seam"),
)
BY_NAME = {m.name: m for m in METHODS}
NAMES = tuple(m.name for m in METHODS if m.family != "seam")  # what compare runs when no method is named


def of_family(family: Family) -> tuple[str, ...]:
    return tuple(m.name for m in METHODS if m.family == family)


OPT_IN = of_family("seam")
