"""The cost model: T(l,P), MaxLen(P) and the canonical plan estimate every tool agrees on.

Canonical estimate (DESIGN.md): a micro-batch of lengths l_i on scheme P costs sum(a*l_i^2 + b*l_i) + c;
a pipeline with micro-batches m_1..m_V costs sum_v t(m_v) + (pp-1) * max_v t(m_v); an iteration costs
the max over its pipelines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from planner.errors import UserError
from planner.fileio import load_model
from planner.paths import PROFILES_DIR
from planner.schema import Profile, Scheme


# ------------------------------------------------------------------------------- canonical estimate
def seq_cost(scheme: Scheme, lengths: np.ndarray | Sequence[int] | int) -> np.ndarray:
    """Per-sequence cost a*l^2 + b*l (no micro-batch constant), vectorized."""
    l = np.asarray(lengths, dtype=np.float64)
    return (scheme.time.a * l + scheme.time.b) * l


def seq_time(scheme: Scheme, length: float) -> float:
    """T(l,P): one stage's forward+backward of a micro-batch holding one sequence of length l."""
    t = scheme.time
    return (t.a * length + t.b) * length + t.c


def micro_batch_time(scheme: Scheme, lengths: Iterable[int]) -> float:
    return float(seq_cost(scheme, list(lengths)).sum()) + scheme.time.c


def pipeline_time_from_mb(mb_times: Sequence[float] | np.ndarray, pp: int) -> float:
    mb = np.asarray(mb_times, dtype=np.float64)
    if mb.size == 0:
        return 0.0
    return float(mb.sum() + (pp - 1) * mb.max())


def pipeline_time(scheme: Scheme, micro_batches: Iterable[Iterable[int]]) -> float:
    """Canonical latency of one pipeline running the given micro-batches (lists of lengths)."""
    return pipeline_time_from_mb([micro_batch_time(scheme, mb) for mb in micro_batches], scheme.pp)


# --------------------------------------------------------------------------------- profiles / MaxLen
def max_len_for_gpus(profile: Profile, scheme: Scheme, gpus: int) -> int:
    """MaxLen of a scheme when the fp32 optimizer states are sharded over `gpus` GPUs.

    A scheme without memory constants (hand-written or measured) keeps its stated max_len for any N.
    """
    if scheme.memory is None or profile.memory is None:
        return scheme.max_len
    m = scheme.memory
    free = profile.memory.capacity_bytes - m.sharded_bytes / gpus - m.local_bytes
    return max(0, int(free // m.act_bytes_per_token))


def for_gpus(profile: Profile, gpus: int) -> Profile:
    """The profile as seen by a job of `gpus` GPUs: schemes that fit, MaxLen recomputed for N."""
    if gpus < 1:
        raise UserError(f"--gpus must be positive (got {gpus})")
    schemes = []
    for s in profile.schemes:
        if s.gpus > gpus:
            continue
        ml = max_len_for_gpus(profile, s, gpus)
        if ml > 0:
            schemes.append(s.model_copy(update={"max_len": ml}))
    if not schemes:
        smallest = min(s.gpus for s in profile.schemes)
        raise UserError(f"profile {profile.name}: no scheme fits in {gpus} GPUs (the smallest needs {smallest})")
    return profile.model_copy(update={"schemes": schemes})


def bundled_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> Profile:
    """A bundled profile by name (e.g. h100-llama2-7b) or a path to a profile JSON."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return load_model(Profile, path)
    bundled = PROFILES_DIR / f"{name_or_path}.json"
    if bundled.exists():
        return load_model(Profile, bundled)
    names = ", ".join(p.stem for p in bundled_profiles())
    raise UserError(f"unknown profile {name_or_path!r}: not a file, and not a bundled profile ({names})")
