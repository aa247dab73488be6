"""hydraplan inside Megatron-LM: drop-ins for Megatron's two variable-length scheduler seams.

- hybrid context parallelism (`--hybrid-context-parallel`, megatron-core 0.17 and later, and Megatron-LM main):
  `install(profile)` makes `HybridCPDataLoaderWrapper` build a `HydraplanCPScheduler` where it built
  `BalancedCPScheduler` (same constructor, same `get_groups_and_subsamples(sample_id_seqlens, config) -> (groups,
  sample_id_groups)`), the schedule of hydraplan.solve.megatron.hybrid_cp priced on the profile's <tp,1,cp> schemes;
- sequence packing (`--sequence-packing-scheduler dp_balanced`, Megatron-LM main only): `install` puts a
  `DpBalancedScheduler` subclass into `scheduler_map`'s dp_balanced entry (main's enum key or a string key) whose
  `get_groups_and_subsamples` returns hydraplan.solve.megatron.packing's schedule, priced on <tp,pp,cp>.

TP, PP, CP, DP and the recompute mode come from Megatron's config and process groups; the profile is hydraplan's
(a bundled name, a profile file or a Profile). Every rank computes the same schedule, a pure function of the
gathered lengths. Megatron is imported only by `install`; everything else works without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.executors import RECOMPUTE_OF_GRANULARITY, HybridCP, MegatronPacking
from hydraplan.core.schema import Profile
from hydraplan.solve.megatron.hybrid_cp import schedule_hybrid_cp as _schedule
from hydraplan.solve.megatron.packing import schedule_packing as _pack
from hydraplan.store.profiles import load_profile

SEAMS = ("hybrid_cp", "packing")
DATA_SCHEDULE = "megatron.core.datasets.data_schedule"
DP_BALANCED = "dp_balanced"


def _profile(profile: Profile | str) -> Profile:
    return profile if isinstance(profile, Profile) else load_profile(str(profile))


@functools.lru_cache(maxsize=32)
def _named_target(profile: str, tp: int, dpcp: int, limit: int, recompute: str) -> HybridCP:
    return HybridCP.of(load_profile(profile), tp=tp, dpcp=dpcp, max_seqlen_per_rank=limit, recompute=recompute)


def hybrid_cp_target(profile: Profile | str, *, tp: int, dpcp: int, max_seqlen_per_rank: int,
                     recompute: str = "none") -> HybridCP:
    """The executor Megatron runs with these settings, priced on `profile` (a bundled name, a file, or a Profile)."""
    if recompute not in RECOMPUTE_OF_GRANULARITY.values():
        raise UserError(f"recompute must be none, selective or full (got {recompute!r})")
    if isinstance(profile, Profile):
        return HybridCP.of(profile, tp=tp, dpcp=dpcp, max_seqlen_per_rank=max_seqlen_per_rank, recompute=recompute)
    return _named_target(str(profile), tp, dpcp, int(max_seqlen_per_rank), recompute)


def schedule_hybrid_cp(seqlens: Sequence[int], *, profile: Profile | str, tp: int, dpcp: int, max_seqlen_per_rank: int,
                       recompute: str = "none") -> list[list[list[int]]]:
    """sample_id_groups for Megatron's hybrid CP: [round][DPxCP rank] -> positions into `seqlens`, in run order."""
    target = hybrid_cp_target(profile, tp=tp, dpcp=dpcp, max_seqlen_per_rank=max_seqlen_per_rank, recompute=recompute)
    return _schedule(np.asarray(seqlens, dtype=np.int64), target)


@functools.lru_cache(maxsize=32)
def _named_packing(profile: str, tp: int, pp: int, cp: int, dp: int, capacity: int, multiple: int,
                   recompute: str) -> MegatronPacking:
    return MegatronPacking.of(load_profile(profile), tp=tp, pp=pp, cp=cp, dp=dp, capacity=capacity, multiple=multiple,
                              recompute=recompute)


def schedule_packing(seqlens: Sequence[int], *, profile: Profile | str, tp: int, pp: int, cp: int, dp: int,
                     capacity: int, multiple: int = 1, recompute: str = "none") -> list[list[list[int]]]:
    """sample_id_groups for Megatron's packing schedulers: [micro-batch][dp*cp rank] -> positions into `seqlens`.
    `capacity` is max_seqlen_per_dp_cp_rank * cp; `multiple` the VPP micro-batch group (1 without VPP): the pack
    count is a multiple of dp * multiple."""
    args = (tp, pp, cp, dp, int(capacity), dp * int(multiple), recompute)
    target = (MegatronPacking.of(profile, tp=tp, pp=pp, cp=cp, dp=dp, capacity=int(capacity), multiple=dp * int(multiple),
                                 recompute=recompute)
              if isinstance(profile, Profile) else _named_packing(str(profile), *args))
    return _pack(np.asarray(seqlens, dtype=np.int64), target)


def _config_recompute(config) -> str:
    granularity = getattr(config, "recompute_granularity", None)
    if granularity not in RECOMPUTE_OF_GRANULARITY:
        raise UserError(f"Megatron config: recompute_granularity {granularity!r} has no hydraplan recompute mode")
    return RECOMPUTE_OF_GRANULARITY[granularity]


def drop_in(profile: Profile | str) -> type:
    """A BalancedCPScheduler replacement planning with `profile`."""
    prof = _profile(profile)

    class HydraplanCPScheduler:
        """Megatron's BalancedCPScheduler interface, hydraplan's schedule."""

        def __init__(self, max_seq_len_per_rank: int, dp_cp_group) -> None:
            self.max_seq_len_per_rank = max_seq_len_per_rank
            self.total_hdp_gpus = dp_cp_group.size()
            self.profile = prof
            self.targets: dict[tuple[int, str], HybridCP] = {}

        def get_groups_and_subsamples(self, sample_id_seqlens, config):
            ids = [int(sid) for sid, _ in sample_id_seqlens]
            lengths = [int(l) for _, l in sample_id_seqlens]
            key = (int(config.tensor_model_parallel_size), _config_recompute(config))
            if key not in self.targets:  # built once: the profile's view of the job is the same every batch
                self.targets[key] = hybrid_cp_target(self.profile, tp=key[0], dpcp=self.total_hdp_gpus,
                                                     max_seqlen_per_rank=self.max_seq_len_per_rank, recompute=key[1])
            rounds = _schedule(np.asarray(lengths, dtype=np.int64), self.targets[key])
            groups = [[[lengths[i] for i in rank] for rank in rnd] for rnd in rounds]
            sample_id_groups = [[[ids[i] for i in rank] for rank in rnd] for rnd in rounds]
            return groups, sample_id_groups

    return HydraplanCPScheduler


def packing_drop_in(profile: Profile | str, base: type) -> type:
    """A subclass of Megatron's DpBalancedScheduler (`base`) scheduling with `profile`: `run` keeps the config it
    is given (TP, PP, recompute), the rest of its pipeline stays Megatron's."""
    prof = _profile(profile)

    class HydraplanPackingScheduler(base):
        """DpBalancedScheduler's run, hydraplan's packs."""

        config = target = target_key = None

        def run(self, data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config):
            self.config = config
            return super().run(data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config)

        def get_groups_and_subsamples(self, sample_id_seqlens):
            c = self.config
            if c is None:
                raise UserError("hydraplan's packing scheduler needs Megatron's config: call run(...), as "
                                "wrap_data_iterator does")
            key = (int(c.tensor_model_parallel_size), int(c.pipeline_model_parallel_size), _config_recompute(c))
            if self.target is None or self.target_key != key:  # built once: the same layout every batch
                tp, pp, recompute = key
                self.target = MegatronPacking.of(prof, tp=tp, pp=pp, cp=self.cp_size, dp=self.dp_size,
                                                 capacity=self.max_seqlen_per_dp_cp_rank * self.cp_size,
                                                 multiple=self.dp_size * (self.microbatch_group_size_per_vp_stage or 1),
                                                 recompute=recompute)
                self.target_key = key
            return _pack(np.asarray([int(l) for _, l in sample_id_seqlens], dtype=np.int64), self.target)

    return HydraplanPackingScheduler


def _dp_balanced_keys(scheduler_map) -> list:
    """The dp_balanced entry's key: main's PackingSchedulerEnum member, or the string."""
    return [k for k in scheduler_map if k == DP_BALANCED or getattr(k, "value", None) == DP_BALANCED]


def install(profile: Profile | str, *, seams: Sequence[str] = SEAMS) -> Callable[[], None]:
    """Put hydraplan's schedulers into Megatron (call before `pretrain(...)`); returns the function undoing it.
    The packing seam is installed where this Megatron has it (Megatron-LM main) and skipped where it does not
    (megatron-core releases up to 0.19), so one call serves both."""
    unknown = [s for s in seams if s not in SEAMS]
    if unknown:
        raise UserError(f"install: seams {unknown} unknown (choose from {', '.join(SEAMS)})")
    import importlib

    data_schedule: Any = importlib.import_module(DATA_SCHEDULE)  # Megatron's module: its names are not typed here
    undo: list[Callable[[], None]] = []
    if "hybrid_cp" in seams:
        saved = data_schedule.BalancedCPScheduler
        data_schedule.BalancedCPScheduler = drop_in(profile)
        undo.append(lambda: setattr(data_schedule, "BalancedCPScheduler", saved))
    scheduler_map = getattr(data_schedule, "scheduler_map", None)
    if "packing" in seams and scheduler_map is not None:
        for key in _dp_balanced_keys(scheduler_map):
            before = scheduler_map[key]
            scheduler_map[key] = packing_drop_in(profile, before)
            undo.append(functools.partial(scheduler_map.__setitem__, key, before))

    def uninstall() -> None:
        for step in reversed(undo):
            step()

    return uninstall
