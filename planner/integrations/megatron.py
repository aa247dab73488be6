"""hydraplan inside Megatron-LM: a drop-in for the hybrid context parallel scheduler (`--hybrid-context-parallel`,
megatron-core 0.17 and later, and Megatron-LM main).

`install(profile)` before `pretrain(...)` makes Megatron's `HybridCPDataLoaderWrapper` build a `HydraplanCPScheduler`
where it built `BalancedCPScheduler`: same constructor, same `get_groups_and_subsamples(sample_id_seqlens, config)
-> (groups, sample_id_groups)`, the schedule of hydraplan.solve.megatron_hcp priced on the profile's <tp,1,cp>
schemes (TP and recompute read from Megatron's config). Every rank computes the same schedule: a pure function of
the gathered lengths. Megatron is imported only by `install`; everything else works without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.executors import RECOMPUTE_OF_GRANULARITY, HybridCP
from hydraplan.core.schema import Profile
from hydraplan.solve.megatron_hcp import schedule_hybrid_cp as _schedule
from hydraplan.store.profiles import load_profile

SEAMS = ("hybrid_cp",)
DATA_SCHEDULE = "megatron.core.datasets.data_schedule"


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

        def get_groups_and_subsamples(self, sample_id_seqlens, config):
            ids = [int(sid) for sid, _ in sample_id_seqlens]
            lengths = [int(l) for _, l in sample_id_seqlens]
            rounds = schedule_hybrid_cp(lengths, profile=self.profile, tp=int(config.tensor_model_parallel_size),
                                        dpcp=self.total_hdp_gpus, max_seqlen_per_rank=self.max_seq_len_per_rank,
                                        recompute=_config_recompute(config))
            groups = [[[lengths[i] for i in rank] for rank in rnd] for rnd in rounds]
            sample_id_groups = [[[ids[i] for i in rank] for rank in rnd] for rnd in rounds]
            return groups, sample_id_groups

    return HydraplanCPScheduler


def install(profile: Profile | str, *, seams: Sequence[str] = SEAMS) -> Callable[[], None]:
    """Put hydraplan's schedulers into Megatron (call before `pretrain(...)`); returns the function undoing it."""
    unknown = [s for s in seams if s not in SEAMS]
    if unknown:
        raise UserError(f"install: seams {unknown} unknown (this version has {', '.join(SEAMS)})")
    import importlib

    data_schedule = importlib.import_module(DATA_SCHEDULE)
    saved = data_schedule.BalancedCPScheduler
    data_schedule.BalancedCPScheduler = drop_in(profile)

    def uninstall() -> None:
        data_schedule.BalancedCPScheduler = saved

    return uninstall
