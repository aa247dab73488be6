"""The classes `install` puts into Megatron: each subclasses the scheduler it replaces, so Megatron constructs it
with whatever arguments its version passes (dev's `max_num_seqs` and `min_cp_size`, and any it adds later), its
`run` pipeline stays Megatron's, and Megatron's own `get_groups_and_subsamples` is the fallback.

- `drop_in`: hybrid CP's `BalancedCPScheduler` (megatron-core 0.17-0.19, Megatron-LM main);
- `packing_drop_in`: `DpBalancedScheduler` (Megatron-LM main and dev);
- `dynamic_cp_drop_in`: `DefaultDynamicCPScheduler` (Megatron-LM dev).

TP, PP and the recompute mode come from Megatron's config, DP, CP and the limits from the scheduler's own fields,
the cost model from the hydraplan profile. Every schedule passes its executor's rule checker before Megatron gets
it; one that does not, or a batch hydraplan cannot schedule, goes to Megatron's scheduler (guard.Guard).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hydraplan.core.errors import UserError
from hydraplan.integrations.megatron.guard import Guard, Schedule
from hydraplan.integrations.megatron.schedules import (
    dynamic_cp_target,
    hybrid_cp_target,
    load,
    packing_target,
)

if TYPE_CHECKING:
    from hydraplan.core.executors import PackPadding
    from hydraplan.core.schema import Profile


def config_recompute(config: Any) -> str:
    """hydraplan's recompute mode of Megatron's `recompute_granularity`."""
    from hydraplan.core.executors import RECOMPUTE_OF_GRANULARITY

    granularity = getattr(config, "recompute_granularity", None)
    if granularity not in RECOMPUTE_OF_GRANULARITY:
        raise UserError(f"recompute_granularity {granularity!r} of Megatron's config has no hydraplan recompute mode")
    return RECOMPUTE_OF_GRANULARITY[granularity]


def config_padding(config: Any) -> PackPadding:
    """What Megatron pads a packed micro-batch with, from its config (dev's get_thd_padding_kwargs and
    resolve_thd_tail_padding_policy): `pad_packed_seq_alignment` (None, "max" or a multiple), "max" whenever CUDA
    graphs capture the step, and `thd_tail_padding_policy` (unset: append_dummy_seq)."""
    from hydraplan.core.executors import PackPadding

    alignment = getattr(config, "pad_packed_seq_alignment", None)
    if alignment is not None and getattr(config, "cuda_graph_impl", "none") not in (None, "none"):
        alignment = "max"
    alignment = alignment if alignment in (None, "max") else int(alignment)
    return PackPadding(alignment, getattr(config, "thd_tail_padding_policy", None) or "append_dummy_seq")


def _need_config(config: Any) -> Any:
    if config is None:
        raise UserError("hydraplan's scheduler needs Megatron's config, which run(...) passes (as wrap_data_iterator "
                        "calls it)")
    return config


def _checked(solve: Callable[[Any, Any], Schedule], violations: Callable[[Schedule, Any], list[str]]
             ) -> Callable[[list[int], Any], Schedule]:
    """(lengths, target) -> the batch's schedule, refused (an exception: Megatron's scheduler takes the batch) when
    the executor's rule checker finds a problem in it."""
    import numpy as np

    def run(lengths: list[int], target: Any) -> Schedule:
        schedule = solve(np.asarray(lengths, dtype=np.int64), target)
        problems = violations(schedule, target)
        if problems:
            raise RuntimeError(f"hydraplan's schedule breaks the executor's rules ({problems[0]})")
        return schedule

    return run


def _where(profile: Profile, gpus: int) -> str:
    return f"{gpus} GPUs of profile {profile.name}"


# -------------------------------------------------------------------------------------------- hybrid CP
def drop_in(profile: Profile | str, base: Any, *, every: int | None = None) -> type:
    """A subclass of Megatron's BalancedCPScheduler (`base`) scheduling with `profile`: same constructor, same
    `get_groups_and_subsamples(sample_id_seqlens, config) -> (groups, sample_id_groups)`."""
    prof = load(profile)
    signature = inspect.signature(base.__init__)

    class HydraplanCPScheduler(base):
        """Megatron's BalancedCPScheduler, hydraplan's schedule."""

        hydraplan_base = base

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            try:
                given = signature.bind(self, *args, **kwargs).arguments
            except TypeError:
                given = {}
            self.hydraplan_limit = int(given.get("max_seq_len_per_rank", getattr(self, "max_seq_len_per_rank", 0)))
            self.hydraplan_group = given.get("dp_cp_group")
            self.hydraplan_guard = Guard("hybrid CP", "BalancedCPScheduler", every)

        def get_groups_and_subsamples(self, sample_id_seqlens, config, *args: Any, **kwargs: Any):
            from hydraplan.core.executors import hybrid_cp_violations
            from hydraplan.solve.megatron.hybrid_cp import schedule_hybrid_cp

            ids = [int(sid) for sid, _ in sample_id_seqlens]
            lengths = [int(l) for _, l in sample_id_seqlens]
            plan = _checked(schedule_hybrid_cp,
                            lambda s, t: hybrid_cp_violations(s, lengths, t.dpcp, t.max_seqlen_per_rank))

            def build():
                dpcp = int(self.hydraplan_group.size()) if self.hydraplan_group is not None else self.total_hdp_gpus
                return hybrid_cp_target(prof, tp=int(_need_config(config).tensor_model_parallel_size), dpcp=dpcp,
                                        max_seqlen_per_rank=self.hydraplan_limit, recompute=config_recompute(config))

            def about(t):
                warn = [f"max_seqlen_per_dp_cp_rank {t.max_seqlen_per_rank} is above MaxLen of <{t.tp},1,1> "
                        f"({t.max_lens[0]}) in {_where(prof, t.tp * t.dpcp)}: hydraplan keeps every rank within its "
                        f"MaxLen, Megatron's own scheduler would not"] if t.max_seqlen_per_rank > t.max_lens[0] else []
                return (f"scheduling {t.dpcp} DPxCP ranks at TP {t.tp} (recompute {t.recompute}, "
                        f"max_seqlen_per_dp_cp_rank {t.max_seqlen_per_rank}) with profile {prof.name}", warn)

            def to_groups(rounds: Schedule):
                return ([[[lengths[i] for i in rank] for rank in rnd] for rnd in rounds],
                        [[[ids[i] for i in rank] for rank in rnd] for rnd in rounds])

            return self.hydraplan_guard.schedule(
                build, lambda t: plan(lengths, t),
                lambda: base.get_groups_and_subsamples(self, sample_id_seqlens, config, *args, **kwargs),
                about=about, group=self.hydraplan_group, to_groups=to_groups)

    return HydraplanCPScheduler


# -------------------------------------------------------------------------------------------- packing seams
class _RunKeepsConfig:
    """`run` as Megatron's, keeping the config and the DPxCP group it is given for get_groups_and_subsamples."""

    hydraplan_config: Any = None
    hydraplan_group: Any = None

    def run(self, data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config,
            *args: Any, **kwargs: Any):
        self.hydraplan_config, self.hydraplan_group = config, dp_cp_group
        return super().run(data_iterator, num_microbatches, dp_group, tp_group, pp_group,  # type: ignore[misc]  # Megatron's scheduler, mixed in after, has run
                           dp_cp_group, dev, config, *args, **kwargs)


def packing_drop_in(profile: Profile | str, base: Any, *, every: int | None = None) -> type:
    """A subclass of Megatron's DpBalancedScheduler (`base`) whose `get_groups_and_subsamples` returns hydraplan's
    packs (at most `max_num_seqs` documents each, where Megatron sets it), positions into the batch as
    dp_balanced's are."""
    prof = load(profile)

    class HydraplanPackingScheduler(_RunKeepsConfig, base):
        """DpBalancedScheduler's run, hydraplan's packs."""

        hydraplan_base = base
        hydraplan_guard: Guard | None = None

        def get_groups_and_subsamples(self, sample_id_seqlens, *args: Any, **kwargs: Any):
            from hydraplan.core.executors import packing_violations
            from hydraplan.solve.megatron.packing import schedule_packing

            if self.hydraplan_guard is None:
                self.hydraplan_guard = Guard("dp_balanced", "dp_balanced", every)
            lengths = [int(l) for _, l in sample_id_seqlens]
            plan = _checked(schedule_packing, lambda s, t: packing_violations(s, lengths, t.dp, t.scheme.cp, t.capacity,
                                                                              t.multiple, t.max_num_seqs))
            cap = getattr(self, "max_num_seqs", None)

            def build():
                c = _need_config(self.hydraplan_config)
                return packing_target(prof, tp=int(c.tensor_model_parallel_size), pp=int(c.pipeline_model_parallel_size),
                                      cp=int(self.cp_size), dp=int(self.dp_size),
                                      capacity=int(self.max_seqlen_per_dp_cp_rank) * int(self.cp_size),
                                      multiple=int(self.microbatch_group_size_per_vp_stage or 1),
                                      recompute=config_recompute(c), max_num_seqs=cap)

            def about(t):
                s = t.scheme
                warn = [f"a pack of max_seqlen_per_dp_cp_rank x cp = {t.capacity} tokens is above MaxLen of "
                        f"{s.label} ({s.max_len}) in {_where(prof, s.gpus * t.dp)}: packs that long may run out of "
                        "memory"] if t.capacity > s.max_len else []
                most = f", at most {cap} documents a pack" if cap else ""
                return (f"packing for {s.label} x {t.dp} replicas (packs of {t.capacity} tokens{most}) with profile "
                        f"{prof.name}", warn)

            return self.hydraplan_guard.schedule(
                build, lambda t: plan(lengths, t),
                lambda: base.get_groups_and_subsamples(self, sample_id_seqlens, *args, **kwargs),
                about=about, group=self.hydraplan_group)

    return HydraplanPackingScheduler


def dynamic_cp_drop_in(profile: Profile | str, base: Any, *, every: int | None = None) -> type:
    """A subclass of Megatron's DefaultDynamicCPScheduler (`base`) whose `get_groups_and_subsamples` returns
    hydraplan's dynamic-CP schedule: [micro-batch][DPxCP rank] -> sample ids, honouring `min_cp_size`,
    `max_num_seqs` and the VPP group as Megatron constructed it."""
    prof = load(profile)

    class HydraplanDynamicCPScheduler(_RunKeepsConfig, base):
        """DefaultDynamicCPScheduler's run, hydraplan's micro-batches."""

        hydraplan_base = base
        hydraplan_guard: Guard | None = None

        def get_groups_and_subsamples(self, sample_id_seqlens, *args: Any, **kwargs: Any):
            from hydraplan.core.executors import dynamic_cp_violations
            from hydraplan.solve.megatron.dynamic_cp import schedule_dynamic_cp

            if self.hydraplan_guard is None:
                self.hydraplan_guard = Guard("dynamic CP", "default_dynamic_cp", every)
            ids = [int(sid) for sid, _ in sample_id_seqlens]
            lengths = [int(l) for _, l in sample_id_seqlens]
            plan = _checked(schedule_dynamic_cp, lambda s, t: dynamic_cp_violations(s, lengths, t))

            def build():
                c = _need_config(self.hydraplan_config)
                if int(getattr(c, "pipeline_model_parallel_size", 1) or 1) > 1:
                    raise UserError(f"pipeline_model_parallel_size {c.pipeline_model_parallel_size}: hydraplan prices "
                                    "dynamic CP without pipeline parallelism")
                return dynamic_cp_target(prof, tp=int(c.tensor_model_parallel_size),
                                         dpcp=int(self.dp_size) * int(self.cp_size),
                                         max_seqlen_per_rank=int(self.max_seqlen_per_dp_cp_rank),
                                         min_cp_size=int(getattr(self, "min_cp_size", 1)),
                                         max_num_seqs=getattr(self, "max_num_seqs", None),
                                         vpp_group=self.microbatch_group_size_per_vp_stage,
                                         recompute=config_recompute(c), padding=config_padding(c))

            def about(t):
                one = t.max_lens[0] if t.cps[0] == 1 else None
                warn = [f"max_seqlen_per_dp_cp_rank {t.max_seqlen_per_rank} is above MaxLen of <{t.tp},1,1> ({one}) "
                        f"in {_where(prof, t.tp * t.dpcp)}: hydraplan keeps every pack within its MaxLen, Megatron's "
                        "own scheduler would not"] if one is not None and t.max_seqlen_per_rank > one else []
                cap = f", at most {t.max_num_seqs} sequences a pack" if t.max_num_seqs else ""
                pad = f", packs padded to {t.padding.alignment} ({t.padding.tail})" if t.padding.alignment else ""
                return (f"scheduling {t.dpcp} DPxCP ranks at TP {t.tp} in blocks of {', '.join(map(str, t.sizes))} "
                        f"(recompute {t.recompute}, max_seqlen_per_dp_cp_rank {t.max_seqlen_per_rank}{cap}{pad}) with "
                        f"profile {prof.name}", warn)

            return self.hydraplan_guard.schedule(
                build, lambda t: plan(lengths, t),
                lambda: base.get_groups_and_subsamples(self, sample_id_seqlens, *args, **kwargs),
                about=about, group=self.hydraplan_group,
                to_groups=lambda mbs: [[[ids[i] for i in rank] for rank in mb] for mb in mbs])

    return HydraplanDynamicCPScheduler
