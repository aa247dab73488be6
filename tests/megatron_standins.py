"""Stand-ins of Megatron's megatron.core.datasets.data_schedule as three versions have it, for `install` and its
drop-ins: the interface each Megatron calls (class names, map keys, constructor arguments, `run`'s arguments) as
read in its code, and the schedule each scheduler returns taken from hydraplan's own versions of them (written
from their behaviour, solve/megatron/), so a drop-in's fallback is recognizable. Nothing of Megatron is copied.

- `release()`: megatron-core 0.17-0.19: `BalancedCPScheduler(max_seq_len_per_rank, dp_cp_group)` built by
  `HybridCPDataLoaderWrapper`, no `scheduler_map`;
- `main()`: Megatron-LM main (d98e8a64dd): the above, plus `scheduler_map` keyed by `PackingSchedulerEnum`, the
  packing schedulers built with four arguments;
- `dev()`: Megatron-LM dev (d48bd6be0a): a string-keyed map of `dp_balanced` and `default_dynamic_cp`
  (`DefaultDynamicCPScheduler` subclassing `DpBalancedScheduler`), built by `wrap_data_iterator` with
  `max_num_seqs=` (and `min_cp_size=` for dynamic CP); a pack of more sequences than thd_max_packed_sequences fails
  dev's assertion.
"""

from __future__ import annotations

import enum
import types
from typing import Any

MODULE = "megatron.core.datasets.data_schedule"
PARENTS = ("megatron", "megatron.core", "megatron.core.datasets")


class Group:
    """A process group as the schedulers see it: its size (and rank 0)."""

    def __init__(self, n: int):
        self.n = n

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return 0


class BalancedCPScheduler:
    def __init__(self, max_seq_len_per_rank: int, dp_cp_group):
        self.max_seq_len_per_rank = max_seq_len_per_rank
        self.total_hdp_gpus = dp_cp_group.size()

    def get_groups_and_subsamples(self, sample_id_seqlens, config):
        from hydraplan.solve.megatron.balanced_cp import balanced_cp_schedule

        ids = [sid for sid, _ in sample_id_seqlens]
        rounds = balanced_cp_schedule([l for _, l in sample_id_seqlens], self.max_seq_len_per_rank, self.total_hdp_gpus)
        return ([[[sample_id_seqlens[i][1] for i in r] for r in rnd] for rnd in rounds],
                [[[ids[i] for i in r] for r in rnd] for rnd in rounds])


class HybridCPDataLoaderWrapper:
    """Builds the scheduler as Megatron's wrapper does (by keyword), schedules one list of (id, length)."""

    def __init__(self, config, dp_cp_group):
        self.config = config
        self.scheduler = BalancedCPScheduler(max_seq_len_per_rank=config.max_seqlen_per_dp_cp_rank,
                                             dp_cp_group=dp_cp_group)

    def schedule(self, sample_id_seqlens):
        return self.scheduler.get_groups_and_subsamples(sample_id_seqlens, self.config)


class MainPackingScheduler:
    """main's BasePackingScheduler: four constructor arguments."""

    def __init__(self, max_seqlen_per_dp_cp_rank, cp_size, dp_size, microbatch_group_size_per_vp_stage):
        self.max_seqlen_per_dp_cp_rank = max_seqlen_per_dp_cp_rank
        self.cp_size, self.dp_size = cp_size, dp_size
        self.microbatch_group_size_per_vp_stage = microbatch_group_size_per_vp_stage

    def run(self, data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config):
        groups = self.get_groups_and_subsamples(list(data_iterator))
        return groups, len(groups), None, None


class MainDpBalanced(MainPackingScheduler):
    def get_groups_and_subsamples(self, sample_id_seqlens):
        from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule

        return dp_balanced_schedule([l for _, l in sample_id_seqlens], self.max_seqlen_per_dp_cp_rank * self.cp_size,
                                    self.dp_size, self.cp_size, self.microbatch_group_size_per_vp_stage)


class DevPackingScheduler:
    """dev's BasePackingScheduler: `max_num_seqs` too; `run` schedules and then holds every rank's list to
    thd_max_packed_sequences, as dev's THD padding asserts."""

    is_dynamic_cp = False

    def __init__(self, max_seqlen_per_dp_cp_rank, cp_size, dp_size, microbatch_group_size_per_vp_stage,
                 max_num_seqs=None):
        self.max_seqlen_per_dp_cp_rank = max_seqlen_per_dp_cp_rank
        self.cp_size, self.dp_size = cp_size, dp_size
        self.microbatch_group_size_per_vp_stage = microbatch_group_size_per_vp_stage
        self.max_num_seqs = max_num_seqs

    def run(self, data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config):
        groups = self.get_groups_and_subsamples(list(data_iterator))
        cap = getattr(config, "thd_max_packed_sequences", None)
        for mb in groups:
            for rank in mb:
                assert cap is None or len(rank) <= cap, f"Actual num_seqs ({len(rank)}) exceeds " \
                                                        f"thd_max_packed_sequences ({cap})"
        return groups, len(groups), None, None


class DevDpBalanced(DevPackingScheduler):
    def get_groups_and_subsamples(self, sample_id_seqlens):
        from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule

        return dp_balanced_schedule([l for _, l in sample_id_seqlens], self.max_seqlen_per_dp_cp_rank * self.cp_size,
                                    self.dp_size, self.cp_size, self.microbatch_group_size_per_vp_stage,
                                    max_num_seqs=self.max_num_seqs)


class DevDefaultDynamicCP(DevDpBalanced):
    is_dynamic_cp = True

    def __init__(self, *args, min_cp_size=1, **kwargs):
        super().__init__(*args, **kwargs)
        self.min_cp_size = min_cp_size

    def get_groups_and_subsamples(self, sample_id_seqlens):
        from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule

        ids = [sid for sid, _ in sample_id_seqlens]
        groups = default_dynamic_cp_schedule([l for _, l in sample_id_seqlens], dpcp=self.dp_size * self.cp_size,
                                             max_seqlen_per_rank=self.max_seqlen_per_dp_cp_rank,
                                             min_cp_size=self.min_cp_size, max_num_seqs=self.max_num_seqs,
                                             vpp_group=self.microbatch_group_size_per_vp_stage)
        return [[[ids[i] for i in rank] for rank in mb] for mb in groups]


class PackingSchedulerEnum(enum.Enum):
    DP_BALANCED = "dp_balanced"


def _module(**names: Any) -> types.ModuleType:
    mod = types.ModuleType(MODULE)
    mod.__dict__.update(names)
    return mod


def release() -> types.ModuleType:
    return _module(BalancedCPScheduler=BalancedCPScheduler, HybridCPDataLoaderWrapper=HybridCPDataLoaderWrapper)


def main() -> types.ModuleType:
    mod = _module(BalancedCPScheduler=BalancedCPScheduler, HybridCPDataLoaderWrapper=HybridCPDataLoaderWrapper,
                  PackingSchedulerEnum=PackingSchedulerEnum, DpBalancedScheduler=MainDpBalanced,
                  scheduler_map={PackingSchedulerEnum.DP_BALANCED: MainDpBalanced})

    def wrap_data_iterator(data_iterator, config, num_microbatches, dp=1, cp=1):
        cls = mod.scheduler_map[PackingSchedulerEnum[config.sequence_packing_scheduler.upper()]]
        vpp = None if config.virtual_pipeline_model_parallel_size is None else config.microbatch_group_size_per_vp_stage
        sched = cls(config.max_seqlen_per_dp_cp_rank, cp, dp, vpp)
        return sched.run(data_iterator, num_microbatches, Group(dp), Group(1), Group(1), Group(dp * cp), None, config)

    mod.wrap_data_iterator = wrap_data_iterator
    return mod


def dev() -> types.ModuleType:
    mod = _module(BalancedCPScheduler=BalancedCPScheduler, HybridCPDataLoaderWrapper=HybridCPDataLoaderWrapper,
                  DpBalancedScheduler=DevDpBalanced, DefaultDynamicCPScheduler=DevDefaultDynamicCP,
                  scheduler_map={"dp_balanced": DevDpBalanced, "default_dynamic_cp": DevDefaultDynamicCP})

    def wrap_data_iterator(data_iterator, config, num_microbatches, dp=1, cp=1):
        name = config.sequence_packing_scheduler
        kwargs = {"min_cp_size": config.min_dynamic_context_parallel_size} if name == "default_dynamic_cp" else {}
        cap = getattr(config, "thd_max_packed_sequences", None)
        if (name == "dp_balanced" and cap is not None and getattr(config, "pad_packed_seq_alignment", None) is not None
                and (getattr(config, "thd_tail_padding_policy", None) or "append_dummy_seq") == "append_dummy_seq"):
            cap -= 1  # one slot for the dummy sequence that covers the padding tail
        vpp = None if config.virtual_pipeline_model_parallel_size is None else config.microbatch_group_size_per_vp_stage
        sched = mod.scheduler_map[name](config.max_seqlen_per_dp_cp_rank, cp, dp, vpp, max_num_seqs=cap, **kwargs)
        return sched.run(data_iterator, num_microbatches, Group(dp), Group(1), Group(1), Group(dp * cp), None, config)

    mod.wrap_data_iterator = wrap_data_iterator
    return mod


def config(**overrides: Any) -> types.SimpleNamespace:
    """A Megatron config with the fields the schedulers read (TP 1, PP 1, no recompute, no VPP, no padding)."""
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, recompute_granularity=None,
                virtual_pipeline_model_parallel_size=None, microbatch_group_size_per_vp_stage=None,
                max_seqlen_per_dp_cp_rank=8192, sequence_packing_scheduler=None, min_dynamic_context_parallel_size=1,
                thd_max_packed_sequences=None, pad_packed_seq_alignment=None, thd_tail_padding_policy=None)
    base.update(overrides)
    return types.SimpleNamespace(**base)


def put(monkeypatch, mod: types.ModuleType) -> types.ModuleType:
    """`mod` as Megatron's data_schedule for this test (its parent packages as empty stand-ins)."""
    import sys

    for name in PARENTS:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, MODULE, mod)
    return mod
