"""Pydantic models of every file hydraplan reads or writes (the v1 contracts of docs/formats.md).

Other tools read these files, so field names are a contract: add fields freely, never rename or drop.
Every model keeps unknown fields (``extra="allow"``) so files written by newer tools round-trip.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_serializer, model_validator

PROFILE_SCHEMA: Final = "hydraplan.profile/v1"
STRATEGIES_SCHEMA: Final = "hydraplan.strategies/v1"
PLAN_SCHEMA: Final = "hydraplan.plan/v1"
SUMMARY_SCHEMA: Final = "hydraplan.summary/v1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
RECOMPUTE_DESCRIPTION = ("activation recomputation: none; selective (the SwiGLU intermediates and the attention "
                         "core's scores); full (each layer keeps only its input and re-runs its forward in the backward)")


class _Layout(_Model):
    """A pipeline's layout <TP,PP,CP> and its activation recomputation; tp > 1 always runs with sequence
    parallelism. `recompute` is written only when it is not "none", so files of schemes without it are unchanged."""

    tp: PositiveInt
    pp: PositiveInt
    cp: PositiveInt
    recompute: Recompute = Field("none", description=RECOMPUTE_DESCRIPTION)

    @model_serializer(mode="wrap")
    def _omit_no_recompute(self, handler):
        out = handler(self)
        if isinstance(out, dict) and out.get("recompute") == "none":
            del out["recompute"]
        return out

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def key(self) -> tuple[int, int, int, str]:
        return (self.tp, self.pp, self.cp, self.recompute)

    @property
    def label(self) -> str:
        return scheme_label(self.key)


def scheme_label(key: tuple) -> str:
    """<tp,pp,cp>, or <tp,pp,cp,mode> for a recomputing layout."""
    tp, pp, cp, *rest = key
    mode = rest[0] if rest else "none"
    return f"<{tp},{pp},{cp}>" if mode == "none" else f"<{tp},{pp},{cp},{mode}>"


# --------------------------------------------------------------------------------------------- profile
class TimeCoeffs(_Model):
    """T(l) = a*l^2 + b*l + c seconds: one pipeline stage's forward+backward of one micro-batch."""

    a: NonNegativeFloat
    b: NonNegativeFloat
    c: NonNegativeFloat
    a_terms: dict[str, float] | None = Field(None, description="the named physical terms a sums (notes: time.NAME)")
    b_terms: dict[str, float] | None = Field(None, description="the named terms b sums")
    c_terms: dict[str, float] | None = Field(None, description="the named terms c sums: the per-micro-batch constant")
    fit_rel_err: NonNegativeFloat | None = Field(None, description="analytic profiles: the worst relative error of a, b, "
                                                                  "c against the stage model over the lengths fitted")


class SchemeMemory(_Model):
    """Per-GPU memory model of one scheme (Hydraulis appendix C.1), in bytes, so MaxLen can be
    recomputed for any cluster size: MaxLen(N) = (capacity - sharded/N - local) / per_token."""

    sharded_bytes: NonNegativeFloat = Field(description="fp32 master weights + Adam states, sharded over all N GPUs")
    local_bytes: NonNegativeFloat = Field(description="per-GPU bytes independent of N and l (bf16 stage weights, grads, buffers)")
    act_bytes_per_token: float = Field(gt=0, description="peak activation bytes per packed token under 1F1B")
    kv_bytes_per_token: NonNegativeFloat | None = Field(
        None, description="K and V bytes per packed token over the worst stage's micro-batches in flight: what a "
                          "Seq1F1B window or a CP rank's gathered keys keep on top of the activations")
    sharded_terms: dict[str, float] | None = Field(None, description="the named terms sharded_bytes sums (notes: memory.NAME)")
    local_terms: dict[str, float] | None = Field(None, description="the named terms local_bytes sums")
    token_terms: dict[str, float] | None = Field(None, description="the named terms act_bytes_per_token sums")


class Scheme(_Layout):
    """One parallel scheme <TP,PP,CP> (with its recomputation mode): the layout of one pipeline."""

    max_len: PositiveInt = Field(description="longest packed micro-batch (tokens) that fits with plain 1F1B")
    util_len: PositiveInt = Field(description="shortest micro-batch reaching the efficiency threshold (appendix D)")
    time: TimeCoeffs
    memory: SchemeMemory | None = None


class GPUInfo(_Model):
    name: str
    memory_gib: float = Field(gt=0)
    gpus_per_node: PositiveInt = 8
    peak_tflops: float | None = Field(None, gt=0, description="dense bf16 peak TFLOP/s, for MFU")


class ModelInfo(_Model):
    name: str
    layers: PositiveInt
    hidden: PositiveInt
    ffn: PositiveInt | None = Field(None, description="SwiGLU intermediate size (for FLOPs)")
    heads: PositiveInt | None = None
    vocab: PositiveInt | None = None
    params: PositiveInt | None = Field(None, description="parameter count Phi (LNK pull/push bytes, end-to-end estimate)")
    kv_heads: PositiveInt | None = Field(None, description="K/V heads (grouped-query attention); absent: as many as heads")
    tied_embeddings: bool | None = Field(None, description="LM head tied to the input embedding; absent: untied")
    qkv_bias: bool | None = Field(None, description="biases on the Q, K, V projections; absent: none")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base; absent: 10000")


class Network(_Model):
    """Per-GPU, one-direction bandwidth of the LNK pull/push (achieved, not nominal; sources in `notes`)."""

    intra_node_GBps: float = Field(gt=0, description="GB/s per GPU to a GPU of the same node")
    inter_node_GBps: float = Field(gt=0, description="GB/s per GPU to a GPU of another node")


class ProfileMemory(_Model):
    """Cluster-wide memory constants; present in analytic profiles so MaxLen follows --gpus."""

    capacity_bytes: float = Field(gt=0, description="usable bytes per GPU after the safety margin")


class Profile(_Model):
    schema_: Literal["hydraplan.profile/v1"] = Field(PROFILE_SCHEMA, alias="schema")
    name: str
    gpu: GPUInfo
    model: ModelInfo
    schemes: list[Scheme] = Field(min_length=1)
    reference_gpus: PositiveInt = 64
    memory: ProfileMemory | None = None
    network: Network | None = Field(None, description="LNK bandwidths; with model.params, enables the end-to-end estimate")
    source: str | None = Field(None, description='"analytic", "measured", ...')
    dtype: str | None = Field(None, description="the GEMMs' dtype the times hold: bf16, fp8 (Transformer Engine), or what "
                                                "a measured profile ran (bf16, fp32, fp64); absent: not stated")
    notes: dict[str, str] | None = Field(None, description="where every constant comes from")

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    @model_validator(mode="after")
    def _unique_schemes(self) -> "Profile":
        seen: set[tuple[int, int, int, str]] = set()
        for i, s in enumerate(self.schemes):
            if s.key in seen:
                raise ValueError(f"schemes.{i}: duplicate scheme {s.label}")
            seen.add(s.key)
        return self

    def scheme(self, tp: int, pp: int, cp: int, recompute: str = "none") -> Scheme | None:
        return next((s for s in self.schemes if s.key == (tp, pp, cp, recompute)), None)


# ------------------------------------------------------------------------------------------ strategies
class PipelineSpec(_Layout):
    ranks: list[int] | None = None

    @model_validator(mode="after")
    def _ranks_match(self) -> "PipelineSpec":
        if self.ranks is not None:
            if len(self.ranks) != self.gpus:
                raise ValueError(f"ranks has {len(self.ranks)} entries but tp*pp*cp = {self.gpus}")
            if len(set(self.ranks)) != len(self.ranks) or min(self.ranks) < 0:
                raise ValueError("ranks must be distinct non-negative integers")
        return self


class Candidate(_Model):
    name: str
    pipelines: list[PipelineSpec] = Field(min_length=1)
    max_len: int | None = Field(None, description="longest sequence the candidate supports")
    expected_s_per_token: float | None = Field(None, description="the proposal DP's expected seconds per token")
    optimal_for: tuple[int, int] | None = Field(None, description="range [lo, hi] of L' for which it is optimal")

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pipelines)


class Strategies(_Model):
    schema_: Literal["hydraplan.strategies/v1"] = Field(STRATEGIES_SCHEMA, alias="schema")
    profile: str | None = None
    gpus: PositiveInt | None = None
    context_len: PositiveInt | None = None
    candidates: list[Candidate] = Field(min_length=1)

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# ------------------------------------------------------------------------------------------------ plan
class BatchSeq(_Model):
    id: int = Field(ge=0, description="position in the run's sampled stream")
    doc: int | None = Field(None, description="the document's row in the dataset file (absent for histograms)")
    length: PositiveInt
    sampled_iteration: int | None = Field(
        None, ge=0, description="`pack --outlier-delay`: the iteration it was sampled in, when earlier than the plan's")


class CPShard(_Model):
    """How a cp > 1 pipeline shards one packed micro-batch over its CP ranks (WLB-LLM §5, `pack --cp-shard`)."""

    strategy: Literal["per-sequence", "per-document"]
    ranges: list[list[tuple[int, int]]] = Field(description="per CP rank, [start, end) token ranges of the packed sequence")
    attention_s: float = Field(description="slowest rank's tile-padded attention time, chosen strategy")
    other_s: float = Field(description="the same for the strategy not chosen")


class MicroBatch(_Model):
    seqs: list[int] = Field(min_length=1, description="ids of the batch's sequences, packed in this order")
    splits: list[int] | None = Field(None, description="Seq1F1B: K+1 token offsets; split j = [splits[j], splits[j+1])")
    cp_shard: CPShard | None = None


class CADPiece(_Model):
    """Tokens [start, end) of sequence `seq` held by replica `rank` for the linear layers (`pack --cad`)."""

    seq: int = Field(ge=0)
    start: int = Field(ge=0)
    end: PositiveInt
    rank: int = Field(ge=0)


class CADTask(_Model):
    """A core-attention task: queries [start, end) of `seq` with their causal key prefix [0, end)."""

    seq: int = Field(ge=0)
    start: int = Field(ge=0)
    end: PositiveInt
    home: int = Field(ge=0, description="replica holding the queries")
    rank: int = Field(ge=0, description="replica executing the task")


class CADStep(_Model):
    """One micro-batch step of a CAD plan: every replica runs one micro-batch of these pieces."""

    pieces: list[CADPiece]
    tasks: list[CADTask]
    compute_s: list[float] = Field(description="per replica: linear b*tokens + c plus its tasks' attention")
    comm_s: list[float] = Field(description="per replica: seconds of task transfers (hidden up to compute_s)")
    time_s: float = Field(description="max over replicas of max(compute, comm)")
    solver: str = ""
    attention_imbalance: float | None = Field(None, description="max / mean attention seconds per replica - 1")


class CADSection(_Layout):
    """Core-attention disaggregation (hydraplan.solve.cad): a homogeneous cp=1 layout whose attention tasks move
    between replicas of the same stage. Replica j is the plan's pipelines[j]."""

    replicas: PositiveInt
    budget: float = Field(description="per-replica comm cap as a fraction of the step's mean compute")
    steps: list[CADStep]
    estimate_s: NonNegativeFloat


class PlanPipeline(_Layout):
    ranks: list[int]
    micro_batches: list[MicroBatch]
    estimate_s: NonNegativeFloat
    seq1f1b_splits: PositiveInt | None = Field(None, description="Seq1F1B sub-sequences per micro-batch K")
    seq1f1b_estimate_s: NonNegativeFloat | None = Field(None, description="simulated Seq1F1B latency")
    seq1f1b_max_len: PositiveInt | None = Field(None, description="MaxLen under Seq1F1B with K splits")
    sync_s: NonNegativeFloat | None = Field(None, description="exposed LNK pull + push (end-to-end estimate, docs/formats.md)")


class Estimate(_Model):
    propagation_s: NonNegativeFloat
    sync_s: NonNegativeFloat | None = Field(
        None, description="exposed sync of the pipeline attaining iteration_s (end-to-end estimate, docs/formats.md)")
    iteration_s: NonNegativeFloat | None = Field(None, description="max over pipelines of propagation + exposed sync")
    seq1f1b_estimate_s: NonNegativeFloat | None = Field(
        None, description="max over pipelines of the Seq1F1B estimate (the canonical one where pp = 1)")


class Plan(_Model):
    schema_: Literal["hydraplan.plan/v1"] = Field(PLAN_SCHEMA, alias="schema")
    iteration: int = Field(ge=0)
    profile: str
    gpus: PositiveInt
    batch: list[BatchSeq]
    strategy: str
    pipelines: list[PlanPipeline]
    estimate: Estimate
    synthesized: bool | None = Field(None, description="true: the strategy was made for this batch "
                                     "(planner/solve/synthesis.py), so it is not one of the run's strategies.json candidates")
    cad: CADSection | None = Field(None, description="core-attention disaggregation plan (strategy kind cad)")

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# --------------------------------------------------------------------------------------------- summary
class CandidateSolve(_Model):
    """How one candidate was solved in one iteration: where the time went and which solver path ran."""

    name: str
    estimate_s: float | None = Field(None, description="canonical estimate; null if infeasible")
    dispatch_s: float = 0.0
    pack_s: float = 0.0
    dispatch_solver: str = ""
    pack_solvers: list[str] = Field(default_factory=list, description="packing solver path per pipeline")
    optimal: bool = Field(False, description="dispatch and every packing proven optimal")
    dispatch_optimal: bool = Field(False, description="the dispatch solver proved Eq. (3) optimal")
    bound_s: float | None = Field(None, description="lower bound on the candidate's estimate for this batch, in the "
                                  "run's objective (end-to-end or propagation)")
    iteration_s: float | None = Field(None, description="end-to-end estimate (docs/formats.md); null if not solved")
    pruned: bool = Field(False, description="not solved to the end: its bound already exceeded the chosen estimate")
    refine_moves: int = Field(0, description="sequences moved or swapped by the local search after packing")
    refine_s: float = Field(0.0, description="seconds of that local search")
    infeasible: str | None = Field(None, description="why the candidate cannot hold this batch")


class PackArgs(_Model):
    """The arguments that determine a `hydraplan pack` run's output; --resume requires the same ones."""

    profile: str
    profile_sha256: str
    dataset: str
    gpus: PositiveInt
    tokens_per_iter: PositiveInt
    context_len: PositiveInt | None = None
    seed: int
    dispatch: str
    strategies: str | None = Field(None, description="--strategies file (absolute), null if proposed")
    seq1f1b: str | None = Field(None, description="--seq1f1b K|auto, null if off")
    cp_shard: bool = Field(False, description="--cp-shard: adaptive CP sharding recorded")
    outlier_delay: bool = Field(False, description="--outlier-delay: long outliers queued and trained in groups")
    objective: str = Field("propagation", description="--objective end-to-end|propagation (runs that predate it: "
                           "propagation)")
    static: bool = Field(True, description="the static baseline's layout joins the candidates (--no-static: it does not)")
    synthesize: bool = Field(True, description="strategies made for each batch compete with the candidates "
                             "(--synthesize, the default; --candidates-only: they do not)")
    cad: bool = Field(False, description="--cad: core-attention disaggregation planned as a candidate")
    format: Literal["json", "compact"] = Field("json", description="--format: plan files as JSON (iter_NNNNNN.json) or "
                                               "compact (iter_NNNNNN.parquet)")
    refine: bool = Field(True, description="the local search after dispatch and packing ran (--no-refine: it did not)")


class IterationSummary(_Model):
    iteration: int
    strategy: str
    estimate_s: float
    solver_s: float = Field(description="wall seconds spent planning this iteration")
    solver: str = Field(description="which solver path produced the plan (e.g. greedy+cpsat, greedy+warm-start)")
    candidates_s: dict[str, float | None] = Field(default_factory=dict, description="estimate per candidate; null if infeasible")
    baselines_s: dict[str, float] = Field(default_factory=dict)
    iteration_s: float | None = Field(None, description="end-to-end estimate of the plan (estimate.iteration_s)")
    sync_s: float | None = Field(None, description="its exposed sync (estimate.sync_s)")
    baselines_iteration_s: dict[str, float] = Field(default_factory=dict, description="end-to-end estimate per baseline")
    candidates: list[CandidateSolve] = Field(default_factory=list)
    tokens: int | None = Field(None, description="--outlier-delay: tokens trained in this iteration")
    delayed_token_iters: int | None = Field(None, description="--outlier-delay: sum over its tokens of iterations waited")
    bound_s: float | None = Field(None, description="--bound: the any-strategy lower bound of the batch in the run's "
                                  "objective (no plan of any strategy is faster)")


class OutlierDelay(_Model):
    """`pack --outlier-delay`: the rule of hydraplan.solve.delay.hydraplan_rule for this run, and the delay it caused."""

    threshold: int = Field(description="sequences longer than this are queued")
    release_tokens: int = Field(description="the queue is released whole once it holds this many tokens")
    max_wait: int = Field(description="no sequence waits more iterations than this")
    avg_delay_iters_per_token: float | None = Field(None, description="over the planned iterations")


class Summary(_Model):
    schema_: Literal["hydraplan.summary/v1"] = Field(SUMMARY_SCHEMA, alias="schema")
    profile: str
    gpus: PositiveInt
    dataset: str
    tokens_per_iter: PositiveInt
    seed: int
    iterations: list[IterationSummary] = Field(default_factory=list)
    args: PackArgs | None = None
    strategies_sha256: str | None = Field(None, description="digest of the run's strategies.json candidates")
    iterations_requested: int | None = None
    mean_estimate_s: float | None = None
    outlier_delay: OutlierDelay | None = None
    baseline: str | None = Field(None, description="the static Megatron-style strategy of baselines_s['megatron']")
    mean_baseline_s: float | None = None
    objective: str | None = Field(None, description="what the plans minimize: end-to-end or propagation")
    mean_iteration_s: float | None = Field(None, description="mean end-to-end estimate per iteration")
    mean_baseline_iteration_s: float | None = Field(None, description="the static baseline's, end to end")
    synthesized_iterations: int = Field(0, description="iterations whose plan uses a strategy made for the batch")
    new_process_groups: int = Field(0, description="distinct TP and CP process groups the run's plans use")
    startup_process_groups: int = Field(0, description="the TP and CP groups of the family the runtime creates once at "
                                        "start-up (placement's aligned blocks for every scheme the run can use)")
    process_groups_per_rank: int = Field(0, description="the most of those one rank belongs to")
    groups_outside_family: int = Field(0, description="groups the plans use that the family lacks (pipelines on "
                                       "hand-written ranks): the runtime creates them when first needed")
    empty_documents: int = Field(0, ge=0, description="documents of 0 tokens in the dataset, skipped (never sampled)")
    truncated_documents: int = Field(0, ge=0, description="documents longer than context_len, truncated to it")
    context_len: PositiveInt | None = Field(None, description="--context-len, null for the dataset's longest")
    mean_plan_over_bound: float | None = Field(None, description="--bound: mean over iterations of the plan's score "
                                               "in the objective / bound_s")
    max_plan_over_bound: float | None = Field(None, description="--bound: the largest such ratio")

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# --------------------------------------------------------------------------------------------- compare
COMPARE_SCHEMA: Final = "hydraplan.compare/v1"


class MethodResult(_Model):
    """One method of `hydraplan compare`, per iteration on the shared batches (lists indexed by iteration)."""

    description: str = ""
    mean_estimate_s: float = Field(description="mean canonical propagation estimate per iteration")
    iterations_s: list[float] = Field(description="propagation estimate per iteration (HotSPa: with its switching)")
    mean_iteration_s: float | None = Field(None, description="mean end-to-end estimate per iteration (docs/formats.md)")
    iteration_s: list[float] = Field(default_factory=list, description="end-to-end estimate per iteration: "
                                     "propagation (iterations_s) + exposed sync (sync_s)")
    mean_sync_s: float | None = Field(None, description="mean exposed LNK pull/push per iteration")
    sync_s: list[float] = Field(default_factory=list, description="exposed LNK pull/push per iteration")
    mean_sim_s: float | None = Field(None, description="mean 1F1B schedule-exact latency (timeline simulator)")
    sim_iterations_s: list[float] = Field(default_factory=list)
    speedup_vs_megatron: float | None = Field(None, description="mean megatron / mean of this method, in the objective")
    end_to_end_speedup_vs_megatron: float | None = Field(None, description="both paying sync (mean_iteration_s)")
    propagation_speedup_vs_megatron: float | None = Field(None, description="propagation only (mean_estimate_s)")
    strategies: list[str] = Field(default_factory=list, description="strategy used per iteration")
    strategy_labels: dict[str, str] = Field(default_factory=dict, description="pipelines of each named strategy")
    gap: list[float] = Field(default_factory=list, description="(max - min) / max pipeline latency")
    idle_gpu_s: list[float] = Field(default_factory=list, description="GPU-seconds not computing")
    mfu: list[float] = Field(default_factory=list, description="modeled model-FLOPs utilization")
    tokens: list[int] = Field(default_factory=list, description="tokens trained per iteration")
    overhead_s: list[float] = Field(default_factory=list, description="non-compute time (HotSPa switching)")
    tokens_per_s: float | None = None
    imbalance: list[float] | None = Field(None, description="WLB-LLM Table 2 imbalance degree")
    avg_delay_iters_per_token: float | None = Field(None, description="outlier delay, iterations per trained token")


class CompareResult(_Model):
    schema_: Literal["hydraplan.compare/v1"] = Field(COMPARE_SCHEMA, alias="schema")
    profile: str
    dataset: str
    gpus: PositiveInt
    context_len: PositiveInt
    tokens_per_iter: PositiveInt
    iterations: PositiveInt
    seed: int
    methods: dict[str, MethodResult]
    notes: dict[str, str] = Field(default_factory=dict)
    objective: str | None = Field(None, description="what static choices and hydraplan minimized: end-to-end or "
                                  "propagation")

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# ---------------------------------------------------------------------------------------- dataset stats
DATASET_STATS_SCHEMA: Final = "hydraplan.dataset-stats/v1"


class LengthBin(_Model):
    """Documents with lo < length <= hi (log2 bins: hi is a power of two, lo = hi // 2)."""

    lo: int = Field(ge=0)
    hi: PositiveInt
    docs: int = Field(ge=0)
    tokens: int = Field(ge=0)


class ShareAbove(_Model):
    """Fraction of the documents and of the tokens in documents longer than `threshold` tokens."""

    threshold: PositiveInt
    docs: float = Field(ge=0, le=1)
    tokens: float = Field(ge=0, le=1)


class DatasetStats(_Model):
    """`hydraplan dataset stats --json`: the length distribution after truncation to context_len."""

    schema_: Literal["hydraplan.dataset-stats/v1"] = Field(DATASET_STATS_SCHEMA, alias="schema")
    dataset: str
    context_len: PositiveInt | None = None
    truncated: int = Field(0, ge=0, description="documents cut to context_len")
    empty: int = Field(0, ge=0, description="documents of 0 tokens, skipped (not in count or any statistic)")
    count: PositiveInt
    tokens: PositiveInt
    min: PositiveInt
    max: PositiveInt
    mean: float
    median: float
    p90: float
    p99: float
    share_above: list[ShareAbove] = Field(default_factory=list)
    histogram: list[LengthBin] = Field(default_factory=list)

    model_config = ConfigDict(extra="allow", populate_by_name=True)


SCHEMAS: dict[str, type[BaseModel]] = {
    "profile": Profile,
    "strategies": Strategies,
    "plan": Plan,
    "summary": Summary,
    "compare": CompareResult,
    "dataset-stats": DatasetStats,
}

__all__ = [
    "Recompute",
    "RECOMPUTE_MODES",
    "scheme_label",
    "TimeCoeffs",
    "SchemeMemory",
    "Scheme",
    "GPUInfo",
    "ModelInfo",
    "Network",
    "ProfileMemory",
    "Profile",
    "PipelineSpec",
    "Candidate",
    "Strategies",
    "BatchSeq",
    "CPShard",
    "MicroBatch",
    "CADPiece",
    "CADTask",
    "CADStep",
    "CADSection",
    "PlanPipeline",
    "Estimate",
    "Plan",
    "CandidateSolve",
    "PackArgs",
    "IterationSummary",
    "OutlierDelay",
    "Summary",
    "MethodResult",
    "CompareResult",
    "LengthBin",
    "ShareAbove",
    "DatasetStats",
    "PROFILE_SCHEMA",
    "STRATEGIES_SCHEMA",
    "PLAN_SCHEMA",
    "SUMMARY_SCHEMA",
    "COMPARE_SCHEMA",
    "DATASET_STATS_SCHEMA",
    "SCHEMAS",
]
