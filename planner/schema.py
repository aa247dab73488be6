"""Pydantic models of every file hydraplan reads or writes (v1 contracts of DESIGN.md).

Other tools read these files, so field names are a contract: add fields freely, never rename or drop.
Every model keeps unknown fields (``extra="allow"``) so files written by newer tools round-trip.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_validator

PROFILE_SCHEMA = "hydraplan.profile/v1"
STRATEGIES_SCHEMA = "hydraplan.strategies/v1"
PLAN_SCHEMA = "hydraplan.plan/v1"
SUMMARY_SCHEMA = "hydraplan.summary/v1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------------------------- profile
class TimeCoeffs(_Model):
    """T(l) = a*l^2 + b*l + c seconds: one pipeline stage's forward+backward of one micro-batch."""

    a: NonNegativeFloat
    b: NonNegativeFloat
    c: NonNegativeFloat


class SchemeMemory(_Model):
    """Per-GPU memory model of one scheme (Hydraulis appendix C.1), in bytes, so MaxLen can be
    recomputed for any cluster size: MaxLen(N) = (capacity - sharded/N - local) / per_token."""

    sharded_bytes: NonNegativeFloat = Field(description="fp32 master weights + Adam states, sharded over all N GPUs")
    local_bytes: NonNegativeFloat = Field(description="per-GPU bytes independent of N and l (bf16 stage weights, grads, buffers)")
    act_bytes_per_token: float = Field(gt=0, description="peak activation bytes per packed token under 1F1B")


class Scheme(_Model):
    """One parallel scheme <TP,PP,CP>: the layout of one pipeline."""

    tp: PositiveInt
    pp: PositiveInt
    cp: PositiveInt
    max_len: PositiveInt = Field(description="longest packed micro-batch (tokens) that fits with plain 1F1B")
    util_len: PositiveInt = Field(description="shortest micro-batch reaching the efficiency threshold (appendix D)")
    time: TimeCoeffs
    memory: SchemeMemory | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.tp, self.pp, self.cp)

    @property
    def label(self) -> str:
        return f"<{self.tp},{self.pp},{self.cp}>"


class GPUInfo(_Model):
    name: str
    memory_gib: float = Field(gt=0)
    gpus_per_node: PositiveInt = 8


class ModelInfo(_Model):
    name: str
    layers: PositiveInt
    hidden: PositiveInt


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
    source: str | None = Field(None, description='"analytic", "measured", ...')
    notes: dict[str, str] | None = Field(None, description="where every constant comes from")

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    @model_validator(mode="after")
    def _unique_schemes(self) -> "Profile":
        seen: set[tuple[int, int, int]] = set()
        for i, s in enumerate(self.schemes):
            if s.key in seen:
                raise ValueError(f"schemes.{i}: duplicate scheme {s.label}")
            seen.add(s.key)
        return self

    def scheme(self, tp: int, pp: int, cp: int) -> Scheme | None:
        return next((s for s in self.schemes if s.key == (tp, pp, cp)), None)


# ------------------------------------------------------------------------------------------ strategies
class PipelineSpec(_Model):
    tp: PositiveInt
    pp: PositiveInt
    cp: PositiveInt
    ranks: list[int] | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.tp, self.pp, self.cp)

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
    doc: int | None = Field(None, description="index in the dataset (absent for histograms)")
    length: PositiveInt


class MicroBatch(_Model):
    seqs: list[int] = Field(min_length=1, description="ids of the batch's sequences, packed in this order")


class PlanPipeline(_Model):
    tp: PositiveInt
    pp: PositiveInt
    cp: PositiveInt
    ranks: list[int]
    micro_batches: list[MicroBatch]
    estimate_s: NonNegativeFloat

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.tp, self.pp, self.cp)


class Estimate(_Model):
    propagation_s: NonNegativeFloat


class Plan(_Model):
    schema_: Literal["hydraplan.plan/v1"] = Field(PLAN_SCHEMA, alias="schema")
    iteration: int = Field(ge=0)
    profile: str
    gpus: PositiveInt
    batch: list[BatchSeq]
    strategy: str
    pipelines: list[PlanPipeline]
    estimate: Estimate

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# --------------------------------------------------------------------------------------------- summary
class IterationSummary(_Model):
    iteration: int
    strategy: str
    estimate_s: float
    solver_s: float = Field(description="wall seconds spent planning this iteration")
    solver: str = Field(description="which solver path produced the plan (e.g. greedy+cpsat, greedy+warm-start)")
    candidates_s: dict[str, float | None] = Field(default_factory=dict, description="estimate per candidate; null if infeasible")
    baselines_s: dict[str, float] = Field(default_factory=dict)


class Summary(_Model):
    schema_: Literal["hydraplan.summary/v1"] = Field(SUMMARY_SCHEMA, alias="schema")
    profile: str
    gpus: PositiveInt
    dataset: str
    tokens_per_iter: PositiveInt
    seed: int
    iterations: list[IterationSummary] = Field(default_factory=list)

    model_config = ConfigDict(extra="allow", populate_by_name=True)


SCHEMAS: dict[str, type[BaseModel]] = {
    "profile": Profile,
    "strategies": Strategies,
    "plan": Plan,
    "summary": Summary,
}
