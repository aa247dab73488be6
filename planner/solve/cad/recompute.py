"""validate's check of a plan's `cad` section: pieces and tasks cover every sequence and query once, replicas
hold at most MaxLen tokens per step, and the CAD estimate recomputed from the section."""

from __future__ import annotations

import numpy as np

from hydraplan.core.cost import pipeline_time_from_mb
from hydraplan.core.schema import CADSection, Profile
from hydraplan.solve.cad.model import comm_model
from hydraplan.solve.cad.step import StepProblem, step_time


def estimate(profile: Profile, section: CADSection, lengths_by_seq: dict[int, int]) -> tuple[float, list[str]]:
    """Recompute a plan's CAD estimate from its `cad` section (and check it): (estimate, problems)."""
    problems: list[str] = []
    scheme = profile.scheme(*section.key)
    if scheme is None:
        return 0.0, [f"cad: scheme {section.label} not in profile {profile.name}"]
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
        q: dict[int, int] = {}
        for t in step.tasks:
            q[t.seq] = q.get(t.seq, 0) + (t.end - t.start)
        if q != covered:
            problems.append(f"cad.steps.{v}: tasks do not cover the pieces' queries exactly once")
        prob = StepProblem(scheme, cm, pieces, scheme.time.b * tokens + scheme.time.c)
        for t in step.tasks:
            prob.add(t.seq, t.start, t.end, t.home)
        compute, comm = prob.loads([t.rank for t in step.tasks])
        times.append(step_time(compute, comm))
    return pipeline_time_from_mb(times, scheme.pp), problems
