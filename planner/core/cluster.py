"""What a job of N GPUs sees of a profile: the schemes that fit, MaxLen recomputed for N (appendix C.1:
fp32 master weights and optimizer states are sharded over all N GPUs)."""

from __future__ import annotations

from hydraplan.core.errors import UserError
from hydraplan.core.schema import Profile, Scheme, SchemeMemory


# --------------------------------------------------------------------------------- profiles / MaxLen
def max_len_for_gpus(profile: Profile, scheme: Scheme, gpus: int) -> int:
    """MaxLen of a scheme when the fp32 optimizer states are sharded over `gpus` GPUs.

    A scheme without memory constants (hand-written or measured) keeps its stated max_len for any N.
    """
    if scheme.memory is None or profile.memory is None:
        return scheme.max_len
    return max_len_from_memory(profile.memory.capacity_bytes, scheme.memory, gpus)


def max_len_from_memory(capacity_bytes: float, m: SchemeMemory, gpus: int) -> int:
    """Appendix C.1: the l at which sharded/N + local + per_token*l reaches the usable capacity."""
    free = capacity_bytes - m.sharded_bytes / gpus - m.local_bytes
    return max(0, int(free // m.act_bytes_per_token))


MAX_JOB_GPUS = 1 << 16  # how far for_gpus looks for the smallest job a profile's model fits in


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
            schemes.append(s.model_copy(update={"max_len": ml, "util_len": min(s.util_len, ml)}))
    if not schemes:  # too few GPUs for any scheme, or for the sharded weights and optimizer states
        need = next((n for n in range(gpus + 1, MAX_JOB_GPUS + 1)
                     if any(s.gpus <= n and max_len_for_gpus(profile, s, n) > 0 for s in profile.schemes)), None)
        smallest = f" (the smallest job it fits has {need} GPUs)" if need else ""
        raise UserError(f"profile {profile.name}: no scheme fits in {gpus} GPUs{smallest}")
    return profile.model_copy(update={"schemes": schemes})
