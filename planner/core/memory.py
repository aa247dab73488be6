"""The memory model of one rank (Hydraulis appendix C.1), as named terms: MaxLen of a scheme from a measured
profile's memory, the LNK terms every profile shares, and the bytes a rank holds under a plan (`rank_memory`,
what `run_plan --memory` and `hydraplan profiles memory` show). Analytic profiles store their terms
(SchemeMemory.*_terms, sources in the profile's notes as memory.NAME; hydraplan.core.analytic).

Stage r of a 1F1B pipeline holds pp - r micro-batches at its peak: pp - r - 1 of them as saved activations act_r(l)
= q*l^2 + p*l (q: attention kernels that materialize scores, ~0 with FlashAttention) and one in its backward, whose
peak peak_r(l) (saved activations plus the backward's working set, and its input on later stages, read from the
allocator's statistics) is fitted the same way plus a constant (buffers a backward allocates whatever the length);
with fixed bytes F_r the scheme's MaxLen is the largest l with F_r + (pp - r - 1) * act_r(l) + peak_r(l) <=
capacity on every stage. A measured profile carries no memory constants, so its MaxLen holds for any --gpus
(docs/formats.md). The runtime measures the memory at MEMORY_LENGTHS and then where MaxLen lands
(runtime/profile.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.fit import LENGTH_QUANTUM, PACKED_DOCS
from hydraplan.core.schema import ModelInfo, Profile, Scheme

MEMORY_LENGTHS = (128, 512, 1024, 2048)
LNK_PULL_DEPTH = 2  # layer groups a rank's LNK pull has in flight at most (runtime/lnk_streams.py)
LNK_PUSH_DEPTH = 2  # and its push


@dataclass(frozen=True)
class StageMemory:
    """One rank's memory measurement: fixed bytes, micro-batches stashed at the 1F1B peak, and the
    activation bytes of one micro-batch at each length."""

    stage: int
    fixed_bytes: float
    stash: int
    lengths: list[int]
    act_bytes: list[float]  # saved for backward by one micro-batch's forward
    peak_bytes: list[float]  # most bytes one micro-batch's forward + backward adds at once (saved + working set)
    lnk_bytes: float = 0.0  # LNK's in-flight buffers (lnk_terms), included in fixed_bytes


def activation_fit(lengths: Sequence[int], act_bytes: Sequence[float]) -> tuple[float, float]:
    """(q, p) of act(l) = q*l^2 + p*l, least squares with both nonnegative."""
    l = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(act_bytes, dtype=np.float64)
    (q, p), *_ = np.linalg.lstsq(np.column_stack([l * l, l]), y, rcond=None)
    if q < 0:
        q, p = 0.0, float(l @ y / (l @ l))
    elif p < 0:
        q, p = float((l * l) @ y / ((l * l) @ (l * l))), 0.0
    return float(q), float(p)


def peak_fit(lengths: Sequence[int], peak_bytes: Sequence[float]) -> tuple[float, float, float]:
    """(q, p, r) of peak(l) = q*l^2 + p*l + r, least squares with all three nonnegative (exact NNLS: the best
    of the 8 active sets). r is what a backward allocates whatever the length (its working buffers)."""
    l = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(peak_bytes, dtype=np.float64)
    cols = np.column_stack([l * l, l, np.ones_like(l)])
    best, best_res = np.zeros(3), float(y @ y)
    for mask in range(1, 8):
        use = [k for k in range(3) if mask >> k & 1]
        coef, *_ = np.linalg.lstsq(cols[:, use], y, rcond=None)
        if (coef < 0).any():
            continue
        res = float(np.sum((cols[:, use] @ coef - y) ** 2))
        if res < best_res:
            best, best_res = np.zeros(3), res
            best[use] = coef
    return float(best[0]), float(best[1]), float(best[2])


def stage_max_len(m: StageMemory, capacity_bytes: float) -> int:
    """Largest l with fixed + (stash - 1) * act(l) + peak(l) <= capacity: the stashed micro-batches' saved
    activations, and the one in backward at its peak."""
    qa, pa = activation_fit(m.lengths, m.act_bytes)
    qp, pk, r = peak_fit(m.lengths, m.peak_bytes)
    q, p = (m.stash - 1) * qa + qp, (m.stash - 1) * pa + pk
    if q <= 0 and p <= 0:
        raise UserError(f"stage {m.stage}: the measured activation and peak bytes do not grow with the length "
                        f"({m.peak_bytes}): the device's memory statistics saw no activations, so MaxLen is unknown")
    free = capacity_bytes - m.fixed_bytes - r
    if free <= 0:
        return 0
    # root of q l^2 + p l = free in the form without cancellation (a fitted q of 1e-18 is q = 0 here)
    return int(2 * free / (p + math.sqrt(p * p + 4 * q * free)))


def scheme_max_len(stages: Sequence[StageMemory], capacity_bytes: float) -> int:
    """MaxLen of a scheme: the tightest stage, a multiple of LENGTH_QUANTUM."""
    ml = min(stage_max_len(m, capacity_bytes) for m in stages) // LENGTH_QUANTUM * LENGTH_QUANTUM
    if ml < PACKED_DOCS * LENGTH_QUANTUM:
        raise UserError(f"memory_gib: {capacity_bytes / 2**30:g} GiB leaves room for only {ml} tokens per micro-batch "
                        f"(need at least {PACKED_DOCS * LENGTH_QUANTUM})", "memory_gib")
    return ml


@dataclass(frozen=True)
class MemoryTerm:
    """One named part of a rank's memory, in bytes, and where its number comes from."""

    name: str
    bytes: float
    source: str = ""


@dataclass(frozen=True)
class RankMemory:
    terms: tuple[MemoryTerm, ...]

    @property
    def total(self) -> float:
        return float(sum(t.bytes for t in self.terms))


LNK_SOURCE = {
    "lnk_pull": f"LNK pull in flight (runtime/lnk_streams.py): at most {LNK_PULL_DEPTH} layer groups, each a receive "
                "buffer (this rank's slice of the group, group/tp) and a send buffer (an owner's 1/N share of the group "
                "sent to every rank that holds it: at most the whole group), in the compute dtype",
    "lnk_push": f"LNK push in flight: at most {LNK_PUSH_DEPTH} layer groups, each a send buffer (this rank's "
                "contribution, group/tp) and a receive buffer (every replica's contribution to its owner share: at "
                "most the whole group), in the compute dtype; a group's buffers are freed once summed",
    "owner_gradient": "the owner shard's summed gradient (fp32), held from the start of the propagation while pushed "
                      "groups are summed into it, sharded over all N GPUs",
}


def layer_groups(model: ModelInfo) -> tuple[int, int, int] | None:
    """Parameters of LNK's layer groups (runtime/model.py param_groups): the embedding, one decoder layer, the
    final norm and the LM head; None when the profile does not give params, vocab and hidden."""
    if model.params is None or model.vocab is None:
        return None
    embedding = model.vocab * model.hidden
    head = embedding + model.hidden  # tied: the last stage holds a copy of the embedding as its head
    counted = head if not model.tied_embeddings else model.hidden  # what params counts besides the embedding
    return embedding, (model.params - embedding - counted) // model.layers, head


def lnk_terms(model: ModelInfo, tp: int, pp: int, stage: int | None, value_bytes: int) -> list[MemoryTerm]:
    """LNK's in-flight buffers of a rank on `stage` of a <tp, pp, *> pipeline (None: its worst stage), in a compute
    dtype of `value_bytes` per value: the bounded windows of runtime/lnk_streams.py. [] if the model is unknown."""
    groups = layer_groups(model)
    if groups is None:
        return []
    embedding, layer, head = groups

    def largest_held(s: int) -> int:
        return max([layer] + ([embedding] if s == 0 else []) + ([head] if s == pp - 1 else []))

    mine = max(largest_held(s) for s in (range(pp) if stage is None else [stage])) / tp
    every = max(groups)
    return [MemoryTerm("lnk_pull", LNK_PULL_DEPTH * (mine + every) * value_bytes, LNK_SOURCE["lnk_pull"]),
            MemoryTerm("lnk_push", LNK_PUSH_DEPTH * (mine + every) * value_bytes, LNK_SOURCE["lnk_push"])]


def rank_memory(profile: Profile, scheme: Scheme, stage: int, gpus: int, tokens: int,
                value_bytes: int = 4) -> RankMemory | None:
    """The profile's memory model for one rank of `scheme` on `stage` whose largest micro-batch has `tokens`,
    term by term. Measured profiles: the stage's fixed bytes, the micro-batches stashed for backward and the
    peak of the one in backward (measured_memory), plus LNK's buffers and the owner gradient in a compute
    dtype of `value_bytes` when the profile was measured before they were counted (no `lnk_bytes`); analytic
    profiles: their stored terms, the sharded ones over `gpus`, the per-token ones times `tokens` (the worst
    stage). None: the profile has neither."""
    measured = getattr(scheme, "measured_memory", None)
    if measured:
        m = next((e for e in measured if e["stage"] == stage), None)
        return None if m is None else RankMemory(tuple(_measured_terms(profile, scheme, m, gpus, tokens, value_bytes)))
    mem = scheme.memory
    if mem is None:
        return None
    notes = profile.notes or {}

    def named(terms: dict[str, float] | None, total: float, fallback: str, scale: float) -> list[MemoryTerm]:
        terms = terms or {fallback: total}
        return [MemoryTerm(k, v * scale, notes.get(f"memory.{k}", "")) for k, v in terms.items()]

    return RankMemory(tuple(named(mem.sharded_terms, mem.sharded_bytes, "sharded", 1 / gpus)
                            + named(mem.local_terms, mem.local_bytes, "local", 1.0)
                            + named(mem.token_terms, mem.act_bytes_per_token, "activations", float(tokens))))


def _measured_terms(profile: Profile, scheme: Scheme, m: dict, gpus: int, tokens: int, value_bytes: int) -> list[MemoryTerm]:
    act = m["act_bytes_per_token2"] * tokens**2 + m["act_bytes_per_token"] * tokens
    terms = [MemoryTerm("fixed", m["fixed_bytes"], "measured_memory.fixed_bytes: the stage's weights and gradients, "
                        "its 1/N share of the fp32 masters and AdamW states" + (", LNK's buffers and the owner gradient"
                                                                                 if "lnk_bytes" in m else ""))]
    if "peak_bytes_per_token" not in m:  # profiles measured before the peak: all stashed micro-batches alike
        terms.append(MemoryTerm("stashed_activations", m["stash"] * act, "measured: saved for backward"))
    else:
        peak = m["peak_bytes_per_token2"] * tokens**2 + m["peak_bytes_per_token"] * tokens + m["peak_bytes"]
        terms += [MemoryTerm("stashed_activations", (m["stash"] - 1) * act,
                             "measured: what a micro-batch waiting for its backward holds, times the others in flight"),
                  MemoryTerm("backward_peak", peak, "measured: the most one micro-batch's forward and backward add")]
    if "lnk_bytes" not in m:
        terms += lnk_terms(profile.model, scheme.tp, scheme.pp, m["stage"], value_bytes)
        if profile.model.params is not None:
            terms.append(MemoryTerm("owner_gradient", profile.model.params * 4 / gpus, LNK_SOURCE["owner_gradient"]))
    return terms


def rank_memory_bytes(profile: Profile, scheme: Scheme, stage: int, gpus: int, tokens: int,
                      value_bytes: int = 4) -> float | None:
    """`rank_memory`'s total (None: no model)."""
    mem = rank_memory(profile, scheme, stage, gpus, tokens, value_bytes)
    return None if mem is None else mem.total
