"""Core-attention disaggregation (CAD; DistCA, arXiv 2510.18121) as a planned strategy on the canonical model.

Layout. One homogeneous cp = 1 scheme replicated d = N // gpus times. An iteration runs V steps; in step v
every replica (a "rank" below: the same stage of one replica, its TP group) runs one micro-batch. Step v's
documents are laid end to end and cut into d slices of equal tokens, so the linear part (b*l + c: GEMMs,
norms, MLP, TP collectives) is perfectly balanced and a long document may span several ranks ("pieces").
Core attention has no parameters, so it is cut into tasks: a query chunk [s, e) of a document with its
causal key prefix [0, e), costing a*(e^2 - s^2) (the scheme's a*l^2 term: the tasks of a document add up to
its a*l^2). A task may run on any rank of the step; its home is the rank holding its queries.

Bytes (per stage = layers/pp layers, bf16, MHA, q = 2*hidden/tp bytes per token per layer and TP rank).
Links are full duplex and both directions carry the same bytes, so one direction is counted:
- queries: a task of n = e - s queries run on x != home moves 2*n*q each way (Q and dO home -> x; O and
  dQ x -> home);
- keys/values: executor x reads, once per document, the K and V of the document's prefix up to the
  furthest end of its tasks there: 2*m_h*q from every replica h != x holding m_h of those tokens (dK, dV
  return the same bytes in backward). The runtime sends these rows (plus Q of prefix tokens it already
  sends as K/V rows: it ships [Q|K|V] rows, runtime/cad.py).
A rank's comm time is the sum of bytes/bw over the pairs it takes part in (bw: the profile's `network`,
intra-node when both replicas' GPUs share a node under contiguous placement, else inter-node).

Time. Ping-pong (two nano-batches, one's transfers under the other's compute) hides communication behind
compute, so a rank's step time is max(compute, comm) with compute = b*tokens + c + a*sum(e^2 - s^2) over
the tasks it executes; exposed = max(0, comm - compute). Every layer's exchange is an all_to_all of all d
ranks, so a step takes its slowest rank's time; steps form a 1F1B pipeline:
    CAD estimate = sum_v t_v + (pp - 1) * max_v t_v,   t_v = max_r max(compute_{v,r}, comm_{v,r}).
`estimate` recomputes it from the plan's `cad` section (hydraplan validate does).

Assignment (per step). DistCA's communication-aware greedy moves attention from the slowest rank to the
fastest, preferring tasks with the most FLOPs per byte moved and cutting shards of a fixed size. Here:
(1) the greedy cuts a task at the exact query position that equalizes the two ranks (solving
a*(e^2 - x^2) = gap; the tail of a causal chunk carries the most FLOPs per byte); (2) then an exact MILP
(HiGHS, K/V de-duplication modelled exactly) re-assigns the resulting tasks, minimizing the slowest rank's
max(compute, comm) under the communication budget, warm-started from the greedy plan (kept whenever the
MILP does not improve it), for steps of at most MILP_MAX_VARS variables (the greedy alone beyond).

Modules: model (bytes, bandwidths, task costs), step (the layout of a step and its assignment problem),
balance_greedy and balance_milp (the two assignment steps), plan (a batch's CAD plan and the best over schemes
and step counts), recompute (`estimate`). The plan file is built in engine/cad_plan.py, compare's adapters
live in methods/cad.py.
"""

from hydraplan.solve.cad.balance_greedy import greedy
from hydraplan.solve.cad.balance_milp import milp
from hydraplan.solve.cad.model import CommModel, comm_model, prefix_tokens, task_comm, task_cost
from hydraplan.solve.cad.plan import CADResult, best_cad, ideal_bound, plan_cad, solve_step
from hydraplan.solve.cad.recompute import estimate
from hydraplan.solve.cad.step import StepProblem, assign_steps, cut_step, step_problem, step_time

__all__ = ["CADResult", "CommModel", "StepProblem", "assign_steps", "best_cad", "comm_model", "cut_step", "estimate",
           "greedy", "ideal_bound", "milp", "plan_cad", "prefix_tokens", "solve_step", "step_problem", "step_time",
           "task_comm", "task_cost"]
