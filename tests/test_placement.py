"""Rank placement: disjoint ranks in [0, N), TP and TP x CP groups and small pipelines inside a node."""

from __future__ import annotations

import numpy as np
import pytest

from hydraplan.core.errors import UserError
from hydraplan.schema import PipelineSpec
from hydraplan.solve.placement import family, groups_per_rank, place_ranks, process_groups

SHAPES = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (4, 1, 1), (2, 2, 1), (2, 1, 2), (8, 1, 1), (4, 2, 1),
          (2, 1, 4), (8, 2, 1), (4, 4, 1), (8, 1, 2), (16, 1, 1)]


def random_pipelines(rng: np.random.Generator, gpus: int) -> list[PipelineSpec]:
    out, used = [], 0
    for _ in range(200):
        tp, pp, cp = SHAPES[int(rng.integers(len(SHAPES)))]
        if used + tp * pp * cp <= gpus:
            out.append(PipelineSpec(tp=tp, pp=pp, cp=cp))
            used += tp * pp * cp
    return out


def check_node_rules(pipelines: list[PipelineSpec], gpus: int, gpn: int) -> None:
    ranks = [r for p in pipelines for r in p.ranks]
    assert len(ranks) == len(set(ranks)) and all(0 <= r < gpus for r in ranks)
    for p in pipelines:
        node = [r // gpn for r in p.ranks]
        if p.gpus <= gpn:
            assert len(set(node)) == 1, f"{p.key} straddles nodes: {p.ranks}"
        group = p.tp * p.cp
        for s in range(p.pp):  # the order of docs/formats.md: ranks[(s*cp + c)*tp + t]
            stage = p.ranks[s * group:(s + 1) * group]
            if group <= gpn:
                assert len({r // gpn for r in stage}) == 1, f"stage {s} of {p.key} straddles: {stage}"
            for c in range(p.cp):
                tp_group = stage[c * p.tp:(c + 1) * p.tp]
                if p.tp <= gpn:
                    assert len({r // gpn for r in tp_group}) == 1


@pytest.mark.parametrize("seed", range(25))
def test_random_strategies_respect_nodes(seed):
    rng = np.random.default_rng(seed)
    gpn = [4, 8, 8, 16][seed % 4]
    gpus = gpn * int(rng.integers(1, 9))
    pipes = random_pipelines(rng, gpus)
    placed = place_ranks(pipes, gpus, gpn)
    assert [p.key for p in placed] == [p.key for p in pipes]  # order kept
    check_node_rules(placed, gpus, gpn)
    for p in placed:  # every stage on an aligned block, so every group in the family
        S = p.tp * p.cp
        for s in range(p.pp):
            stage = p.ranks[s * S:(s + 1) * S]
            assert stage[0] % S == 0 and stage == list(range(stage[0], stage[0] + S)), (p.key, p.ranks)
    assert process_groups(placed) <= set(family({p.key for p in placed}, gpus))


def test_family_is_every_group_of_every_aligned_placement():
    keys = [(2, 1, 1), (1, 2, 2), (2, 1, 2), (4, 1, 2), (8, 1, 1)]
    gpus = 24
    every = set()
    for tp, _, cp in keys:  # one pipeline on each aligned block, each time
        S = tp * cp
        every |= process_groups(PipelineSpec(tp=tp, pp=1, cp=cp, ranks=list(range(x, x + S)))
                                for x in range(0, gpus - S + 1, S))
    fam = family(keys, gpus)
    assert len(fam) == len(set(fam)) and set(fam) == every
    assert family(keys, gpus) == fam  # a fixed order: every rank creates its groups in it


def test_groups_per_rank_by_hand():
    fam = family([(2, 1, 1), (1, 1, 2), (2, 1, 2)], 8)
    # TP pairs [0,1] [2,3] [4,5] [6,7] (the <1,1,2> CP pairs are the same sets), <2,1,2> CP pairs [0,2] [1,3] [4,6] [5,7]
    assert sorted(fam) == [(0, 1), (0, 2), (1, 3), (2, 3), (4, 5), (4, 6), (5, 7), (6, 7)]
    assert groups_per_rank(fam, 8).tolist() == [2] * 8


def test_partial_last_node_and_unused_gpus():
    pipes = [PipelineSpec(tp=4, pp=1, cp=1), PipelineSpec(tp=2, pp=1, cp=1), PipelineSpec(tp=2, pp=1, cp=1)]
    placed = place_ranks(pipes, 12, 8)  # nodes {0..7}, {8..11}
    check_node_rules(placed, 12, 8)
    assert sorted(r for p in placed for r in p.ranks) == list(range(8))


def test_large_pipeline_takes_whole_nodes_from_a_boundary():
    pipes = [PipelineSpec(tp=2, pp=1, cp=1), PipelineSpec(tp=8, pp=2, cp=1)]
    placed = place_ranks(pipes, 32, 8)
    big = placed[1].ranks
    assert big[0] % 8 == 0 and big == list(range(big[0], big[0] + 16))
    check_node_rules(placed, 32, 8)


def test_given_ranks_are_kept_and_avoided():
    fixed = PipelineSpec(tp=2, pp=1, cp=1, ranks=[0, 5])
    placed = place_ranks([fixed, PipelineSpec(tp=4, pp=1, cp=1), PipelineSpec(tp=2, pp=1, cp=1)], 16, 8)
    assert placed[0].ranks == [0, 5]
    others = [r for p in placed[1:] for r in p.ranks]
    assert not {0, 5} & set(others) and len(others) == len(set(others)) == 6
    assert len({r // 8 for r in placed[1].ranks}) == 1


def test_fragmented_node_falls_back_to_disjoint_ranks():
    pipes = [PipelineSpec(tp=6, pp=1, cp=1), PipelineSpec(tp=6, pp=1, cp=1), PipelineSpec(tp=4, pp=1, cp=1)]
    placed = place_ranks(pipes, 16, 8)  # 6+6 leave 2+2: the 4-GPU pipeline must straddle
    ranks = [r for p in placed for r in p.ranks]
    assert sorted(ranks) == list(range(16))


def test_errors():
    with pytest.raises(UserError, match="needs 16 GPUs"):
        place_ranks([PipelineSpec(tp=8, pp=2, cp=1)], 8, 8)
    with pytest.raises(UserError, match="rank 9 is outside"):
        place_ranks([PipelineSpec(tp=2, pp=1, cp=1, ranks=[1, 9])], 8, 8)
    with pytest.raises(UserError, match="rank 1 is used twice"):
        place_ranks([PipelineSpec(tp=2, pp=1, cp=1, ranks=[0, 1]), PipelineSpec(tp=2, pp=1, cp=1, ranks=[1, 2])], 8, 8)
