"""The plain functions other tools call: a global batch's lengths in, Megatron's `sample_id_groups` out, priced
on a hydraplan profile for the executor Megatron runs with these settings.

Everything the planner brings (the profile's pydantic models, the compiled dispatch) is imported at the first
call, not with the plugin, so a training process pays for it only when a schedule is made. Targets built from a
bundled profile's name are cached: every rank calls with the same settings on every batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hydraplan.core.errors import UserError

if TYPE_CHECKING:
    from hydraplan.core.executors import DynamicCP, HybridCP, MegatronPacking, PackPadding
    from hydraplan.core.schema import Profile

Schedule = list[list[list[int]]]  # [micro-batch or round][DPxCP rank] -> positions into the batch's lengths
RECOMPUTE_MODES = ("none", "selective", "full")


def load(profile: Profile | str) -> Profile:
    """A Profile as given, else a bundled profile's name or a profile file."""
    from hydraplan.core.schema import Profile
    from hydraplan.store.profiles import load_profile

    return profile if isinstance(profile, Profile) else load_profile(str(profile))


def _check_recompute(recompute: str) -> None:
    if recompute not in RECOMPUTE_MODES:
        raise UserError(f"recompute must be none, selective or full (got {recompute!r})", "recompute")


@functools.lru_cache(maxsize=32)
def _named_hybrid(profile: str, tp: int, dpcp: int, limit: int, recompute: str) -> HybridCP:
    from hydraplan.core.executors import HybridCP

    return HybridCP.of(load(profile), tp=tp, dpcp=dpcp, max_seqlen_per_rank=limit, recompute=recompute)


def hybrid_cp_target(profile: Profile | str, *, tp: int, dpcp: int, max_seqlen_per_rank: int,
                     recompute: str = "none") -> HybridCP:
    """The hybrid-CP executor Megatron runs with these settings, priced on `profile` (a bundled name, a file, or a
    Profile)."""
    from hydraplan.core.executors import HybridCP

    _check_recompute(recompute)
    if isinstance(profile, str):
        return _named_hybrid(profile, tp, dpcp, int(max_seqlen_per_rank), recompute)
    return HybridCP.of(profile, tp=tp, dpcp=dpcp, max_seqlen_per_rank=max_seqlen_per_rank, recompute=recompute)


def schedule_hybrid_cp(seqlens: Sequence[int], *, profile: Profile | str, tp: int, dpcp: int, max_seqlen_per_rank: int,
                       recompute: str = "none") -> Schedule:
    """sample_id_groups for Megatron's hybrid CP: [round][DPxCP rank] -> positions into `seqlens`, in run order."""
    import numpy as np

    from hydraplan.solve.megatron.hybrid_cp import schedule_hybrid_cp as plan

    target = hybrid_cp_target(profile, tp=tp, dpcp=dpcp, max_seqlen_per_rank=max_seqlen_per_rank, recompute=recompute)
    return plan(np.asarray(seqlens, dtype=np.int64), target)


@functools.lru_cache(maxsize=32)
def _named_packing(profile: str, tp: int, pp: int, cp: int, dp: int, capacity: int, multiple: int, recompute: str,
                   max_num_seqs: int | None) -> MegatronPacking:
    from hydraplan.core.executors import MegatronPacking

    return MegatronPacking.of(load(profile), tp=tp, pp=pp, cp=cp, dp=dp, capacity=capacity, multiple=multiple,
                              recompute=recompute, max_num_seqs=max_num_seqs)


def packing_target(profile: Profile | str, *, tp: int, pp: int, cp: int, dp: int, capacity: int, multiple: int = 1,
                   recompute: str = "none", max_num_seqs: int | None = None) -> MegatronPacking:
    """The packing executor: `capacity` is max_seqlen_per_dp_cp_rank * cp, `multiple` the VPP micro-batch group (1
    without VPP), so the pack count is a multiple of dp * multiple; at most `max_num_seqs` documents a pack."""
    from hydraplan.core.executors import MegatronPacking

    _check_recompute(recompute)
    args = (tp, pp, cp, dp, int(capacity), dp * int(multiple), recompute, max_num_seqs)
    if isinstance(profile, str):
        return _named_packing(profile, *args)
    return MegatronPacking.of(profile, tp=tp, pp=pp, cp=cp, dp=dp, capacity=int(capacity), multiple=dp * int(multiple),
                              recompute=recompute, max_num_seqs=max_num_seqs)


def schedule_packing(seqlens: Sequence[int], *, profile: Profile | str, tp: int, pp: int, cp: int, dp: int,
                     capacity: int, multiple: int = 1, recompute: str = "none",
                     max_num_seqs: int | None = None) -> Schedule:
    """sample_id_groups for Megatron's packing schedulers: [micro-batch][dp*cp rank] -> positions into `seqlens`
    (see `packing_target` for the settings)."""
    import numpy as np

    from hydraplan.solve.megatron.packing import schedule_packing as plan

    target = packing_target(profile, tp=tp, pp=pp, cp=cp, dp=dp, capacity=capacity, multiple=multiple,
                            recompute=recompute, max_num_seqs=max_num_seqs)
    return plan(np.asarray(seqlens, dtype=np.int64), target)


@functools.lru_cache(maxsize=32)
def _named_dynamic(profile: str, tp: int, dpcp: int, limit: int, min_cp_size: int, max_num_seqs: int | None,
                   vpp_group: int | None, recompute: str, padding: PackPadding | None) -> DynamicCP:
    return _dynamic(load(profile), tp, dpcp, limit, min_cp_size, max_num_seqs, vpp_group, recompute, padding)


def _dynamic(profile: Profile, tp: int, dpcp: int, limit: int, min_cp_size: int, max_num_seqs: int | None,
             vpp_group: int | None, recompute: str, padding: PackPadding | None) -> DynamicCP:
    from hydraplan.core.executors import DynamicCP, PackPadding

    return DynamicCP.of(profile, tp=tp, dpcp=dpcp, max_seqlen_per_rank=limit, min_cp_size=min_cp_size,
                        max_num_seqs=max_num_seqs, vpp_group=vpp_group, recompute=recompute,
                        padding=padding or PackPadding())


def dynamic_cp_target(profile: Profile | str, *, tp: int, dpcp: int, max_seqlen_per_rank: int, min_cp_size: int = 1,
                      max_num_seqs: int | None = None, vpp_group: int | None = None, recompute: str = "none",
                      padding: PackPadding | None = None) -> DynamicCP:
    """The dynamic-CP executor Megatron-LM dev runs with these settings (`--dynamic-context-parallel`), priced on
    `profile`; `padding`: what Megatron pads each pack with (None: no padding, Megatron's default)."""
    _check_recompute(recompute)
    args = (tp, dpcp, int(max_seqlen_per_rank), int(min_cp_size), max_num_seqs, vpp_group, recompute, padding)
    return _named_dynamic(profile, *args) if isinstance(profile, str) else _dynamic(profile, *args)


def schedule_dynamic_cp(seqlens: Sequence[int], *, profile: Profile | str, tp: int, dpcp: int, max_seqlen_per_rank: int,
                        min_cp_size: int = 1, max_num_seqs: int | None = None, vpp_group: int | None = None,
                        recompute: str = "none", padding: PackPadding | None = None) -> Schedule:
    """sample_id_groups for Megatron's dynamic CP: [micro-batch][DPxCP rank] -> positions into `seqlens`, in run
    order (`vpp_group`: microbatch_group_size_per_vp_stage with VPP, else None; see `dynamic_cp_target`)."""
    import numpy as np

    from hydraplan.solve.megatron.dynamic_cp import schedule_dynamic_cp as plan

    target = dynamic_cp_target(profile, tp=tp, dpcp=dpcp, max_seqlen_per_rank=max_seqlen_per_rank,
                               min_cp_size=min_cp_size, max_num_seqs=max_num_seqs, vpp_group=vpp_group,
                               recompute=recompute, padding=padding)
    return plan(np.asarray(seqlens, dtype=np.int64), target)
