"""One CAD step: documents to steps, a step's documents cut into equal-token slices (pieces) and query-chunk
tasks, and the assignment problem of its tasks to ranks with each rank's compute and comm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hydraplan.core.cost import seq_cost
from hydraplan.core.schema import Scheme
from hydraplan.solve.cad.model import CommModel, kv_comm, prefix_tokens, q_comm, task_cost

MIN_CHUNK = 256  # tokens: the smallest query chunk the initial cut makes


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
    w = seq_cost(scheme, lengths)
    load = np.zeros(steps)
    out: list[list[int]] = [[] for _ in range(steps)]
    for i in np.argsort(-lengths, kind="stable").tolist():
        v = int(np.argmin(load))
        out[v].append(i)
        load[v] += w[i]
    return out


def initial_tasks(pieces: Sequence[tuple[int, int, int, int]], chunk: int) -> list[tuple[int, int, int, int]]:
    """Each piece cut into query chunks of at most `chunk` tokens, run at home: (doc, start, end, home)."""
    out: list[tuple[int, int, int, int]] = []
    for doc, s, e, h in pieces:
        k = max(1, -(-(e - s) // chunk))
        cuts = [s + ((e - s) * j) // k for j in range(k + 1)]
        out.extend((doc, cuts[j], cuts[j + 1], h) for j in range(k))
    return out


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
