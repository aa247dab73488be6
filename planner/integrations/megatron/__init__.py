"""hydraplan inside Megatron-LM: drop-ins for Megatron's variable-length scheduler seams, and the plain functions
behind them.

    from hydraplan.integrations.megatron import install
    install("h100-llama2-7b")   # before pretrain(...): one line says which seams hydraplan now schedules

- hybrid context parallelism (`--hybrid-context-parallel`, megatron-core 0.17-0.19 and Megatron-LM main): hybrid
  CP's `BalancedCPScheduler`, planned by hydraplan.solve.megatron.hybrid_cp on the profile's <tp,1,cp> schemes;
- sequence packing (`--sequence-packing-scheduler dp_balanced`, Megatron-LM main and dev): `DpBalancedScheduler`,
  planned by hydraplan.solve.megatron.packing on <tp,pp,cp>;
- dynamic context parallelism (`--dynamic-context-parallel`, Megatron-LM dev): `DefaultDynamicCPScheduler`,
  planned by hydraplan.solve.megatron.dynamic_cp on <tp,1,cp>.

`install` (install.py) reads which seams this Megatron has; the drop-ins (dropins.py) subclass Megatron's
schedulers, the guard (guard.py) checks the settings at the first call and hands a batch hydraplan cannot
schedule to Megatron's own scheduler; `schedule_hybrid_cp`, `schedule_packing` and `schedule_dynamic_cp`
(schedules.py) are what other tools call. Importing this package loads neither Megatron nor the planner's
solvers: they load at `install` and at the first schedule.
"""

from hydraplan.integrations.megatron.dropins import drop_in, dynamic_cp_drop_in, packing_drop_in
from hydraplan.integrations.megatron.install import DATA_SCHEDULE, SEAMS, install, seams_of
from hydraplan.integrations.megatron.schedules import (
    dynamic_cp_target,
    hybrid_cp_target,
    packing_target,
    schedule_dynamic_cp,
    schedule_hybrid_cp,
    schedule_packing,
)

__all__ = ["DATA_SCHEDULE", "SEAMS", "drop_in", "dynamic_cp_drop_in", "dynamic_cp_target", "hybrid_cp_target", "install",
           "packing_drop_in", "packing_target", "schedule_dynamic_cp", "schedule_hybrid_cp", "schedule_packing",
           "seams_of"]
