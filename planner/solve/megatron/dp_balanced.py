"""Megatron-LM's sequence-packing scheduler `dp_balanced` (`DpBalancedScheduler`, Megatron-LM dev at d48bd6b; main's
differs only in taking no `max_num_seqs`), written from its documented behaviour so `python -m bench megatron` can
run it without Megatron; tests/test_megatron_packing.py checks the contract its code states and
tests/test_megatron_dcp.py its outputs recorded from dev's code.

Documents are packed in batch order, each pack closing when the next document would take it past the capacity
(`max_seqlen_per_dp_cp_rank * cp` tokens) or, with `max_num_seqs`, when it holds that many documents. While the
pack count is not a multiple of dp x the VPP micro-batch group, the last document of the last pack holding more
than one moves into a new pack of its own (walking back to earlier packs once a pack is down to one). Pack
i*dp + d is micro-batch i of DP replica d, and each of the replica's cp ranks lists it.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydraplan.core.errors import UserError


def dp_balanced_packs(lengths: Sequence[int], capacity: int, multiple: int, max_num_seqs: int | None = None
                      ) -> list[list[int]]:
    """The packs, as positions into `lengths`, in the order dp_balanced deals them."""
    packs: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, l in enumerate(lengths):
        if used + int(l) <= capacity and (max_num_seqs is None or len(cur) < max_num_seqs):
            cur.append(i)
            used += int(l)
        else:
            packs.append(cur)
            cur, used = [i], int(l)
    if cur:
        packs.append(cur)
    missing = -len(packs) % multiple
    k = len(packs) - 1
    while missing:
        if k < 0:
            raise UserError(f"dp_balanced: {len(lengths)} documents cannot fill a multiple of {multiple} packs")
        if len(packs[k]) > 1:
            packs.append([packs[k].pop()])
            missing -= 1
        else:
            k -= 1
    return packs


def deal(packs: Sequence[list[int]], dp: int, cp: int) -> list[list[list[int]]]:
    """sample_id_groups: [micro-batch][dp*cp rank], pack i*dp + d on the cp ranks of replica d."""
    return [[list(packs[i * dp + j // cp]) for j in range(dp * cp)] for i in range(len(packs) // dp)]


def dp_balanced_schedule(lengths: Sequence[int], capacity: int, dp: int, cp: int, group: int | None = None,
                         max_num_seqs: int | None = None) -> list[list[list[int]]]:
    """What DpBalancedScheduler.get_groups_and_subsamples returns for these lengths (group: the VPP micro-batch
    group size, None without VPP; max_num_seqs: the documents a pack may hold, None: any)."""
    if any(int(l) > capacity for l in lengths):
        raise UserError(f"dp_balanced: a document of {max(lengths)} tokens is longer than a pack ({capacity})")
    return deal(dp_balanced_packs(lengths, capacity, dp * (group or 1), max_num_seqs), dp, cp)
