"""What a job of N GPUs sees of a profile: the schemes that fit, MaxLen recomputed for N (appendix C.1:
fp32 master weights and optimizer states are sharded over all N GPUs)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from hydraplan.core import sync
from hydraplan.core.errors import UserError
from hydraplan.core.options import Objective
from hydraplan.core.schema import PipelineSpec, Profile, Scheme, SchemeMemory


# --------------------------------------------------------------------------------- profiles / MaxLen
def max_len_for_gpus(profile: Profile, scheme: Scheme, gpus: int) -> int:
    """MaxLen of a scheme when the fp32 optimizer states are sharded over `gpus` GPUs.

    A scheme without memory constants (hand-written or measured) keeps its stated max_len for any N.
    """
    if scheme.memory is None or profile.memory is None:
        return scheme.max_len
    return max_len_from_memory(profile.memory.capacity_bytes, scheme.memory, gpus)


def max_len_from_memory(capacity_bytes: float, m: SchemeMemory, gpus: int) -> int:
    """Appendix C.1: the l at which sharded/N + local + per_token*l reaches the usable capacity."""
    free = capacity_bytes - m.sharded_bytes / gpus - m.local_bytes
    return max(0, int(free // m.act_bytes_per_token))


MAX_JOB_GPUS = 1 << 16  # how far for_gpus looks for the smallest job a profile's model fits in
# The largest job planned: the proposal's and the planner's time grow with the GPU count, and 16384 GPUs is the
# largest size benchmarked (bench/bench_scale.py); far beyond it a run would not end, so it is refused.
MAX_GPUS = 1 << 14


def for_gpus(profile: Profile, gpus: int) -> Profile:
    """The profile as seen by a job of `gpus` GPUs: schemes that fit, MaxLen recomputed for N."""
    if gpus < 1:
        raise UserError(f"gpus must be positive (got {gpus})", "gpus")
    if gpus > MAX_GPUS:
        raise UserError(f"gpus: {gpus:,} GPUs are more than the {MAX_GPUS:,} planned (the largest size benchmarked)", "gpus")
    schemes = []
    for s in profile.schemes:
        if s.gpus > gpus:
            continue
        ml = max_len_for_gpus(profile, s, gpus)
        if ml > 0:
            schemes.append(s.model_copy(update={"max_len": ml, "util_len": min(s.util_len, ml)}))
    if not schemes:  # too few GPUs for any scheme, or for the sharded weights and optimizer states
        need = next((n for n in range(gpus + 1, MAX_JOB_GPUS + 1)
                     if any(s.gpus <= n and max_len_for_gpus(profile, s, n) > 0 for s in profile.schemes)), None)
        smallest = f" (the smallest job it fits has {need} GPUs)" if need else ""
        raise UserError(f"profile {profile.name}: no scheme fits in {gpus} GPUs{smallest}")
    return profile.model_copy(update={"schemes": schemes})


OBJECTIVES: tuple[str, ...] = ("end-to-end", "propagation")


T = TypeVar("T")


def objective_of(recorded: str | None) -> Objective:
    """The objective plans (or a compare.json) were ranked in; files from before the end-to-end estimate carry
    none: propagation."""
    return "end-to-end" if recorded == "end-to-end" else "propagation"


def ranked(objective: str | None, propagation: T, end_to_end: T) -> T:
    """Of a figure's propagation and end-to-end forms, the one the objective ranks by. The one place outside
    Cluster that reads the objective: summaries, reports and baselines ask here, never compare it themselves."""
    return end_to_end if objective_of(objective) == "end-to-end" else propagation


def score(objective: str | None, propagation_s: float, iteration_s: float | None) -> float:
    """A plan's number in the objective: iteration_s end to end when known, else propagation."""
    return propagation_s if iteration_s is None else ranked(objective, propagation_s, iteration_s)


@dataclass(frozen=True, eq=False)
class Cluster:
    """One run's view of the cluster: a profile on `gpus` GPUs, scored in one objective. Built once per run
    (`Cluster.of`) and passed whole, so the schemes for N GPUs, their transfer times and what a plan's score
    is are derived in one place and no other module interprets the objective.

    `objective` "end-to-end" (the default) ranks plans by iteration_s, propagation plus the exposed LNK
    pull/push of docs/formats.md; "propagation" by the canonical propagation estimate alone (the paper's)."""

    profile: Profile
    gpus: int
    objective: Objective
    view: Profile = field(repr=False)

    @classmethod
    def of(cls, profile: Profile, gpus: int, objective: str = "end-to-end") -> Cluster:
        if objective not in OBJECTIVES:
            raise UserError(f"objective must be end-to-end or propagation (got {objective!r})", "objective")
        return cls(profile, gpus, objective, for_gpus(profile, gpus))  # type: ignore[arg-type]  # objective checked above

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def gpus_per_node(self) -> int:
        return self.profile.gpu.gpus_per_node

    @property
    def schemes(self) -> list[Scheme]:
        """The schemes that fit in the job, MaxLen for its size."""
        return self.view.schemes

    @functools.cached_property
    def _by_key(self) -> dict[tuple[int, int, int, str], Scheme]:
        return {s.key: s for s in self.view.schemes}

    @functools.cached_property
    def scheme_index(self) -> dict[tuple[int, int, int, str], int]:
        """Each scheme's position in `schemes`, by key."""
        return {s.key: k for k, s in enumerate(self.view.schemes)}

    @functools.cached_property
    def scheme_charges_s(self) -> np.ndarray:
        """charged_for(schemes): what the objective charges a pipeline of each scheme, in `schemes` order (shared by
        every caller of the run, so read-only)."""
        out = self.charged_for(self.view.schemes)
        out.flags.writeable = False
        return out

    def scheme(self, key: tuple) -> Scheme | None:
        """The scheme of key (tp, pp, cp, recompute); (tp, pp, cp) means no recomputation."""
        return self._by_key.get(tuple(key) if len(key) == 4 else (*key, "none"))

    def laid_out(self, key: tuple) -> Scheme:
        """The scheme of a key this cluster laid out (a plan's pipeline): one the run never made is a bug."""
        scheme = self.scheme(key)
        if scheme is None:
            raise KeyError(f"scheme {key} is not laid out for {self.gpus} GPUs")
        return scheme

    @property
    def end_to_end(self) -> bool:
        return objective_of(self.objective) == "end-to-end"

    def ranked(self, propagation: T, end_to_end: T) -> T:
        """Of a figure's propagation and end-to-end forms, the one this run's objective ranks by."""
        return ranked(self.objective, propagation, end_to_end)

    @functools.cached_property
    def bandwidth_GBps(self) -> float | None:
        """Per-GPU GB/s of the LNK pull and push in this job (None: the profile has no sync model)."""
        if not sync.has_sync_model(self.profile):
            return None
        return sync.effective_bandwidth_GBps(self.profile.network, self.gpus_per_node, self.gpus)  # type: ignore[arg-type]  # has_sync_model: a network

    def transfer_s(self, tp: int | np.ndarray, pp: int | np.ndarray) -> np.ndarray | float:
        """Seconds of one direction (pull or push) for one GPU of a <tp, pp, *> pipeline (0 without a sync model)."""
        return sync.transfer_s(self.profile.model.params, self.bandwidth_GBps, tp, pp)

    def charged_s(self, tp: np.ndarray, pp: np.ndarray) -> np.ndarray:
        """Per pipeline, the transfer the planner optimizes with: the sync model's end to end, zeros (every
        end-to-end mapping the identity) with the propagation objective."""
        tp, pp = np.asarray(tp, dtype=np.float64), np.asarray(pp, dtype=np.float64)
        if not self.end_to_end:
            return np.zeros(tp.shape)
        return np.asarray(self.transfer_s(tp, pp), dtype=np.float64).reshape(tp.shape)

    def charged_for(self, pipelines: Sequence[Scheme] | Sequence[PipelineSpec]) -> np.ndarray:
        return self.charged_s(np.array([p.tp for p in pipelines]), np.array([p.pp for p in pipelines]))

    def estimate(self, keys: Sequence[tuple], propagation_s: Sequence[float]) -> sync.IterationEstimate:
        """The end-to-end estimate of one plan: pipelines given by their keys (tp, pp, cp, ...) and canonical times."""
        tp = np.array([k[0] for k in keys], dtype=np.float64)
        pp = np.array([k[1] for k in keys], dtype=np.float64)
        return sync.iteration_estimate(np.asarray(self.transfer_s(tp, pp)), propagation_s)

    def score(self, propagation_s: float, iteration_s: float | None) -> float:
        """A plan's number in the objective (iteration_s end to end when known, else propagation)."""
        return score(self.objective, propagation_s, iteration_s)
