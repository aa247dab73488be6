"""LNK pull/push planning against slicing full tensors (pure), plus one small gloo run of the real comms."""

from __future__ import annotations

import math

import lnk_reference
import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers import free_port, init_gloo
from ranks import spawn

from hydraplan.runtime import lnk, lnk_streams
from hydraplan.runtime.groups import exit_process
from hydraplan.runtime.lnk import Role, plan_link


# ------------------------------------------------------------------------------------------ fixtures
def make_params(rng, count: int, row_multiple: int) -> tuple[np.ndarray, np.ndarray]:
    """Random numels (rows a multiple of every TP degree, like real dim-0 sharding) and sharded flags."""
    rows = rng.integers(1, 6, count) * row_multiple
    cols = rng.integers(1, 7, count)
    return (rows * cols).astype(np.int64), rng.random(count) < 0.7


def random_strategy(rng, world: int, n_params: int, tps: list[int],
                    cps: tuple[int, ...] = (1,)) -> tuple[list[Role | None], list[list[list[list[int]]]]]:
    """Pipelines of random <tp, pp, cp> over a random subset of ranks: roles per rank, and per pipeline per
    stage the ranks of each CP replica by TP rank -- each pipeline holds every parameter in exactly one
    stage (contiguous blocks, like layers); a stage's CP replicas hold the same slices as its TP ranks."""
    ranks = list(rng.permutation(world))
    roles: list[Role | None] = [None] * world
    pipelines = []
    while ranks:
        tp, cp = map(int, rng.choice([(t, c) for t in tps for c in cps if t * c <= len(ranks)]))
        pp = int(rng.integers(1, min(3, len(ranks) // (tp * cp), n_params) + 1))
        if rng.random() < 0.15:  # leave the rest idle
            break
        cut = np.sort(rng.choice(np.arange(1, n_params), pp - 1, replace=False)) if pp > 1 else np.array([], int)
        blocks = np.split(np.arange(n_params), cut)
        stages = []
        for s in range(pp):
            replicas = [[int(ranks.pop()) for _ in range(tp)] for _ in range(cp)]
            for group in replicas:
                for t, r in enumerate(group):
                    roles[r] = Role(tuple(int(p) for p in blocks[s]), tp, t)
            stages.append(replicas)
        pipelines.append(stages)
    return roles, pipelines


def expected_local(full: list[np.ndarray], sharded: np.ndarray, role: Role | None) -> np.ndarray:
    if role is None:
        return np.zeros(0)
    parts = [np.split(full[p], role.tp)[role.tp_rank] if sharded[p] else full[p] for p in role.params]
    return np.concatenate(parts) if parts else np.zeros(0)


def pushed_gradients(rng, numels, sharded, roles, pipelines) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """What each rank pushes and the totals the owners must get: each CP replica of each pipeline has its own
    full gradient of the TP-sharded params (the partial sum over its tokens); of a replicated param each TP rank
    holds its own part (its tokens' SP rows)."""
    local = [np.zeros(0)] * len(roles)
    total = [np.zeros(n) for n in numels]
    for stages in pipelines:
        for c in range(len(stages[0])):
            g = [rng.standard_normal(n) for n in numels]
            total = [a + b if s else a for a, b, s in zip(total, g, sharded)]
            for replicas in stages:
                for r in replicas[c]:
                    mine = [b if s else rng.standard_normal(len(b)) for b, s in zip(g, sharded)]
                    for p in roles[r].params:
                        if not sharded[p]:
                            total[p] = total[p] + mine[p]
                    local[r] = expected_local(mine, sharded, roles[r])
    return local, total


def simulate(plans: list[lnk.LinkPlan], which: str, sources: list[np.ndarray], accumulate: bool) -> list[np.ndarray]:
    """Route every piece through an in-memory 'network' exactly as the comms would."""
    world = len(plans)
    inbox = {}
    for src, pl in enumerate(plans):
        ex, layout = getattr(pl, which), (pl.owned if which == "pull" else pl.local)
        starts = layout.starts(ex.send)
        for peer in range(world):
            m = ex.send.peer == peer
            inbox[src, peer] = [sources[src][a:a + n] for a, n in zip(starts[m], ex.send.size[m])]
    out = []
    for dst, pl in enumerate(plans):
        ex, layout = getattr(pl, which), (pl.local if which == "pull" else pl.owned)
        buf = np.zeros(layout.total)
        starts = layout.starts(ex.recv)
        for src in range(world):
            m = ex.recv.peer == src
            got = inbox[src, dst]
            assert [len(g) for g in got] == list(ex.recv.size[m]), "sender and receiver disagree on pieces"
            for a, g in zip(starts[m], got):
                if accumulate:
                    buf[a:a + len(g)] += g
                else:
                    buf[a:a + len(g)] = g
        out.append(buf)
    return out


def owner_shards(full: list[np.ndarray], world: int) -> list[np.ndarray]:
    return [np.concatenate([f[r * len(f) // world:(r + 1) * len(f) // world] for f in full]) for r in range(world)]


CASES = [(world, tps, seed) for world, tps in [(1, [1]), (2, [1, 2]), (3, [1, 3]), (4, [1, 2, 4]), (5, [1, 2]),
                                                (6, [1, 2, 3]), (8, [1, 2, 4, 8]), (12, [1, 2, 3, 4, 6])]
         for seed in range(4)]


# -------------------------------------------------------------------------------------------- pure
@pytest.mark.parametrize("cps", [(1,), (1, 2, 3)])
@pytest.mark.parametrize("world,tps,seed", CASES)
def test_pull_delivers_exactly_each_ranks_tp_slices(world, tps, seed, cps):
    rng = np.random.default_rng(seed * 100 + world)
    numels, sharded = make_params(rng, 7, math.lcm(*tps))
    full = [rng.standard_normal(n) for n in numels]
    roles, _ = random_strategy(rng, world, len(numels), tps, cps)
    plans = [plan_link(numels, sharded, roles, r) for r in range(world)]
    got = simulate(plans, "pull", owner_shards(full, world), accumulate=False)
    for r in range(world):
        np.testing.assert_array_equal(got[r], expected_local(full, sharded, roles[r]))


@pytest.mark.parametrize("cps", [(1,), (1, 2, 3)])
@pytest.mark.parametrize("world,tps,seed", CASES)
def test_push_sums_every_pipelines_gradient_once_at_the_owner(world, tps, seed, cps):
    rng = np.random.default_rng(seed * 100 + world + 7)
    numels, sharded = make_params(rng, 7, math.lcm(*tps))
    roles, pipelines = random_strategy(rng, world, len(numels), tps, cps)
    local, total = pushed_gradients(rng, numels, sharded, roles, pipelines)
    plans = [plan_link(numels, sharded, roles, r) for r in range(world)]
    got = simulate(plans, "push", local, accumulate=True)
    for r, want in enumerate(owner_shards(total, world)):
        np.testing.assert_allclose(got[r], want, rtol=0, atol=1e-12)


def run_groups(plans: list[lnk.LinkPlan], which: str, sources: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the compiled per-group exchanges (pack, an in-memory all_to_all_single, unpack) on every rank."""
    world = len(plans)
    outs = [torch.zeros((pl.local if which == "pull" else pl.owned).total, dtype=torch.float64) for pl in plans]
    for g in range(len(plans[0].group_params)):
        ges = [getattr(pl, f"{which}_groups")[g] for pl in plans]
        sends = [ge.pack(src[ge.src[0]:ge.src[1]], src.new_empty(ge.pack.total)).split(ge.send_splits)
                 for ge, src in zip(ges, sources)]
        for dst, ge in enumerate(ges):
            got = [sends[src][dst] for src in range(world)]
            assert [len(x) for x in got] == ge.recv_splits, "sender and receiver disagree on sizes"
            recv = torch.cat([*got, torch.zeros(ge.zero_tail, dtype=torch.float64)])
            out = outs[dst][ge.dst[0]:ge.dst[1]]
            for r in ge.rounds:
                out += r(recv, torch.empty_like(out))
            if ge.stacked is not None:  # contribution k is recv[start + k*n : start + (k+1)*n]: summed one by one
                (start, count), n = ge.stacked, out.numel()
                for k in range(count):
                    out += recv[start + k * n:start + (k + 1) * n]
    return outs


@pytest.mark.parametrize("cps", [(1,), (1, 2, 3)])
@pytest.mark.parametrize("world,tps,seed", CASES[::3])
def test_compiled_group_exchanges_pull_slices_and_push_sums(world, tps, seed, cps):
    """Per layer group, one coalesced buffer per peer: the same result as slicing (pull) and as summing every
    replica's gradient at the owner (push), for random group cuts."""
    rng = np.random.default_rng(seed * 100 + world + 3)
    numels, sharded = make_params(rng, 7, math.lcm(*tps))
    groups = np.sort(rng.integers(0, 4, len(numels)))
    full = [rng.standard_normal(n) for n in numels]
    roles, pipelines = random_strategy(rng, world, len(numels), tps, cps)
    plans = [plan_link(numels, sharded, roles, r, groups) for r in range(world)]
    got = run_groups(plans, "pull", [torch.from_numpy(x) for x in owner_shards(full, world)])
    for r in range(world):
        np.testing.assert_array_equal(got[r].numpy(), expected_local(full, sharded, roles[r]))
    local, total = pushed_gradients(rng, numels, sharded, roles, pipelines)
    got = run_groups(plans, "push", [torch.from_numpy(x) for x in local])
    for r, want in enumerate(owner_shards(total, world)):
        np.testing.assert_allclose(got[r].numpy(), want, rtol=0, atol=1e-12)


def test_gathers_copy_overlapping_ranges_in_order_with_gaps_per_batch():
    """Batch 0 cuts a 10-element source at overlapping ranges (one empty), batch 1 a 6-element one; batch 2
    copies nothing from 4 elements."""
    g0, g1, g2 = lnk._gathers(np.array([0, 0, 0, 0, 1, 1]), np.array([6, 2, 3, 0, 4, 0]), np.array([3, 4, 0, 1, 2, 3]),
                              np.array([10, 6, 4]))
    assert g0(torch.arange(10.0), torch.empty(g0.total)).tolist() == [6, 7, 8, 2, 3, 4, 5, 0]
    assert g1(torch.arange(6.0), torch.empty(g1.total)).tolist() == [4, 5, 0, 1, 2]
    assert (g2.seg_sizes.tolist(), g2.ids.tolist(), g2.total) == ([4], [], 0)


def same_plan(new: lnk.LinkPlan, ref: lnk_reference.RefPlan) -> None:
    """Everything the runtime reads equal; a group the reference summed stacked (its rounds all contiguous
    runs, stride n) has the same start and count and no rounds built."""
    for f in ("owned", "local"):
        a, b = getattr(new, f), getattr(ref, f)
        assert a.total == b.total and all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("lo", "hi", "offset"))
    for f in ("pull", "push"):
        for side in ("send", "recv"):
            a, b = getattr(getattr(new, f), side), getattr(getattr(ref, f), side)
            assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("peer", "param", "lo", "hi"))
    assert len(new.group_params) == len(ref.group_params)
    assert all(np.array_equal(a, b) for a, b in zip(new.group_params, ref.group_params))
    for f in ("pull_groups", "push_groups"):
        for a, b in zip(getattr(new, f), getattr(ref, f), strict=True):
            assert (a.src, a.dst, a.send_splits, a.recv_splits, a.pack, a.zero_tail) == \
                   (b.src, b.dst, b.send_splits, b.recv_splits, b.pack, b.zero_tail)
            if b.stacked is not None:
                assert a.stacked == (b.stacked, len(b.rounds)) and a.rounds == ()
            else:
                assert a.stacked is None and a.rounds == b.rounds


@pytest.mark.parametrize("world,tps,seed", [(w, t, seed) for w, t, _ in CASES[::4] for seed in range(3)]
                         + [(16, [1, 2, 4], 0), (24, [1, 2, 3, 4], 1), (32, [1, 2, 4, 8], 2)])
def test_plan_link_equals_the_reference_on_mixed_layouts(world, tps, seed):
    """TP/PP/CP mixes with idle ranks, numels that TP or the world do not divide, parameters smaller than the
    world (empty owner ranges), random layer groups: the vectorized plan equals the per-group one exactly."""
    rng = np.random.default_rng(seed * 1000 + world)
    numels, sharded = make_params(rng, 9, math.lcm(*tps))
    numels = numels + rng.integers(0, 3, len(numels)) * (seed % 2)
    numels[seed % len(numels)] = 1 + seed
    groups = np.sort(rng.integers(0, 4, len(numels))) if seed != 1 else None
    roles, _ = random_strategy(rng, world, len(numels), tps, (1, 2, 3))
    for r in range(world):
        same_plan(plan_link(numels, sharded, roles, r, groups), lnk_reference.plan_link(numels, sharded, roles, r, groups))


def test_plan_link_equals_the_reference_on_llama_shaped_layouts():
    """The demo's kind of layout (64 GPUs: <2,1,4> replicas beside <1,2,1> and <4,1,1> pipelines, per-layer
    groups) and a 256-way data-parallel one on LLaMA-like parameter shapes (norms replicated), a few ranks each:
    every group's rounds, stacked sums and zero tails as the reference made them."""
    from hydraplan.runtime.model import TINY_WIDE, param_groups, param_specs

    specs = param_specs(TINY_WIDE)
    numels, sharded = np.array([s.numel for s in specs]), np.array([s.sharded for s in specs])
    groups, every = param_groups(TINY_WIDE), tuple(range(len(specs)))
    half = len(specs) // 2
    mixed = ([Role(every, 2, r % 2) for r in range(48)] + [Role(every[:half]), Role(every[half:])] * 4
             + [Role(every, 4, r % 4) for r in range(8)])
    for roles, ranks in ((mixed, (0, 1, 47, 48, 55, 56, 63)), ([Role(every)] * 256, (0, 255))):
        for r in ranks:
            same_plan(plan_link(numels, sharded, roles, r, groups),
                      lnk_reference.plan_link(numels, sharded, roles, r, groups))


@pytest.mark.parametrize("world,tps", [(2, [1, 2]), (4, [1, 2, 4]), (8, [2, 4]), (6, [1, 2])])
def test_pieces_are_runs_of_mutual_slices_of_granularity_lcm(world, tps):
    """Hydraulis §5.2: mutual slices cut every tensor into LCM(N, TPmax) even segments; no piece may
    start or end inside one (powers of two and 2 | 6: each degree divides TPmax)."""
    rng = np.random.default_rng(world)
    g = math.lcm(world, max(tps))
    numels = (rng.integers(1, 4, 5) * g * 3).astype(np.int64)
    sharded = np.ones(5, bool)
    roles, _ = random_strategy(rng, world, 5, tps)
    for r in range(world):
        pl = plan_link(numels, sharded, roles, r)
        for pieces in (pl.pull.send, pl.pull.recv, pl.push.send, pl.push.recv):
            seg = numels[pieces.param] // g
            assert np.all(pieces.lo % seg == 0) and np.all(pieces.hi % seg == 0)


@pytest.mark.parametrize("world,tp", [(4, 1), (8, 1), (4, 2), (8, 4), (6, 3)])
def test_homogeneous_strategy_pull_is_all_gather_and_push_is_reduce_scatter(world, tp):
    numels = np.array([world * tp * 5, world * tp * 2, world * 3], dtype=np.int64)
    sharded = np.array([True, True, False])
    roles = [Role((0, 1, 2), tp, r % tp) for r in range(world)]
    shard = numels // world
    for r in range(world):
        pl = plan_link(numels, sharded, roles, r)
        # pull: every piece is one owner's whole shard (all-gather), and a sharded param comes from the
        # world/tp owners of this TP rank's chunk, a replicated one from all owners.
        np.testing.assert_array_equal(pl.pull.recv.size, shard[pl.pull.recv.param])
        np.testing.assert_array_equal(pl.pull.recv.lo, pl.pull.recv.peer * shard[pl.pull.recv.param])
        assert sorted(np.bincount(pl.pull.recv.param).tolist()) == sorted([world // tp, world // tp, world])
        # push: each owner receives its whole shard of every sharded param from each of the world/tp replicas
        # (a reduce-scatter over the replicas) and of the replicated one from every rank (each TP rank's part)
        np.testing.assert_array_equal(pl.push.recv.size, shard[pl.push.recv.param])
        np.testing.assert_array_equal(pl.push.recv.lo, r * shard[pl.push.recv.param])
        assert np.bincount(pl.push.recv.param).tolist() == [world // tp, world // tp, world]
        if tp == 1:  # data parallel: each peer's contribution is the owner range whole, stacked in the buffer
            assert [ge.stacked for ge in pl.push_groups] == [(0, world)]
        pl = plan_link(numels, sharded, roles, r, (0, 1, 2))
        if tp == 1:  # per layer group too: one batched reduction each, no round by round sum
            assert [ge.stacked for ge in pl.push_groups] == [(0, world)] * 3


def test_communication_volume_bound_of_appendix_b():
    """A rank receives W/tp of its stage's sharded params; it sends at most W in pull (B.1)."""
    world, tps = 8, [1, 2, 4]
    rng = np.random.default_rng(3)
    numels, sharded = make_params(rng, 9, 4)
    roles, _ = random_strategy(rng, world, 9, tps)
    for r in range(world):
        pl = plan_link(numels, sharded, roles, r)
        assert pl.pull.send.size.sum() <= numels.sum()
        assert pl.pull.recv.size.sum() == len(expected_local([np.zeros(n) for n in numels], sharded, roles[r]))


# ---------------------------------------------------------------------------------- gloo processes
def _worker(rank: int, world: int, port: int) -> None:
    init_gloo(rank, world, port)
    try:
        rng = np.random.default_rng(0)  # same on every rank
        numels = np.array([24, 36, 12, 30], dtype=np.int64)
        sharded = np.array([True, True, False, True])
        full = [torch.from_numpy(rng.standard_normal(n)) for n in numels]
        shard = torch.cat([f[rank * len(f) // world:(rank + 1) * len(f) // world] for f in full])

        def pull_then_push(roles: list[Role], groups=(0, 1, 1, 2)) -> None:
            """Pull equals slicing; ranks 0-1 push ones and ranks 2-3 twos: owners must see the sum over the
            ranks holding each element (a TP chunk of a sharded param, a replicated one whole)."""
            pl = plan_link(numels, sharded, roles, rank, groups)
            got = lnk_streams.pull(pl, shard, torch.float64)
            want = torch.from_numpy(expected_local([f.numpy() for f in full], sharded, roles[rank]))
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            grads = got.new_full((pl.local.total,), 1.0 if rank < 2 else 2.0)
            pushed = lnk_streams.push(pl, grads, torch.float64)
            totals = [np.zeros(n) for n in numels]
            for r, role in enumerate(roles):
                for p in role.params:
                    n = numels[p]
                    lo, hi = (role.tp_rank * n // role.tp, (role.tp_rank + 1) * n // role.tp) if sharded[p] else (0, n)
                    totals[p][lo:hi] += 1.0 if r < 2 else 2.0
            want = np.concatenate([t[rank * len(t) // world:(rank + 1) * len(t) // world] for t in totals])
            torch.testing.assert_close(pushed, torch.from_numpy(want), rtol=0, atol=0)

        # Heterogeneous: pipeline A = <2,1,1> on ranks 0,1 (all params); pipeline B = <1,2,1> on ranks 2,3
        # (stage 0: params 0-1, stage 1: params 2-3).
        pull_then_push([Role((0, 1, 2, 3), 2, 0), Role((0, 1, 2, 3), 2, 1), Role((0, 1), 1, 0), Role((2, 3), 1, 0)])
        # <2,1,2>: CP rank 0 on ranks 0,1 and CP rank 1 on ranks 2,3 hold the same TP slices, each with the
        # partial gradient of its tokens: the owners must get their sum.
        pull_then_push([Role((0, 1, 2, 3), 2, r % 2) for r in range(4)])
        # homogeneous <1,1,1> x world: pull == all_gather, push == reduce_scatter (equal shards here).
        even = np.array([world * 5, world * 3], dtype=np.int64)
        params = [torch.arange(n, dtype=torch.float64) * (i + 1) for i, n in enumerate(even)]
        pl = plan_link(even, np.array([True, False]), [Role((0, 1))] * world, rank)
        mine = torch.cat([p.chunk(world)[rank] for p in params])
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        regroup = torch.cat([torch.cat([g[o:o + n // world] for g in gathered]) for o, n in zip([0, even[0] // world], even)])
        torch.testing.assert_close(lnk_streams.pull(pl, mine, torch.float64), regroup, rtol=0, atol=0)
        local_grad = torch.cat(params) * (rank + 1)
        pushed = lnk_streams.push(pl, local_grad, torch.float64)
        for i, p in enumerate(params):
            rs = torch.empty(even[i] // world, dtype=torch.float64)
            dist.reduce_scatter_single(rs, p * (rank + 1))
            off = sum(even[:i]) // world
            torch.testing.assert_close(pushed[off:off + len(rs)], rs, rtol=0, atol=1e-12)
    finally:
        dist.destroy_process_group()
    exit_process(0)


@pytest.mark.slow
def test_pull_and_push_over_gloo_match_slicing_and_collectives():
    spawn(_worker, (4, free_port()), 4)


def _stream_worker(rank: int, world: int, port: int) -> None:
    """Pull and push through the overlapped streams (helper threads, bounded windows): the same result as
    slicing and as summing, never more than `depth` groups in flight per direction, and bf16 gradients on the
    wire summed in fp32 at the owners."""
    init_gloo(rank, world, port)
    try:
        rng = np.random.default_rng(1)
        numels = np.array([24, 36, 12, 30, 18, 42, 6, 48], dtype=np.int64)
        sharded = np.array([True, True, False, True, True, True, False, True])
        groups = (0, 1, 1, 2, 3, 4, 5, 5)
        full = [torch.from_numpy(rng.standard_normal(n)) for n in numels]
        shard = torch.cat([f[rank * len(f) // world:(rank + 1) * len(f) // world] for f in full])
        roles = [Role(tuple(range(8)), 2, 0), Role(tuple(range(8)), 2, 1), Role((0, 1, 2, 3), 1, 0), Role((4, 5, 6, 7), 1, 0)]
        pl = plan_link(numels, sharded, roles, rank, groups)
        inflight, most = [0], [0]
        post, finish = lnk_streams._Direction._post, lnk_streams._Direction._finish_one

        def counting_post(self, *a):
            inflight[0] += 1
            most[0] = max(most[0], inflight[0])
            return post(self, *a)

        def counting_finish(self, *a, **k):
            inflight[0] -= 1
            return finish(self, *a, **k)

        lnk_streams._Direction._post, lnk_streams._Direction._finish_one = counting_post, counting_finish
        clock = lnk_streams.LinkClock()
        pull = lnk_streams.PullStream(pl, shard, torch.float64, None, overlap=True, clock=clock)
        got = {}
        pull.on_arrival = lambda g, buf: got.__setitem__(g, buf)
        pull.start()
        for g in reversed(range(len(pl.pull_groups))):  # any order: each wait hands its group over once
            pull.wait(g)
        pull.finish()
        want = torch.from_numpy(expected_local([f.numpy() for f in full], sharded, roles[rank]))
        torch.testing.assert_close(torch.cat([got[g] for g in sorted(got)]), want, rtol=0, atol=0)
        assert most[0] <= lnk_streams.LNK_PULL_DEPTH, most[0]
        # push: bf16 on the wire, the owners sum in fp64 (the master dtype here)
        grads = torch.from_numpy(rng.standard_normal(pl.local.total) * (rank + 1))
        inflight[0] = most[0] = 0
        push = lnk_streams.PushStream(pl, grads, torch.bfloat16, None, overlap=True, clock=clock, master_dtype=torch.float64)
        for g in range(len(pl.push_groups)):
            push.ready(g)
        out = push.finish()
        exact = lnk_streams.push(pl, grads.to(torch.bfloat16).double(), torch.float64)
        assert out.dtype == torch.float64 and most[0] <= lnk_streams.LNK_PUSH_DEPTH, most[0]
        torch.testing.assert_close(out, exact, rtol=0, atol=1e-12)
    finally:
        dist.destroy_process_group()
    exit_process(0)


@pytest.mark.slow
def test_overlapped_streams_are_exact_and_bounded_over_gloo():
    spawn(_stream_worker, (4, free_port()), 4)
