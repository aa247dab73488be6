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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hydraplan.core.schema import (
    BatchSeq,
    CADPiece,
    CADSection,
    CADStep,
    CADTask,
    Estimate,
    MicroBatch,
    Plan,
    PlanPipeline,
    Profile,
    Scheme,
)

BF16 = 2
MIN_CHUNK = 256  # tokens: the smallest query chunk the initial cut makes
CUT_ALIGN = 64  # greedy cut points are multiples of this (FlashAttention tile) in tasks of 4 tiles or more
MILP_MAX_VARS = 4000  # task x rank binaries up to which the exact refinement runs
MILP_TIME_S = 1.0
GREEDY_MAX_MOVES = 4096


# ------------------------------------------------------------------------------------------ costs
@dataclass(frozen=True)
class CommModel:
    """Per-layer bytes per token and the pairwise bandwidth of one CAD layout."""

    token_bytes: float  # q: bytes per token per layer of Q (= of K, V, O and their gradients) per TP rank
    layers: int  # decoder layers per stage
    bw: np.ndarray  # d x d bytes/s between ranks (inf on the diagonal)

    def seconds(self, bytes_per_layer: np.ndarray) -> np.ndarray:
        return bytes_per_layer * self.layers


def comm_model(profile: Profile, scheme: Scheme, d: int) -> CommModel:
    """Bandwidths between the d replicas of `scheme` placed contiguously (replica j on GPUs [j*g, (j+1)*g))."""
    g, gpn = scheme.gpus, profile.gpu.gpus_per_node
    node = (np.arange(d) * g) // gpn
    same = node[:, None] == node[None, :]
    if profile.network is None:
        intra, inter = math.inf, math.inf
    else:
        intra, inter = profile.network.intra_node_GBps * 1e9, profile.network.inter_node_GBps * 1e9
    bw = np.where(same, intra, inter)
    np.fill_diagonal(bw, math.inf)
    layers = profile.model.layers // scheme.pp
    return CommModel(BF16 * profile.model.hidden / scheme.tp, layers, bw)


def task_cost(scheme: Scheme, start: int | np.ndarray, end: int | np.ndarray) -> np.ndarray | float:
    """Attention seconds of query chunk [start, end) with its causal prefix: a*(end^2 - start^2)."""
    s, e = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    out = scheme.time.a * (e * e - s * s)
    return out if out.ndim else float(out)


def prefix_tokens(pieces: Sequence[tuple[int, int, int, int]], doc: int, end: int, d: int) -> np.ndarray:
    """Per rank, how many tokens of doc's [0, end) it holds (pieces: (doc, start, end, home))."""
    out = np.zeros(d, dtype=np.float64)
    for pd, ps, pe, ph in pieces:
        if pd == doc and ps < end:
            out[ph] += min(pe, end) - ps
    return out


def pair_comm(cm: CommModel, tokens: np.ndarray, x: int) -> np.ndarray:
    """Per rank, seconds spent moving 2 * tokens[h] rows of q bytes each way between every rank h and
    executor x (one direction's bytes: links are full duplex and both directions carry the same);
    x itself pays the sum (it talks to every h)."""
    sec = cm.seconds(2.0 * tokens * cm.token_bytes / cm.bw[:, x])
    sec[x] = 0.0
    sec[x] = sec.sum()
    return sec


def q_comm(cm: CommModel, n: int, home: int, x: int) -> np.ndarray:
    """Per rank, seconds of a task's queries and outputs: home -> x carries Q (fwd) and dO (bwd), x -> home
    O (fwd) and dQ (bwd): 2 rows each way per query."""
    tokens = np.zeros(cm.bw.shape[0])
    tokens[home] = n
    return pair_comm(cm, tokens, x)


def kv_comm(cm: CommModel, kv: np.ndarray, x: int) -> np.ndarray:
    """Per rank, seconds of the K and V rows executor x reads (forward) and their gradients it returns
    (backward): kv[h] tokens from h, 2 rows each way."""
    return pair_comm(cm, kv, x)


def task_comm(cm: CommModel, kv: np.ndarray, n: int, home: int) -> np.ndarray:
    """C[x, r]: seconds rank r communicates for one task alone on executor x (its queries and its whole
    prefix's K/V). Executors de-duplicate K/V of one document (`StepProblem.loads`); this is one task's share."""
    d = kv.size
    return np.stack([q_comm(cm, n, home, x) + kv_comm(cm, kv, x) for x in range(d)])


# ------------------------------------------------------------------------------------------ layout
def cut_step(lengths: np.ndarray, docs: Sequence[int], d: int) -> list[tuple[int, int, int, int]]:
    """Documents laid end to end (in the given order), cut into d slices of equal tokens (+-1):
    the pieces (doc, start, end, rank)."""
    total = int(sum(int(lengths[i]) for i in docs))
    bounds = [(k * total) // d for k in range(d + 1)]
    pieces, pos = [], 0
    for i in docs:
        l = int(lengths[i])
        lo, hi = pos, pos + l
        for r in range(d):
            s, e = max(lo, bounds[r]), min(hi, bounds[r + 1])
            if s < e:
                pieces.append((int(i), s - pos, e - pos, r))
        pos = hi
    return pieces


def assign_steps(lengths: np.ndarray, scheme: Scheme, steps: int) -> list[list[int]]:
    """Documents to steps: longest first to the step with the least a*l^2 + b*l work (LPT)."""
    w = (scheme.time.a * lengths.astype(np.float64) + scheme.time.b) * lengths
    load = np.zeros(steps)
    out: list[list[int]] = [[] for _ in range(steps)]
    for i in np.argsort(-lengths, kind="stable").tolist():
        v = int(np.argmin(load))
        out[v].append(i)
        load[v] += w[i]
    return out


def initial_tasks(pieces: Sequence[tuple[int, int, int, int]], chunk: int) -> list[tuple[int, int, int, int]]:
    """Each piece cut into query chunks of at most `chunk` tokens, run at home: (doc, start, end, home)."""
    out = []
    for doc, s, e, h in pieces:
        k = max(1, -(-(e - s) // chunk))
        cuts = [s + ((e - s) * j) // k for j in range(k + 1)]
        out.extend((doc, cuts[j], cuts[j + 1], h) for j in range(k))
    return out


# -------------------------------------------------------------------------------------- assignment
@dataclass
class StepProblem:
    """One step's assignment problem. Communication of an assignment: every task's queries/outputs between
    its home and executor, plus, per (document, executor), the K/V of the document's prefix up to the
    furthest task end on that executor, read once (an executor keeps a document's keys for all its tasks)."""

    scheme: Scheme
    cm: CommModel
    pieces: list[tuple[int, int, int, int]]
    linear: np.ndarray  # per rank b*tokens + c
    tasks: list[tuple[int, int, int, int]] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    _kv: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)

    @property
    def d(self) -> int:
        return self.linear.size

    def add(self, doc: int, s: int, e: int, home: int) -> None:
        self.tasks.append((doc, s, e, home))
        self.cost.append(float(task_cost(self.scheme, s, e)))

    def kv(self, doc: int, end: int, x: int) -> np.ndarray:
        """kv_comm of doc's prefix [0, end) on executor x (0 for end = 0), cached."""
        key = (doc, end, x)
        if key not in self._kv:
            self._kv[key] = (kv_comm(self.cm, prefix_tokens(self.pieces, doc, end, self.d), x) if end > 0
                             else np.zeros(self.d))
        return self._kv[key]

    def q(self, t: int, x: int) -> np.ndarray:
        _, s, e, home = self.tasks[t]
        return q_comm(self.cm, e - s, home, x)

    def loads(self, rank: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        compute = self.linear.copy()
        comm = np.zeros(self.d)
        reach: dict[tuple[int, int], int] = {}
        for t, x in enumerate(rank):
            doc, s, e, home = self.tasks[t]
            compute[x] += self.cost[t]
            if x != home:
                comm += self.q(t, x)
            reach[(doc, x)] = max(reach.get((doc, x), 0), e)
        for (doc, x), e in reach.items():
            comm += self.kv(doc, e, x)
        return compute, comm


def step_problem(scheme: Scheme, cm: CommModel, lengths: np.ndarray, docs: Sequence[int], d: int,
                 chunk: int | None = None) -> StepProblem:
    pieces = cut_step(lengths, docs, d)
    tokens = np.zeros(d)
    for _, s, e, h in pieces:
        tokens[h] += e - s
    linear = scheme.time.b * tokens + scheme.time.c
    per_rank = int(tokens.max()) if tokens.size else 1
    chunk = chunk or max(MIN_CHUNK, -(-per_rank // 2))
    p = StepProblem(scheme, cm, pieces, linear)
    for t in initial_tasks(pieces, chunk):
        p.add(*t)
    return p


def step_time(compute: np.ndarray, comm: np.ndarray) -> float:
    return float(np.maximum(compute, comm).max()) if compute.size else 0.0


def greedy(p: StepProblem, budget_s: float) -> list[int]:
    """Communication-aware greedy (DistCA's idea): move attention from the slowest rank to the least loaded,
    the task with the most attention per communicated second first, cutting it at the exact query position
    that closes half the gap. A move is kept only if it lowers the larger of the two ranks' max(compute,
    comm) and keeps their comm within the budget (or no worse than before)."""
    rank = [t[3] for t in p.tasks]
    compute, comm = p.loads(rank)
    reach: dict[tuple[int, int], list[int]] = {}
    for t, x in enumerate(rank):
        reach.setdefault((p.tasks[t][0], x), []).append(p.tasks[t][2])

    def far(doc: int, x: int, drop: int | None = None, add: int | None = None) -> int:
        ends = list(reach.get((doc, x), []))
        if drop is not None:
            ends.remove(drop)
        if add is not None:
            ends.append(add)
        return max(ends, default=0)

    def move_comm(t: int, hi: int, lo: int, cut: int | None) -> np.ndarray:
        """comm after task t (or its tail [cut, e)) moves from hi to lo."""
        doc, s, e, home = p.tasks[t]
        new = comm.copy()
        if hi != home:
            new -= p.q(t, hi)
        tail_start = s if cut is None else cut
        if cut is not None and hi != home:
            new += q_comm(p.cm, cut - s, home, hi)
        if lo != home:
            new += q_comm(p.cm, e - tail_start, home, lo)
        hi_after = far(doc, hi, drop=e, add=cut)
        new += p.kv(doc, hi_after, hi) - p.kv(doc, far(doc, hi), hi)
        new += p.kv(doc, max(far(doc, lo), e), lo) - p.kv(doc, far(doc, lo), lo)
        return new

    for _ in range(GREEDY_MAX_MOVES):
        total = np.maximum(compute, comm)
        hi, lo = int(np.argmax(total)), int(np.argmin(compute))
        gap = (compute[hi] - compute[lo]) / 2
        if hi == lo or gap <= 0 or compute[hi] < comm[hi]:
            break
        mine = [t for t, x in enumerate(rank) if x == hi and p.cost[t] > 0]
        gain = {t: min(p.cost[t], gap) / max(float(move_comm(t, hi, lo, None)[[hi, lo]].sum()), 1e-30) for t in mine}
        moved = False
        for t in sorted(mine, key=lambda t: -gain[t]):
            doc, s, e, home = p.tasks[t]
            cut = None
            if p.cost[t] > gap:  # move only the tail [cut, e) worth `gap` seconds (else the whole task)
                align = CUT_ALIGN if e - s >= 4 * CUT_ALIGN else 1
                x = math.sqrt(max(e * e - gap / p.scheme.time.a, s * s))
                cut = int(math.ceil(x / align) * align)
                if not s < cut < e:
                    cut = None
            part = p.cost[t] if cut is None else float(task_cost(p.scheme, cut, e))
            new_comp = compute.copy()
            new_comp[hi] -= part
            new_comp[lo] += part
            new_comm = move_comm(t, hi, lo, cut)
            if not _better(compute, comm, new_comp, new_comm, hi, lo, budget_s):
                continue
            reach[(doc, hi)].remove(e)
            reach.setdefault((doc, lo), []).append(e)
            if cut is None:
                rank[t] = lo
            else:
                reach[(doc, hi)].append(cut)
                p.tasks[t] = (doc, s, cut, home)
                p.cost[t] = float(task_cost(p.scheme, s, cut))
                p.add(doc, cut, e, home)
                rank.append(lo)
            compute, comm = new_comp, new_comm
            moved = True
            break
        if not moved:
            break
    return rank


def _better(comp: np.ndarray, comm: np.ndarray, new_comp: np.ndarray, new_comm: np.ndarray, hi: int, lo: int,
            budget_s: float) -> bool:
    if new_comm[[hi, lo]].max() > budget_s and new_comm[[hi, lo]].max() > comm[[hi, lo]].max():
        return False
    before = max(np.maximum(comp, comm)[[hi, lo]])
    after = max(np.maximum(new_comp, new_comm)[[hi, lo]])
    return after < before * (1 - 1e-12)


def milp(p: StepProblem, budget_s: float, start: Sequence[int], time_limit_s: float = MILP_TIME_S
         ) -> tuple[list[int], bool] | None:
    """Exact re-assignment of the fixed tasks (HiGHS MILP), None if too large. Returns (ranks, proven optimal).

    x[t, r] = 1 if task t runs on r; z the step time. Rows: every task on one rank; every rank's compute
    <= z, comm <= z and comm <= cap (cap: the budget, or the start's comm if that is larger). K/V reads are
    de-duplicated exactly: the tasks of document D sorted by end e_1 <= ... <= e_K; w[D, x, k] >= x[t_j, x]
    for j >= k (0 <= w <= 1) flags that x reads D's prefix up to e_k, costing kv(e_k) - kv(e_{k-1}), which is
    nonnegative, so at the optimum w is the max of those x and the cost telescopes to kv(max end on x)."""
    import highspy

    from hydraplan.solve.highs import run_mip

    T, d = len(p.tasks), p.d
    docs: dict[int, list[int]] = {}
    for t, (doc, _, e, _) in enumerate(p.tasks):
        docs.setdefault(doc, []).append(t)
    for ts in docs.values():
        ts.sort(key=lambda t: p.tasks[t][2])
    nw = T * d
    if T * d + nw > MILP_MAX_VARS:
        return None
    start_comp, start_comm = p.loads(start)
    cap = max(budget_s, float(start_comm.max()))
    scale = 1.0 / max(step_time(start_comp, start_comm), 1e-30)  # seconds -> O(1)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("threads", 1)
    inf = highspy.kHighsInf
    nx, nv = T * d, T * d + nw + 1
    zi = nv - 1
    lower, upper = np.zeros(nv), np.ones(nv)
    upper[zi] = inf
    h.addVars(nv, lower, upper)
    cost = np.zeros(nv)
    cost[zi] = 1.0
    h.changeColsCost(nv, np.arange(nv, dtype=np.int32), cost)
    h.changeColsIntegrality(nx, np.arange(nx, dtype=np.int32), np.full(nx, highspy.HighsVarType.kInteger))

    def xi(t: int, r: int) -> int:
        return t * d + r

    # w index: slot k of document D's sorted tasks = the task id at that slot, so w[D, x, k] -> nx + t_k*d + x
    def wi(t: int, r: int) -> int:
        return nx + t * d + r

    for t in range(T):
        h.addRow(1.0, 1.0, d, np.array([xi(t, r) for r in range(d)], dtype=np.int32), np.ones(d))
    for ts in docs.values():
        for k, t in enumerate(ts):
            for r in range(d):
                h.addRow(0.0, inf, 2, np.array([wi(t, r), xi(t, r)], dtype=np.int32), np.array([1.0, -1.0]))
                if k + 1 < len(ts):
                    h.addRow(0.0, inf, 2, np.array([wi(t, r), wi(ts[k + 1], r)], dtype=np.int32), np.array([1.0, -1.0]))
    comm_rows: list[dict[int, float]] = [dict() for _ in range(d)]
    for t, (doc, s, e, home) in enumerate(p.tasks):
        for x in range(d):
            if x != home:
                for r, v in enumerate(p.q(t, x)):
                    if v:
                        comm_rows[r][xi(t, x)] = comm_rows[r].get(xi(t, x), 0.0) + v * scale
    for ts in docs.values():
        prev_end = 0
        for t in ts:
            doc, _, e, _ = p.tasks[t]
            for x in range(d):
                inc = p.kv(doc, e, x) - p.kv(doc, prev_end, x)
                for r, v in enumerate(inc):
                    if v:
                        comm_rows[r][wi(t, x)] = comm_rows[r].get(wi(t, x), 0.0) + v * scale
            prev_end = e
    for r in range(d):
        idx = np.array([xi(t, r) for t in range(T)] + [zi], dtype=np.int32)
        h.addRow(-inf, -p.linear[r] * scale, idx.size, idx, np.array([c * scale for c in p.cost] + [-1.0]))
        if comm_rows[r]:
            cols = np.array(list(comm_rows[r]), dtype=np.int32)
            vals = np.array(list(comm_rows[r].values()))
            h.addRow(-inf, 0.0, cols.size + 1, np.append(cols, np.int32(zi)), np.append(vals, -1.0))
            h.addRow(-inf, cap * scale * (1 + 1e-9), cols.size, cols, vals)
    sol = np.zeros(nv)
    for t, x in enumerate(start):
        sol[xi(t, x)] = 1.0
    for ts in docs.values():
        for k, t in enumerate(ts):
            for j in ts[k:]:
                sol[wi(t, start[j])] = 1.0
    sol[zi] = step_time(start_comp, start_comm) * scale
    warm = highspy.HighsSolution()
    warm.col_value = sol.tolist()
    warm.value_valid = True
    h.setSolution(warm)
    run_mip(h)
    status = h.getModelStatus()
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit):
        return None
    vals = np.asarray(h.getSolution().col_value)
    if vals.size != nv:
        return None
    ranks = vals[:nx].reshape(T, d).argmax(axis=1).tolist()
    return ranks, status == highspy.HighsModelStatus.kOptimal


def solve_step(p: StepProblem, budget_s: float, exact: bool = True) -> tuple[list[int], str]:
    """Greedy, then the MILP refinement if it is small enough and strictly better."""
    rank = greedy(p, budget_s)
    solver = "greedy"
    if exact:
        out = milp(p, budget_s, rank)
        if out is not None:
            ranks, optimal = out
            if step_time(*p.loads(ranks)) < step_time(*p.loads(rank)) * (1 - 1e-9):
                rank, solver = ranks, "greedy+milp" + ("" if optimal else "/time-limit")
            elif optimal:
                solver = "greedy+milp"
    return rank, solver


# -------------------------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class CADResult:
    section: CADSection
    estimate_s: float
    steps: list[list[int]]  # documents (indices into lengths) per step
    per_rank_tokens: list[list[int]]  # [step][rank]


def plan_cad(profile: Profile, scheme: Scheme, gpus: int, lengths: np.ndarray, steps: int, *,
             budget: float = 1.0, exact: bool = True, ids: Sequence[int] | None = None) -> CADResult | None:
    """A CAD plan of the batch on d = gpus // scheme.gpus replicas of `scheme` in `steps` steps, or None if a
    rank's tokens exceed MaxLen. `budget`: a rank's comm may use at most this fraction of the step's mean
    compute (1.0: what ping-pong can hide on an average rank)."""
    if scheme.cp != 1:
        return None
    d = gpus // scheme.gpus
    if d < 1:
        return None
    lengths = np.asarray(lengths, dtype=np.int64)
    ids = list(range(lengths.size)) if ids is None else [int(i) for i in ids]
    cm = comm_model(profile, scheme, d)
    out_steps: list[CADStep] = []
    times: list[float] = []
    per_rank_tokens: list[list[int]] = []
    docs_per_step = [v for v in assign_steps(lengths, scheme, steps) if v]
    for docs in docs_per_step:
        p = step_problem(scheme, cm, lengths, docs, d)
        tokens = np.zeros(d, dtype=np.int64)
        for _, s, e, h in p.pieces:
            tokens[h] += e - s
        if tokens.max() > scheme.max_len or tokens.min() == 0:
            return None
        mean_compute = float(p.linear.mean() + sum(p.cost) / d)
        rank, solver = solve_step(p, budget * mean_compute, exact)
        compute, comm = p.loads(rank)
        times.append(step_time(compute, comm))
        per_rank_tokens.append(tokens.tolist())
        out_steps.append(CADStep(
            pieces=[CADPiece(seq=ids[doc], start=s, end=e, rank=h) for doc, s, e, h in p.pieces],
            tasks=[CADTask(seq=ids[doc], start=s, end=e, home=h, rank=x)
                   for (doc, s, e, h), x in zip(p.tasks, rank, strict=True)],
            compute_s=compute.tolist(), comm_s=comm.tolist(), time_s=times[-1], solver=solver,
            attention_imbalance=_imbalance(compute - p.linear),
        ))
    est = pipeline_estimate(times, scheme.pp)
    section = CADSection(tp=scheme.tp, pp=scheme.pp, cp=scheme.cp, replicas=d, budget=budget, steps=out_steps,
                         estimate_s=est)
    return CADResult(section, est, docs_per_step, per_rank_tokens)


def _imbalance(att: np.ndarray) -> float:
    """max / mean attention seconds per rank, minus 1 (0: perfectly balanced)."""
    m = float(att.mean())
    return float(att.max() / m - 1.0) if m > 0 else 0.0


def pipeline_estimate(step_times: Sequence[float], pp: int) -> float:
    t = np.asarray(step_times, dtype=np.float64)
    return float(t.sum() + (pp - 1) * t.max()) if t.size else 0.0


def ideal_bound(scheme: Scheme, gpus: int, lengths: np.ndarray, steps: int) -> float:
    """Lower bound of any CAD plan of this scheme and step count: all work spread evenly, no comm exposed."""
    d = gpus // scheme.gpus
    w = float(((scheme.time.a * lengths.astype(np.float64) + scheme.time.b) * lengths).sum())
    per_step = w / (d * steps) + scheme.time.c
    return per_step * steps + (scheme.pp - 1) * per_step


def best_cad(profile: Profile, view: Profile, gpus: int, lengths: np.ndarray, *, top: int = 3, extra_steps: int = 2,
             budget: float = 1.0, exact: bool = True, ids: Sequence[int] | None = None) -> CADResult | None:
    """The fastest CAD plan over the view's cp = 1 schemes and step counts: the `top` (scheme, steps) pairs
    by ideal_bound are planned, the best estimate kept (None if no scheme holds the batch)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    options = []
    for s in view.schemes:
        d = gpus // s.gpus
        if s.cp != 1 or d < 1:
            continue
        vmin = max(1, -(-total // (d * s.max_len)))
        for v in range(vmin, vmin + extra_steps + 1):
            if v <= lengths.size:
                options.append((ideal_bound(s, gpus, lengths, v), s.key, v, s))
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    best: CADResult | None = None
    tried = 0
    for _, _, v, s in options:
        if tried >= top:
            break
        r = plan_cad(profile, s, gpus, lengths, v, budget=budget, exact=exact, ids=ids)
        if r is None:
            continue
        tried += 1
        if best is None or r.estimate_s < best.estimate_s:
            best = r
    return best


# ----------------------------------------------------------------------------------- recomputation
def estimate(profile: Profile, section: CADSection, lengths_by_seq: dict[int, int]) -> tuple[float, list[str]]:
    """Recompute a plan's CAD estimate from its `cad` section (and check it): (estimate, problems)."""
    problems: list[str] = []
    scheme = profile.scheme(section.tp, section.pp, section.cp)
    if scheme is None:
        return 0.0, [f"cad: scheme <{section.tp},{section.pp},{section.cp}> not in profile {profile.name}"]
    d = section.replicas
    cm = comm_model(profile, scheme, d)
    times = []
    stepped: set[int] = set()
    for v, step in enumerate(section.steps):
        pieces = [(pc.seq, pc.start, pc.end, pc.rank) for pc in step.pieces]
        again = stepped & {pc.seq for pc in step.pieces}
        if again:
            problems.append(f"cad.steps.{v}: seq {min(again)} is also in an earlier step")
        stepped |= {pc.seq for pc in step.pieces}
        covered: dict[int, int] = {}
        tokens = np.zeros(d)
        for seq, s, e, h in pieces:
            covered[seq] = covered.get(seq, 0) + (e - s)
            tokens[h] += e - s
            if not 0 <= h < d:
                problems.append(f"cad.steps.{v}: piece on rank {h} outside [0, {d})")
        if tokens.max() > scheme.max_len:
            problems.append(f"cad.steps.{v}: a replica holds {int(tokens.max())} tokens > max_len {scheme.max_len}")
        for seq, n in covered.items():
            if lengths_by_seq.get(seq) != n:
                problems.append(f"cad.steps.{v}: seq {seq} has {n} tokens in pieces, length {lengths_by_seq.get(seq)}")
        q = {}
        for t in step.tasks:
            q[t.seq] = q.get(t.seq, 0) + (t.end - t.start)
        if q != covered:
            problems.append(f"cad.steps.{v}: tasks do not cover the pieces' queries exactly once")
        prob = StepProblem(scheme, cm, pieces, scheme.time.b * tokens + scheme.time.c)
        for t in step.tasks:
            prob.add(t.seq, t.start, t.end, t.home)
        compute, comm = prob.loads([t.rank for t in step.tasks])
        times.append(step_time(compute, comm))
    return pipeline_estimate(times, scheme.pp), problems


def cad_plan(batch, result: CADResult, view: Profile, profile_name: str, gpus: int) -> Plan:
    """The plan file of a CAD result: pipelines are the replicas (micro-batch v of replica j lists the
    sequences it holds pieces of in step v), `cad` holds pieces and tasks; estimate with the LNK sync term."""
    from hydraplan.core.sync import iteration_estimate

    sec = result.section
    g = sec.tp * sec.pp * sec.cp
    sampled = batch.sampled
    seqs = [BatchSeq(id=int(i), length=int(l), doc=None if batch.docs is None else int(batch.docs[k]),
                     sampled_iteration=None if sampled is None or sampled[k] == batch.iteration else int(sampled[k]))
            for k, (i, l) in enumerate(zip(batch.ids, batch.lengths, strict=True))]
    pipes = []
    for j in range(sec.replicas):
        mbs = [MicroBatch(seqs=list(dict.fromkeys(pc.seq for pc in step.pieces if pc.rank == j))) for step in sec.steps]
        pipes.append(PlanPipeline(tp=sec.tp, pp=sec.pp, cp=sec.cp, ranks=list(range(j * g, (j + 1) * g)),
                                  micro_batches=mbs, estimate_s=result.estimate_s))
    it = iteration_estimate(view, gpus, [p.key for p in pipes], [result.estimate_s] * len(pipes))
    est = Estimate(propagation_s=result.estimate_s, sync_s=it.sync_s, iteration_s=it.iteration_s)
    for p, e in zip(pipes, it.exposed_s, strict=True):
        p.sync_s = e
    return Plan(iteration=batch.iteration, profile=profile_name, gpus=gpus, batch=seqs, strategy="cad",
                pipelines=pipes, estimate=est, cad=sec)


# ------------------------------------------------------------------------------------------ compare
def as_iteration_plan(result: CADResult | None, lengths: np.ndarray, view: Profile):
    """A CAD result as a baselines.IterationPlan: one pipeline per replica, one micro-batch per step (each
    document listed once, on the replica holding its first token), micro-batch times = the steps' times,
    latency = the CAD estimate."""
    from hydraplan.methods import baselines as bl

    sec = result.section
    scheme = view.scheme(sec.tp, sec.pp, sec.cp)
    times = np.array([s.time_s for s in sec.steps])
    pipes = []
    for j in range(sec.replicas):
        mbs = tuple(np.array(sorted(pc.seq for pc in s.pieces if pc.rank == j and pc.start == 0), dtype=np.int64)
                    for s in sec.steps)
        pipes.append(bl.PipelineRun(scheme, mbs, times, result.estimate_s))
    label = f"cad {scheme.label}x{sec.replicas}"
    return bl.IterationPlan("cad", label, lengths, (bl.Phase(label, tuple(pipes), 0),))


def run_cad(batches: Sequence[np.ndarray], profile: Profile, view: Profile, gpus: int) -> list:
    """The best CAD plan of every batch, as baselines.IterationPlans (UserError if one cannot be planned)."""
    from hydraplan.core.errors import UserError

    out = []
    for it, lengths in enumerate(batches):
        r = best_cad(profile, view, gpus, lengths)
        if r is None:
            raise UserError(f"--methods cad: iteration {it}: no cp=1 scheme holds the batch within MaxLen")
        out.append(as_iteration_plan(r, np.asarray(lengths), view))
    return out


def choose(score, hetero: Sequence, cad_plans: Sequence) -> list:
    """Per iteration the plan with the lower score (baselines.objective_score; ties: the heterogeneous one)."""
    from hydraplan.methods import baselines as bl

    out = []
    for h, c in zip(hetero, cad_plans, strict=True):
        won = c if score(c) < score(h) else h
        out.append(bl.IterationPlan("hydraplan-cad", won.strategy, won.lengths, won.phases, won.overhead_s))
    return out
