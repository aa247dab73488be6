"""hydraplan's schedule for Megatron's dynamic-CP executor (core.executors.DynamicCP), priced on the profile.

For each micro-batch count M from the fewest the batch allows (a multiple of the VPP group), plans are filled
(solve.megatron.dcp_plan: ranks as columns of M slots, the sequences longest first each where it adds the fewest
rank-seconds within a level, so a long sequence takes the narrowest block that keeps the level and the short ones
balance the ranks) at levels searched by bisection between what no plan of M micro-batches beats and the fastest
plan found (or, when none fills at the floor, the plan with the fewest rank-seconds, at no level); the plans never
make a rank wait, so a plan's time is its highest load, which the executor confirms.
More micro-batches are tried while what they must add (the cheapest constant each) leaves room to gain. The fastest
plan is compared with Megatron's own schedule (solve.megatron.default_dynamic_cp), as the executor runs both, and
the faster taken, so the plugin is never slower on a batch than Megatron's scheduler, and returns Megatron's schedule
where its own search finds none (more micro-batches are tried then, up to SEARCH_MICROBATCHES past the fewest).

Pure and deterministic: a function of the lengths and the executor only (ties go to the lower index; no clock, no
randomness). Imports numpy and the core only, so it loads in a training process without the planner's solvers.
"""

from __future__ import annotations

import math

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.executors import (
    DynamicCP,
    DynamicCPSchedule,
    dynamic_cp_fewest_microbatches,
    dynamic_cp_lower_bound,
    dynamic_cp_time,
    dynamic_cp_violations,
)
from hydraplan.solve.megatron.dcp_plan import Batch, Plan, fill
from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule

EXTRA_MICROBATCHES = 2  # micro-batch counts tried past the fewest, at most, once a plan is found ...
SEARCH_MICROBATCHES = 8  # ... and while none is
LEVELS = 5  # fills per micro-batch count (the level bisected)


def schedule_dynamic_cp(lengths: np.ndarray, target: DynamicCP) -> DynamicCPSchedule:
    """sample_id_groups for Megatron's dynamic-CP executor: [micro-batch][DPxCP rank] -> positions into `lengths`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        raise UserError("dynamic CP: an empty global batch")
    fits = target.fits(lengths)
    if not fits.any(axis=0).all():
        worst = int(lengths[np.argmin(fits.any(axis=0))])
        raise UserError(f"dynamic CP: a sequence of {worst} tokens fits on no block of <{target.tp},1,k> up to "
                        f"{target.cps[-1]} ranks at {target.max_seqlen_per_rank} tokens per rank")
    theirs, their_s = None, math.inf
    try:
        theirs = default_dynamic_cp_schedule(lengths, dpcp=target.dpcp, max_seqlen_per_rank=target.max_seqlen_per_rank,
                                             min_cp_size=target.min_cp_size, vpp_group=target.vpp_group)
        if not dynamic_cp_violations(theirs, lengths, target):
            their_s = dynamic_cp_time(target, theirs, lengths)
    except UserError:  # Megatron's scheduler fails on this batch
        pass
    ours = _search(Batch(lengths, target))
    if ours is not None:
        sched = ours.lists()
        if dynamic_cp_time(target, sched, lengths) <= their_s:
            return sched
    if theirs is not None and their_s < math.inf:
        return theirs
    raise UserError(f"dynamic CP: {lengths.size} sequences cannot be scheduled on {target.dpcp} ranks of "
                    f"{target.max_seqlen_per_rank} tokens (too few sequences to give every rank a pack in every "
                    "micro-batch, or a sequence fits only sizes that do not tile the ranks)")


def _search(batch: Batch) -> Plan | None:
    """The fastest plan over micro-batch counts and levels."""
    t = batch.t
    if not batch.K or (batch.least >= batch.K).any():
        return None
    step = t.vpp_group or 1
    fewest = dynamic_cp_fewest_microbatches(t, batch.lengths)
    floor0 = dynamic_cp_lower_bound(t, batch.lengths)
    best: Plan | None = None
    for m in range(fewest, batch.n + 1, step):
        floor = floor0 + (m - fewest) * float(batch.c.min())  # each further micro-batch adds a constant to every rank
        if best is not None and (floor >= best.makespan or m > fewest + EXTRA_MICROBATCHES * step):
            break
        if best is None and m > fewest + SEARCH_MICROBATCHES * step:
            break
        lo, hi, level = floor, math.inf, floor
        for _ in range(LEVELS):
            plan = fill(batch, m, level)
            if plan is not None:
                if best is None or plan.makespan < best.makespan * (1 - 1e-12):
                    best = plan
                if plan.makespan <= level * (1 + 1e-12):
                    hi = level
                else:
                    lo, hi = max(lo, min(level, plan.makespan)), min(hi, plan.makespan)
            elif level == math.inf:
                break  # no plan of m micro-batches even with every place allowed
            else:
                lo = level
            if hi - lo <= 1e-3 * lo:
                break
            level = (lo + hi) / 2 if hi < math.inf else math.inf  # failing at the floor: the cheapest plan, any level
    return best
