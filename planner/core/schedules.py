"""Pipeline schedules as explicit per-stage action lists, and a timeline simulator that executes them.

Schedules (seq1f1b.txt §3): 1F1B, interleaved 1F1B (V model chunks per device), Seq1F1B (each
micro-batch cut into K causal sub-sequences, "splits") and Seq1F1B-interleaved. One builder covers all
four: a forward order, a backward order (the partially ordered queue: FIFO across micro-batches, LIFO
across the splits of one micro-batch, reversed chunk order) and a per-stage count of forwards before the
first backward; then backward/forward alternate until forwards run out, then the remaining backwards.

Forwards before the first backward on stage r (counted from 0), capped at the M*K*V actions a stage has:
- V = 1: P - r - 1 + K                       (seq1f1b.txt Eq. (1) for K = 1, Eq. (4): warm-up + 1)
- V > 1: 2*(P - r - 1) + (V - 1)*g + K       (Eq. (5) for K = 1, Eq. (6)), g = the interleaving group
  in sub-sequences: g = P when K divides P (the paper's setting), else K*ceil(P/K) so that a group never
  cuts a micro-batch's splits apart (otherwise the LIFO backward of a cut micro-batch would wait on a
  forward queued behind it: a deadlock the dependency check finds). As in Megatron, M*K must be a
  multiple of g (or at most g): a partial last group switches chunks early and deadlocks.

`simulate` executes the lists across stages with given durations: an action starts when its stage is
free and its dependencies are done (plus a p2p latency across devices). Because each stage's order is
fixed, the timeline is unique; if no stage can advance while actions remain the schedule deadlocks, and
`ScheduleError` names the stuck actions. Deadlock-freedom does not depend on durations, so
`check_schedule` (unit durations) proves it for a schedule.

Dependencies of an action on virtual stage v = chunk*P + stage (P*V virtual stages in all):
- F(mb, s) on v needs F(mb, s) on v-1, and F(mb, s-1) on v (causal attention reads earlier K/V);
- B(mb, s) on v needs F(mb, s) on v, B(mb, s) on v+1, and B(mb, s+1) on v (the K/V gradients of later
  splits flow back into earlier ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hydraplan.core.errors import UserError

Op = Literal["F", "B"]
SCHEDULES = ("1f1b", "interleaved", "seq1f1b", "seq1f1b-interleaved")
DurationSpec = float | np.ndarray | Callable[[int, int, int, int], float]
"""Duration of one action: a number (every action), an array indexed [mb] (K = 1) or [mb, split]
(the same on every stage and chunk), or a callable (stage, mb, split, chunk) -> seconds."""

FORWARD_FRACTION = 1.0 / 3.0
"""Share of T(l) spent in the forward pass (backward ~ 2x forward), the convention that makes 1F1B
with uniform micro-batches last exactly (M + P - 1) * T, the canonical estimate."""


class ScheduleError(ValueError):
    """A schedule that is incomplete, duplicates an action, or deadlocks."""


@dataclass(frozen=True, order=True)
class Action:
    op: Op
    mb: int
    split: int = 0
    chunk: int = 0

    def to_json(self) -> dict[str, object]:
        return {"op": self.op, "mb": self.mb, "split": self.split, "chunk": self.chunk}

    def __str__(self) -> str:
        return f"{self.op}{self.mb}.{self.split}c{self.chunk}"


@dataclass
class Schedule:
    """Per-stage action lists: stages[r] is what device r executes, in order."""

    stages: list[list[Action]]
    P: int
    M: int
    K: int = 1
    V: int = 1
    name: str = "custom"

    def to_json(self) -> dict[str, object]:
        return {"stages": [[a.to_json() for a in st] for st in self.stages]}


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    action: Action


@dataclass
class Timeline:
    """Result of executing a schedule.

    bubble_ratio is the idle share of the P*latency device-seconds; peak_live[r] the largest number of
    (mb, split, chunk) activations stage r holds at once (an activation is live from its forward until
    its backward ends); peak_live_bytes the same weighted by the given activation sizes.
    """

    schedule: Schedule
    latency_s: float
    intervals: list[list[Interval]]
    busy_s: list[float]
    bubble_ratio: float
    peak_live: list[int]
    peak_live_bytes: list[float] | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "latency_s": self.latency_s,
            "bubble_ratio": self.bubble_ratio,
            "peak_live": self.peak_live,
            "busy_s": self.busy_s,
        }
        if self.peak_live_bytes is not None:
            out["peak_live_bytes"] = self.peak_live_bytes
        return out


# ------------------------------------------------------------------------------------------ schedules
def group_size(P: int, K: int) -> int:
    """Interleaving group in sub-sequences: P, widened to whole micro-batches when K does not divide P."""
    return P if P % K == 0 else K * math.ceil(P / K)


def forwards_before_first_backward(P: int, M: int, K: int, V: int, r: int) -> int:
    """Eq. (1)/(4) for V = 1, Eq. (5)/(6) for V > 1, plus the first steady forward, capped at M*K*V."""
    if V == 1:
        w = P - r - 1 + K
    else:
        w = 2 * (P - r - 1) + (V - 1) * group_size(P, K) + K
    return min(w, M * K * V)


def _orders(M: int, K: int, V: int, g: int) -> tuple[list[Action], list[Action]]:
    """Forward and backward orders of one stage: groups of g sub-sequences sweep the chunks in turn."""
    fwd_units = [(m, s) for m in range(M) for s in range(K)]
    bwd_units = [(m, s) for m in range(M) for s in reversed(range(K))]
    fwd: list[Action] = []
    bwd: list[Action] = []
    for lo in range(0, M * K, g):
        for c in range(V):
            fwd += [Action("F", m, s, c) for m, s in fwd_units[lo : lo + g]]
            bwd += [Action("B", m, s, V - 1 - c) for m, s in bwd_units[lo : lo + g]]
    return fwd, bwd


def build_schedule(P: int, M: int, K: int = 1, V: int = 1, name: str | None = None) -> Schedule:
    """The 1F1B family: K = 1, V = 1 is 1F1B; K > 1 Seq1F1B; V > 1 the interleaved variants."""
    for label, v in (("stages", P), ("micro-batches", M), ("splits", K), ("chunks", V)):
        if v < 1:
            raise UserError(f"--{label} must be >= 1 (got {v})")
    g = group_size(P, K) if V > 1 else M * K
    if M * K > g and (M * K) % g:
        raise UserError(
            f"interleaved schedules need micro-batches*splits ({M}*{K}) <= {g} or a multiple of {g} "
            "(the group size, P widened to whole micro-batches); otherwise the last, partial group deadlocks"
        )
    fwd, bwd = _orders(M, K, V, g)
    stages = []
    for r in range(P):
        n_f = forwards_before_first_backward(P, M, K, V, r)
        acts = fwd[:n_f]
        for i in range(len(fwd) - n_f):
            acts += [bwd[i], fwd[n_f + i]]
        acts += bwd[len(fwd) - n_f :]
        stages.append(acts)
    if name is None:
        name = ("seq1f1b" if K > 1 else "1f1b") if V == 1 else ("seq1f1b-interleaved" if K > 1 else "interleaved")
    return Schedule(stages=stages, P=P, M=M, K=K, V=V, name=name)


def schedule_1f1b(P: int, M: int) -> Schedule:
    return build_schedule(P, M, 1, 1, "1f1b")


def schedule_seq1f1b(P: int, M: int, K: int) -> Schedule:
    return build_schedule(P, M, K, 1, "seq1f1b")


def make_schedule(kind: str, P: int, M: int, K: int = 1, V: int = 1) -> Schedule:
    """A schedule by CLI name; K (splits) is ignored by the 1F1B kinds, V (chunks) by non-interleaved."""
    if kind not in SCHEDULES:
        raise UserError(f"schedule must be one of {', '.join(SCHEDULES)} (got {kind!r})", "schedule")
    if kind in ("interleaved", "seq1f1b-interleaved") and V < 2:
        raise UserError(f"chunks must be >= 2 for the {kind} schedule (got {V})", "chunks")
    k = K if kind.startswith("seq1f1b") else 1
    v = V if kind.endswith("interleaved") else 1
    return build_schedule(P, M, k, v, kind)


# ------------------------------------------------------------------------------------------ simulator
def _duration_fn(spec: DurationSpec, M: int, K: int, what: str) -> Callable[[int, int, int, int], float]:
    if callable(spec):
        return spec
    arr = np.asarray(spec, dtype=np.float64)
    if np.any(arr < 0):
        raise ValueError(f"{what}: durations must be non-negative")
    if arr.ndim == 0:
        x = float(arr)
        return lambda r, m, s, c: x
    if arr.ndim == 1 and K == 1 and arr.shape[0] == M:
        return lambda r, m, s, c: float(arr[m])
    if arr.ndim == 2 and arr.shape == (M, K):
        return lambda r, m, s, c: float(arr[m, s])
    raise ValueError(f"{what}: expected a scalar, shape ({M},) with K = 1, or ({M}, {K}); got {arr.shape}")


def fb_split(t: np.ndarray | float, V: int = 1, forward_fraction: float = FORWARD_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Per-action forward and backward durations from T (one stage's forward+backward per micro-batch
    or per [mb, split]); each of V chunks holds 1/V of a stage's layers, so it takes T/V."""
    t = np.asarray(t, dtype=np.float64) / V
    return t * forward_fraction, t * (1.0 - forward_fraction)


def _check_complete(schedule: Schedule) -> None:
    P, M, K, V = schedule.P, schedule.M, schedule.K, schedule.V
    if len(schedule.stages) != P:
        raise ScheduleError(f"schedule has {len(schedule.stages)} stage lists, expected P = {P}")
    want = {Action(op, m, s, c) for op in ("F", "B") for m in range(M) for s in range(K) for c in range(V)}
    for r, acts in enumerate(schedule.stages):
        seen = set(acts)
        if len(seen) != len(acts):
            dup = next(a for a in acts if acts.count(a) > 1)
            raise ScheduleError(f"stage {r}: action {dup} appears more than once")
        if seen != want:
            bad = sorted(seen - want) or sorted(want - seen)
            kind = "unexpected" if seen - want else "missing"
            raise ScheduleError(f"stage {r}: {kind} action {bad[0]}")


def _deps(a: Action, r: int, P: int, K: int, VS: int) -> list[tuple[tuple[str, int, int, int], bool]]:
    """Keys (op, mb, split, virtual stage) an action waits for, each with whether it crosses devices."""
    v = a.chunk * P + r
    out: list[tuple[tuple[str, int, int, int], bool]] = []
    if a.op == "F":
        if v > 0:
            out.append((("F", a.mb, a.split, v - 1), P > 1))
        if a.split > 0:
            out.append((("F", a.mb, a.split - 1, v), False))
    else:
        out.append((("F", a.mb, a.split, v), False))
        if v < VS - 1:
            out.append((("B", a.mb, a.split, v + 1), P > 1))
        if a.split < K - 1:
            out.append((("B", a.mb, a.split + 1, v), False))
    return out


def _peak_live(acts: list[Action], size: Callable[[int, int, int, int], float] | None, r: int) -> tuple[int, float]:
    """Peak activations held by one stage; depends only on its order (a backward frees after it ends)."""
    live = peak = 0
    live_b = peak_b = 0.0
    for a in acts:
        w = size(r, a.mb, a.split, a.chunk) if size is not None else 0.0
        if a.op == "F":
            live += 1
            live_b += w
            peak, peak_b = max(peak, live), max(peak_b, live_b)
        else:
            live -= 1
            live_b -= w
    return peak, peak_b


def simulate(
    schedule: Schedule,
    f_time: DurationSpec,
    b_time: DurationSpec,
    *,
    act_bytes: DurationSpec | None = None,
    p2p_s: float = 0.0,
) -> Timeline:
    """Execute the schedule's lists across stages (see the module docstring for the dependencies).

    f_time/b_time: duration of each action (DurationSpec); use `fb_split(T)` for the F = T/3, B = 2T/3
    convention. act_bytes: activation size of one (mb, split, chunk) on a stage, same forms. p2p_s:
    latency added to every dependency between different devices (0 by default, like the canonical
    estimate). Raises ScheduleError if the lists are incomplete or deadlock.
    """
    _check_complete(schedule)
    P, M, K, V = schedule.P, schedule.M, schedule.K, schedule.V
    fd = _duration_fn(f_time, M, K, "f_time")
    bd = _duration_fn(b_time, M, K, "b_time")
    VS = P * V
    done: dict[tuple[str, int, int, int], float] = {}
    ptr = [0] * P
    free = [0.0] * P
    intervals: list[list[Interval]] = [[] for _ in range(P)]
    remaining = sum(len(s) for s in schedule.stages)
    while remaining:
        progressed = False
        for r in range(P):
            acts = schedule.stages[r]
            while ptr[r] < len(acts):
                a = acts[ptr[r]]
                ready = free[r]
                for key, cross in _deps(a, r, P, K, VS):
                    t = done.get(key)
                    if t is None:
                        break
                    ready = max(ready, t + (p2p_s if cross else 0.0))
                else:
                    dur = (fd if a.op == "F" else bd)(r, a.mb, a.split, a.chunk)
                    end = ready + dur
                    done[(a.op, a.mb, a.split, a.chunk * P + r)] = end
                    intervals[r].append(Interval(ready, end, a))
                    free[r] = end
                    ptr[r] += 1
                    remaining -= 1
                    progressed = True
                    continue
                break
        if not progressed:
            stuck = ", ".join(f"stage {r}: {schedule.stages[r][ptr[r]]}" for r in range(P) if ptr[r] < len(schedule.stages[r]))
            raise ScheduleError(f"{schedule.name} P={P} M={M} K={K} V={V} deadlocks; waiting: {stuck}")
    latency = max(free)
    busy = [sum(iv.end - iv.start for iv in st) for st in intervals]
    size = None if act_bytes is None else _duration_fn(act_bytes, M, K, "act_bytes")
    peaks = [_peak_live(schedule.stages[r], size, r) for r in range(P)]
    return Timeline(
        schedule=schedule,
        latency_s=latency,
        intervals=intervals,
        busy_s=busy,
        bubble_ratio=1.0 - sum(busy) / (P * latency) if latency > 0 else 0.0,
        peak_live=[p for p, _ in peaks],
        peak_live_bytes=None if size is None else [b for _, b in peaks],
    )


def check_schedule(schedule: Schedule) -> Timeline:
    """Prove a schedule complete and deadlock-free by executing it (unit durations; order-only facts
    such as deadlock and peak live activations do not depend on the durations)."""
    return simulate(schedule, 1.0, 2.0)


def simulate_1f1b(mb_times: np.ndarray, pp: int, p2p_s: float = 0.0) -> Timeline:
    """Schedule-exact 1F1B latency of one pipeline from its micro-batch times T(m) (canonical profile
    times, F = T/3, B = 2T/3); equals the canonical estimate when all T(m) are equal."""
    t = np.asarray(mb_times, dtype=np.float64)
    f, b = fb_split(t)
    return simulate(schedule_1f1b(pp, len(t)), f, b, p2p_s=p2p_s)


def unit_timeline(schedule: Schedule) -> Timeline:
    """Timeline with uniform micro-batches of T = 1 per stage (a split T/K, a chunk T/V), activation size
    1/(K*V) of a micro-batch per action: bubbles and memory of the schedule shape alone."""
    t = np.full((schedule.M, schedule.K), 1.0 / schedule.K)
    return simulate(schedule, *fb_split(t, schedule.V), act_bytes=t / schedule.V)


def action_label(a: Action, K: int, V: int) -> str:
    """Compact text form: F3 (1F1B), F3.1 (split 1), F3c1 / F3.1c1 (chunk 1)."""
    return f"{a.op}{a.mb}" + (f".{a.split}" if K > 1 else "") + (f"c{a.chunk}" if V > 1 else "")
