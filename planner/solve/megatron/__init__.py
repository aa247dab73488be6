"""Schedules for Megatron-LM's variable-length executors (core.executors), each of Megatron's own schedulers
written from its behaviour beside hydraplan's schedule for the same executor:

- hybrid context parallelism: `balanced_cp` (Megatron's BalancedCPScheduler) and `hybrid_cp` (hydraplan's);
- sequence packing: `dp_balanced` (Megatron's DpBalancedScheduler) and `packing` (hydraplan's);
- dynamic context parallelism: `default_dynamic_cp` (Megatron's DefaultDynamicCPScheduler) and `dynamic_cp`
  (hydraplan's, filling `dcp_plan`'s plans), with `dcp_bound`, the executor's lower bound raised by integrality (a
  linear program: for the benches, not the training process).
"""
