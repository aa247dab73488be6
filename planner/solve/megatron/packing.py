"""hydraplan's schedule for Megatron's sequence-packing executor (core.executors.MegatronPacking): documents
dispatched to the DP replicas by hydraplan's dispatch (Eq. 3 on the layout's scheme, packs no longer than the
capacity), then each replica's documents packed into the same number V of micro-batches by Eq. (1) (hydraplan's
packing for a fixed V), V a multiple of the VPP group and tried from the fewest packs that hold every replica's
documents up, until two in a row do not improve the canonical estimate (sum + (pp-1) max). With `max_num_seqs`, V
starts at the fewest packs that hold every replica's documents at that many per pack, and a pack holding more hands
its shortest documents to the fastest packs with room. When dp_balanced's own packs would run the batch faster (or
when the replicas cannot all fill V packs), its schedule is taken instead, so the plugin is never slower than
Megatron's scheduler on a batch.

Pure and deterministic: the dispatch's trials are seeded with 0, the packing runs its greedy only (no solver
time limit), so every rank computes the same schedule.
"""

from __future__ import annotations

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.executors import MegatronPacking, PackingSchedule
from hydraplan.core.schema import Scheme
from hydraplan.solve.dispatch import dispatch
from hydraplan.solve.ffd import first_fit_bins
from hydraplan.solve.megatron.dp_balanced import deal, dp_balanced_schedule
from hydraplan.solve.packing import pack_fixed_v

V_STEPS = 8  # micro-batch counts tried past the fewest that hold every replica's documents


def schedule_packing(lengths: np.ndarray, target: MegatronPacking) -> PackingSchedule:
    """sample_id_groups for Megatron's packing executor: [micro-batch][dp*cp rank] -> positions into `lengths`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    dp, cp, group, cap = target.dp, target.scheme.cp, target.multiple // target.dp, target.max_num_seqs
    best: PackingSchedule | None
    try:
        best = dp_balanced_schedule(lengths.tolist(), target.capacity, dp, cp, group, cap)
        best_s = max(target.propagation_s(best, lengths))
    except UserError:  # dp_balanced cannot fill the pack count (Megatron's own assertion fails)
        best, best_s = None, np.inf
    scheme = target.scheme.model_copy(update={"max_len": target.capacity})
    assign = dispatch(lengths, [scheme] * dp, seed=0).assign
    docs = [np.flatnonzero(assign == d) for d in range(dp)]
    fewest = max(max(int(first_fit_bins(np.sort(lengths[d])[::-1], target.capacity).max()) + 1 if d.size else 1,
                     -(-d.size // cap) if cap else 1) for d in docs)
    most = min(d.size for d in docs)  # every pack holds a document
    v = -(-fewest // group) * group
    misses = 0
    for _ in range(V_STEPS):
        if v > most:
            break
        tried = [pack_fixed_v(lengths[d], scheme, v, time_limit_s=0.0) for d in docs]
        capped = [p.micro_batches if cap is None else _within_count(p.micro_batches, lengths[d], cap, scheme)
                  for p, d in zip(tried, docs, strict=True) if p is not None and len(p.micro_batches) == v]
        packs = [p for p in capped if p is not None]
        if len(packs) < len(tried):
            v += group
            continue
        ours = deal([d[mb].tolist() for i in range(v) for d, p in zip(docs, packs, strict=True)
                     for mb in [p[i]]], dp, cp)
        s = max(target.propagation_s(ours, lengths))
        if s < best_s * (1 - 1e-12):
            best, best_s, misses = ours, s, 0
        else:
            misses += 1
        if target.scheme.pp == 1 or misses > 1:  # pp 1: one more micro-batch only adds its constant
            break
        v += group
    if best is None:
        raise UserError(f"packing: {lengths.size} documents cannot fill {group} micro-batches on each of {dp} replicas")
    return best


def _within_count(packs: list[np.ndarray], lengths: np.ndarray, cap: int, scheme: Scheme) -> list[np.ndarray] | None:
    """The packs with at most `cap` documents each: a pack holding more hands its shortest documents, one at a time,
    to the pack that stays fastest among those with room (count and tokens); None when none has room."""
    lists: list[list[int]] = [p[np.argsort(-lengths[p], kind="stable")].tolist() for p in packs]
    tokens = np.array([int(lengths[p].sum()) for p in lists])
    secs = np.array([float(((scheme.time.a * lengths[p] + scheme.time.b) * lengths[p]).sum()) for p in lists])
    for i in range(len(lists)):
        while len(lists[i]) > cap:
            j = lists[i][-1]
            l = int(lengths[j])
            t = (scheme.time.a * l + scheme.time.b) * l
            room = [k for k in range(len(lists)) if len(lists[k]) < cap and tokens[k] + l <= scheme.max_len]
            if not room:
                return None
            k = min(room, key=lambda k: (secs[k], k))
            lists[i].pop()
            lists[k].append(j)
            tokens[i] -= l
            tokens[k] += l
            secs[i] -= t
            secs[k] += t
    return [np.asarray(p, dtype=np.int64) for p in lists]
