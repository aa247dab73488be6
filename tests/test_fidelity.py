"""The cost model against the published GPU measurements (data/published): every point the model is claimed to hold for
lands within 15% of its published value, every point left out says why and carries its prediction where one can be
made, and the pieces behind the predictions agree with hand computations."""

import math

import numpy as np
import pytest

from hydraplan.core import collectives as nccl
from hydraplan.core.flopcount import flops_per_token
from hydraplan.core.frameworks import MEGATRON
from hydraplan.core.hardware import GPUS, H100, MODELS
from hydraplan.core.iteration import Job, ddp_allreduce_s, iteration_from_propagation, optimizer_s, propagation_s
from hydraplan.core.kernelrates import CAUSAL_TILE, attention_rate, kernel_tflops
from hydraplan.methods import fidelity_dcp as dcp
from hydraplan.methods.fidelity_dcp import predictions
from hydraplan.schema import Scheme, TimeCoeffs
from hydraplan.store.fidelity import convention, predict_iteration

BOUND, MEDIAN = 0.15, 0.08


@pytest.fixture(scope="module")
def preds():
    return predictions()


def test_every_published_point_is_predicted_within_15_percent(preds):
    kept = [p for p in preds if p.excluded is None]
    assert len(kept) >= 40 and len({p.source for p in kept}) >= 4
    assert all(p.ratio is not None for p in kept)
    bad = [(p.source, p.point.id, round(p.ratio, 3)) for p in kept if abs(p.ratio - 1) > BOUND]
    assert not bad, bad
    for kind in ("kernel", "iteration", "collective"):
        err = [abs(p.ratio - 1) for p in kept if p.kind == kind]
        assert err and float(np.median(err)) <= MEDIAN, kind


def test_points_left_out_say_why_and_carry_their_prediction(preds):
    """A left-out point has a reason, and a prediction unless none can be made: a TFLOP/s or MFU by a formula its
    source does not state. The ones the issue names are among the predicted."""
    out = [p for p in preds if p.excluded is not None]
    assert out and all(p.excluded.strip() for p in out)
    missing = [p for p in out if p.predicted is None]
    assert all(p.point.quantity in ("tflops_per_gpu", "mfu") and convention(p.point.config.flops) is None
               for p in missing), [p.point.id for p in missing]
    predicted = {(p.source, p.point.id) for p in out if p.predicted is not None and p.ratio > 0}
    for source, words in (("megatron-lm-dynamic-cp", ""), ("torchtitan-llama3-h100-202412", "-cp"),
                          ("torchtitan-asynctp-h100-202506", "rowwise"), ("aws-p5-efa-scaling-nccl", "")):
        mine = {(p.source, p.point.id) for p in preds if p.source == source and words in p.point.id and p.excluded}
        assert mine and mine <= predicted, source
    # the CP rows left out because the model misses them by more than 15% at CP 4-8
    cp = {p.point.id: p.ratio for p in out if p.source == "torchtitan-llama3-h100-202412"}
    assert cp and max(cp.values()) > 1 + BOUND


def test_an_assumed_prediction_says_what_it_assumes(preds):
    """torchao's rowwise FP8 is predicted at the tensorwise rate: exactly what its tensorwise twin (same layout) gets;
    torchtitan's interleaved row with its default 2 stages per rank, between 1F1B's (1 stage) and 4 stages'."""
    by = {(p.source, p.point.id): p for p in preds}
    for row in ("70b-256gpu-fp8-rowwise-async-tp", "8b-64gpu-fp8-rowwise-vanilla-tp"):
        p = by[("torchtitan-asynctp-h100-202506", row)]
        twin = by[("torchtitan-asynctp-h100-202506", row.replace("rowwise", "tensorwise"))]
        assert p.excluded and "tensorwise" in p.predicted_as and twin.excluded is None
        assert p.predicted == pytest.approx(twin.predicted, rel=1e-12)
    inter = by[("torchtitan-llama3-h100-202412", "t5-405b-512gpu-interleaved-1f1b")]
    one = by[("torchtitan-llama3-h100-202412", "t5-405b-512gpu-1f1b")]
    assert inter.excluded is None and "2 stages per rank" in inter.predicted_as
    four, _, _ = predict_iteration(inter.point.config.model_copy(update={"vp": 4}), inter.point.quantity)
    assert one.predicted < inter.predicted < four


def test_dynamic_cp_benchmark_is_propagation_plus_ddp_and_optimizer(preds):
    """Each benchmark point is the script's statistic of its iterations, each the executor's propagation plus DDP's
    fp32 all-reduce over every GPU and the optimizer step over every parameter, nothing else (no fitted constant);
    the points stay out with the measured and predicted milliseconds in their reason; the speedups are the
    predictions' ratios."""
    mine = {p.point.id: p for p in preds if p.source == dcp.SOURCE}
    assert len(mine) == 20
    gpu, params = GPUS["h100"], dcp.model_by_name("megatron-dcp-bench").params
    for pid, p in mine.items():
        scheduler, gpus, kind = dcp.parse(p.point)
        assert set(p.terms) == {"propagation_s", "dp_sync_s", "optimizer_s"}
        assert p.predicted == pytest.approx(sum(p.terms.values()), rel=1e-12)
        group = min(gpus, 4)  # TP 1: every GPU of a 4-GPU node is in the DP x CP group
        assert p.terms["dp_sync_s"] == pytest.approx(nccl.collective_s(gpu, "all_reduce", gpus, group, params * 4))
        assert p.terms["optimizer_s"] == pytest.approx(
            params * MEGATRON.optimizer_bytes_per_param / (gpu.hbm_gb_s * 1e9 * MEGATRON.memory_efficiency))
        assert p.excluded and f"measured {p.point.value * 1e3:.0f} ms" in p.excluded and "No per-iteration constant" in p.excluded
        times = [t.total_s for t in dcp.iteration_times(scheduler, gpus)]
        assert len(times) == 20
        want = np.mean(sorted(times)[2:18]) if kind == "trimmed" else np.mean(times)
        assert p.predicted == pytest.approx(want, rel=1e-12)
    for x in dcp.speedups(preds):
        base, fast = mine[f"dp_balanced-{x.gpus}gpu-{x.statistic}"], mine[f"dcp-{x.gpus}gpu-{x.statistic}"]
        assert x.predicted == pytest.approx(base.predicted / fast.predicted)
        assert x.published == pytest.approx(base.point.value / fast.point.value)


def test_megatron_draws_each_batch_rank_by_rank():
    """Global batch 1 of 2 DP ranks with 3 micro-batches: samples 6-11, rank 0 takes 6, 8, 10 and rank 1 7, 9, 11,
    gathered rank after rank."""
    assert dcp.batch_samples(1, 2, 3).tolist() == [6, 8, 10, 7, 9, 11]
    assert dcp.batch_samples(0, 1, 4).tolist() == [0, 1, 2, 3]


def test_trimmed_mean_drops_a_tenth_at_each_end():
    v = np.array([5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 100.0])
    assert sorted(v[dcp.trimmed_indices(v)].tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert len(dcp.trimmed_indices(v[:9])) == 9  # int(0.9) = 0: nothing dropped


def test_ddp_allreduces_every_gradient_in_fp32_unhidden():
    """Without a distributed optimizer: one all-reduce of the stage's fp32 gradients over DP x CP, whatever the
    propagation (nothing hides it), and every replica steps its whole stage."""
    gpu = GPUS["h100"]
    job = Job(gpus=32, gpus_per_node=8, tp=2, pp=2, cp=2, dp=4, seq_len=4096, global_batch=32, micro_batch=1,
              grad_sync="ddp")
    params = 7_000_000_000
    want = nccl.collective_s(gpu, "all_reduce", 8, 4, params / 4 * 4)
    assert ddp_allreduce_s(params, gpu, job) == pytest.approx(want)
    model = MODELS["llama2-7b"]
    short, long = (iteration_from_propagation(t, model, job, gpu, MEGATRON, False) for t in (0.1, 100.0))
    assert short.dp_sync_s == long.dp_sync_s == pytest.approx(ddp_allreduce_s(model.params, gpu, job))
    sharded = Job(**{**job.__dict__, "grad_sync": "distributed-optimizer"})
    assert optimizer_s(params, job, gpu, MEGATRON) == pytest.approx(8 * optimizer_s(params, sharded, gpu, MEGATRON))
    assert ddp_allreduce_s(params, gpu, Job(**{**job.__dict__, "dp": 1, "cp": 1, "gpus": 4})) == 0.0


def test_kernel_rate_by_hand():
    """FA3 forward on H100: efficiency e and half h give e*P*s/(s+h) without the mask and e*P*s/(s+128+2h) with it."""
    r = attention_rate("h100", "flash-attention-3")
    e, h = r.fwd_efficiency * 989.4, r.fwd_half
    assert kernel_tflops(r, 989.4, "forward", False, 2048) == pytest.approx(e * 2048 / (2048 + h))
    assert kernel_tflops(r, 989.4, "forward", True, 2048) == pytest.approx(e * 2048 / (2048 + CAUSAL_TILE + 2 * h))
    # forward+backward: 3.5 forward FLOPs over the two passes' times
    f = kernel_tflops(r, 989.4, "forward", False, 4096)
    b = kernel_tflops(r, 989.4, "backward", False, 4096)
    assert kernel_tflops(r, 989.4, "forward+backward", False, 4096) == pytest.approx(3.5 / (1 / f + 2.5 / b))


def test_collective_picks_the_fastest_protocol():
    """All-reduce on 8 H100 (NVLS: no hops, a fixed algorithm bandwidth) and on 4; an all-gather ring's n-1 hops at most
    at the ring's bandwidth; across nodes a hierarchical all-reduce whose nodes' NICs carry 2(k-1)/k of their share."""
    node, net, size = H100.node_fabric, H100.net_fabric, 2**26
    nvls = [(p.latency_s, p.busbw_GBps * 1e9) for p in node.protocols]
    assert nccl.collective_s(H100, "all_reduce", 8, 8, size) == pytest.approx(min(a + size * 1.75 / b for a, b in nvls))
    assert nccl.collective_s(H100, "all_reduce", 4, 8, size) == pytest.approx(min(a + size * 1.75 / b for a, b in nvls))
    ring = min(a + 3 * node.hop_s + size * 0.75 / min(b, node.ring_GBps * 1e9) for a, b in nvls)
    assert nccl.collective_s(H100, "all_gather", 4, 8, size) == pytest.approx(ring)
    k, n = 4, 32
    over_nodes = 8 * net.nic_GBps * (2 * (n - 1) / n) / (2 * (k - 1) / k) * 1e9
    want = min(p.latency_s + 2 * math.log2(k) * net.hop_s
               + size * 2 * (n - 1) / n / min(p.busbw_GBps * 1e9, node.protocols[-1].busbw_GBps * 1e9, over_nodes)
               for p in net.protocols)
    assert nccl.collective_s(H100, "all_reduce", n, 8, size) == pytest.approx(want)
    assert nccl.collective_s(H100, "all_gather", 1, 8, size) == 0.0


def test_flop_conventions_by_hand():
    m = MODELS["llama2-7b"]
    L, h, f, V, s = m.layers, m.hidden, m.ffn, m.vocab, 4096
    assert flops_per_token("nemo", m, s) == pytest.approx(L * h * h * (12 + 12 + 18 * f / h + 12 * s / h + 6 * V / (L * h)))
    assert flops_per_token("torchtitan", m, s) == pytest.approx(6 * (m.params - V * h) + 12 * L * h * s)
    assert flops_per_token("megatron-bridge", m, s, tp=2) == pytest.approx(
        18 * L * h * f + 12 * L * h * h * (2 + s / (2 * h)) + 6 * h * math.ceil(V / 256) * 256)


def test_pipeline_and_interleaving():
    """1F1B is the canonical pipeline formula; interleaving shrinks the bubble."""
    s = Scheme(tp=1, pp=4, cp=1, max_len=8192, util_len=1, time=TimeCoeffs(a=0.0, b=1e-5, c=0.0))
    job = Job(gpus=16, gpus_per_node=8, tp=1, pp=4, cp=1, dp=4, seq_len=4096, global_batch=64, micro_batch=1)
    t = 4096 * 1e-5
    assert propagation_s(s, job) == pytest.approx((16 + 3) * t)
    interleaved = propagation_s(s, Job(**{**job.__dict__, "vp": 4}))
    assert 16 * t < interleaved < (16 + 3) * t


def test_optimizer_step_is_its_bytes_at_hbm_bandwidth():
    job = Job(gpus=64, gpus_per_node=8, tp=4, pp=2, cp=1, dp=8, seq_len=4096, global_batch=64, micro_batch=1)
    gpu = GPUS["h100"]
    owned = 7e9 / (4 * 2 * 8)
    assert optimizer_s(7_000_000_000, job, gpu, MEGATRON) == pytest.approx(
        owned * MEGATRON.optimizer_bytes_per_param / (gpu.hbm_gb_s * 1e9 * MEGATRON.memory_efficiency))
