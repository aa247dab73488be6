"""The decoder: canonical parameters, stage slicing, packing, and TP == non-TP numerically."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from helpers import free_port, init_gloo
from ranks import spawn

from hydraplan.runtime.batches import IGNORE, TokenData
from hydraplan.runtime.groups import exit_process
from hydraplan.runtime.memstats import heap_bytes, map_large_allocations
from hydraplan.runtime.model import (
    CONFIGS,
    StageModule,
    TPGroup,
    check_layout,
    init_full,
    load_full,
    param_specs,
    stage_param_indices,
    tp_slice,
)
from hydraplan.schema import BatchSeq

TINY = CONFIGS["tiny"]
GQA = replace(TINY, name="tiny-gqa", heads=4, kv_heads=2)


def pack(pairs, vocab=TINY.vocab):
    """A micro-batch of synthetic sequences given as (id, length) pairs."""
    return TokenData(vocab).pack([BatchSeq(id=i, length=n) for i, n in pairs])


def full_params(cfg, seed=0, dtype=torch.float64):
    return [init_full(s, i, seed, dtype) for i, s in enumerate(param_specs(cfg))]


def full_model(cfg, seed=0):
    m = StageModule(cfg, dtype=torch.float64)
    load_full(m, full_params(cfg, seed))
    return m


def test_llama2_configs_have_the_published_parameter_counts():
    assert sum(s.numel for s in param_specs(CONFIGS["llama2-7b"])) == 6_738_415_616
    assert sum(s.numel for s in param_specs(CONFIGS["llama2-13b"])) == 13_015_864_320


def test_every_parameter_lives_on_exactly_one_stage():
    for pp in (1, 2, 3, 4):
        held = sorted(i for s in range(pp) for i in stage_param_indices(TINY, pp, s))
        assert held == list(range(len(param_specs(TINY))))
    assert check_layout(TINY, 3, 1) is not None and check_layout(TINY, 1, 5) is not None
    assert check_layout(TINY, 4, 4) is None


def test_pack_restarts_positions_and_shifts_labels_per_document():
    mb = pack([(11, 3), (5, 2)])
    assert mb.positions.tolist() == [0, 1, 2, 0, 1]
    assert mb.cu_seqlens.tolist() == [0, 3, 5] and mb.max_seqlen == 3
    again = pack([(5, 2)])
    assert mb.tokens[3:].tolist() == again.tokens.tolist() and mb.labels[3:].tolist() == again.labels.tolist()
    assert mb.tokens[1:3].tolist() == mb.labels[0:2].tolist()


def test_head_loss_is_summed_cross_entropy_skipping_ignored_labels():
    gen = torch.Generator().manual_seed(4)
    model = full_model(TINY)
    x = torch.randn(6, TINY.hidden, generator=gen, dtype=torch.float64)
    labels = torch.tensor([3, IGNORE, 127, 0, IGNORE, 64])
    want = torch.nn.functional.cross_entropy(x @ model.head.weight.T, labels, ignore_index=IGNORE, reduction="sum")
    torch.testing.assert_close(model.head(x, labels), want, rtol=1e-14, atol=0)


def test_packed_documents_train_like_separate_ones():
    seqs = [(1, 7), (2, 3), (3, 5)]
    model = full_model(TINY)
    packed = model(None, pack(seqs))
    packed.backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    separate = sum(model(None, pack([s])) for s in seqs)
    separate.backward()
    torch.testing.assert_close(packed, separate, rtol=1e-13, atol=0)
    for g, p in zip(packed_grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=1e-13)


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_chained_stages_equal_the_full_model(pp):
    mb = pack([(4, 9), (8, 6)])
    full = full_model(TINY)
    want = full(None, mb)
    want.backward()
    params = full_params(TINY)
    stages = [StageModule(TINY, pp=pp, stage=s, dtype=torch.float64) for s in range(pp)]
    x = None
    for st in stages:
        load_full(st, params)
        x = st(x, mb)
    x.backward()
    torch.testing.assert_close(x, want, rtol=0, atol=1e-13)
    full_grads = dict(full.named_parameters())
    for st in stages:
        for name, p in st.named_parameters():
            torch.testing.assert_close(p.grad, full_grads[name].grad, rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------- activation recomputation
def _held_bytes(model: StageModule, mb) -> tuple[int, dict[str, torch.Tensor]]:
    """Heap bytes a micro-batch's forward leaves held for its backward, and the gradients of its backward."""
    map_large_allocations()
    gc.collect()
    start = heap_bytes()
    loss = model(None, mb)
    held = heap_bytes() - start
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return held, grads


@pytest.mark.skipif(heap_bytes() is None, reason="needs glibc's allocator statistics")
def test_recomputation_trains_exactly_and_keeps_less():
    """Selective and full recomputation give the gradients of no recomputation (fp64), and a micro-batch's
    forward keeps less for the backward: selective drops the SwiGLU product (no recomputation keeps the gate, the
    up projection and their product, not silu: runtime/recompute.py), full all but each layer's input."""
    mb = pack([(3, 300), (9, 150), (1, 70)])
    held, grads = {}, {}
    for mode in ("none", "selective", "full"):
        model = StageModule(TINY, dtype=torch.float64, recompute=mode)
        load_full(model, full_params(TINY))
        _held_bytes(model, mb)  # the first run also allocates what every later one reuses
        held[mode], grads[mode] = _held_bytes(model, mb)
    for mode in ("selective", "full"):
        for name, g in grads["none"].items():
            torch.testing.assert_close(grads[mode][name], g, rtol=0, atol=1e-13, msg=f"{mode} {name}")
    product = TINY.layers * 520 * TINY.ffn * 8  # the SwiGLU product, fp64, every layer
    assert 0.9 * product <= held["none"] - held["selective"] <= 1.1 * product
    assert held["full"] < 0.5 * held["selective"]


# ------------------------------------------------------------------------------- tensor parallelism
def _tp_worker(rank: int, world: int, port: int) -> None:
    init_gloo(rank, world, port)
    try:
        tp = TPGroup(dist.group.WORLD, world, rank)
        mb = pack([(3, 10), (9, 4), (1, 7)])  # 21 tokens: the last SP rank's rows are padded
        for cfg, mode in ((TINY, "none"), (GQA, "none"), (TINY, "selective"), (TINY, "full")):
            params = full_params(cfg, seed=1)
            ref = StageModule(cfg, dtype=torch.float64)
            load_full(ref, params)
            want = ref(None, mb)
            want.backward()
            sharded = StageModule(cfg, tp=tp, dtype=torch.float64, recompute=mode)
            load_full(sharded, params, world, rank)
            got = sharded(None, mb)
            got.backward()
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            specs = param_specs(cfg)
            for i, p, rp in zip(sharded.param_indices, sharded.ordered_params(), ref.ordered_params()):
                if not specs[i].sharded:  # a norm weight: each TP rank holds its tokens' part (LNK push sums them)
                    dist.all_reduce(p.grad)
                torch.testing.assert_close(p.grad, tp_slice(rp.grad, specs[i], world, rank), rtol=0, atol=1e-12)
        first = StageModule(TINY, pp=2, stage=0, tp=tp, dtype=torch.float64)
        load_full(first, full_params(TINY), world, rank)
        assert first(None, mb).shape == (11, TINY.hidden)  # sequence parallel: ceil(21 / 2) rows per TP rank
    finally:
        dist.destroy_process_group()
    exit_process(0)


@pytest.mark.slow
def test_tensor_parallel_model_equals_single_device_model():
    """Loss and every shard's gradient with TP=2 and sequence parallelism (MHA and GQA; no, selective and
    full recomputation) match the unsharded model in fp64 (a norm weight's as the sum of the TP ranks' parts); a
    stage hands on its TP rank's rows only."""
    spawn(_tp_worker, (2, free_port()), 2)
