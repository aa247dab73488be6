"""Megatron-LM dev's dynamic-CP benchmark (data/published/megatron-lm-dynamic-cp.json) predicted as its script runs it
(examples/dynamic_context_parallel/benchmark_dcp.sh and README.md, and the flags' defaults in
megatron/training/arguments.py, dev at d48bd6b): a 12-layer, hidden-2048 GPT, TP 1, CP 4, PP 1, 4 GPUs per node,
8 micro-batches of one sample per DP replica, --max-seqlen-per-dp-cp-rank 2048, 30 iterations of which the first 10
are dropped, the 10% trimmed mean and the mean of the other 20.

Each measured iteration's global batch is the lognormal mock dataset's samples in the order Megatron draws them
(`batch_samples`), padded as its varlen dataset pads them, scheduled by Megatron's own scheduler (dp_balanced at CP 4,
default_dynamic_cp) and scored by that executor (core.executors: MegatronPacking's slowest replica, DynamicCP's
chained micro-batches) on the bundled h100-megatron-dcp-bench profile; to that propagation core.iteration adds what
the script's flags leave exposed: without --use-distributed-optimizer and --overlap-grad-reduce, one fp32 all-reduce
of every gradient over the DP x CP ranks after the backward, and the optimizer step over every parameter on every GPU.
Nothing is fitted to the measurements. The points stay out of the 15% set with the gap they show and what the model
does not contain (`GAP`); their dynamic-CP over dp_balanced speedups are compared in `speedups`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hydraplan.core.executors import (
    DynamicCP,
    MegatronPacking,
    dynamic_cp_padded,
    dynamic_cp_time,
    packing_padded,
)
from hydraplan.core.hardware import GPUS
from hydraplan.core.iteration import IterationTime, Job, iteration_from_propagation
from hydraplan.core.published import IterationConfig, Point
from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule
from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule
from hydraplan.store import fidelity
from hydraplan.store.datasets import load_dataset
from hydraplan.store.profiles import framework_spec, load_profile, model_by_name

SOURCE = "megatron-lm-dynamic-cp"
PROFILE = "h100-megatron-dcp-bench"
DATASET = "lognormal:mean=1024,sigma=1.5,min=128,max=8192"  # VARLEN_DATASET_JSON's default, the mock dataset's draw
TP, CP, LIMIT, MICRO_BATCHES = 1, 4, 2048, 8  # TP_SIZE, CP_SIZE, MAX_SEQLEN_PER_DP_CP_RANK, NUM_MICROBATCHES
WARMUP, ITERATIONS, TRIM = 10, 30, 0.1  # WARMUP_ITERS, TRAIN_ITERS; the script's 10% trimmed mean
SCHEDULERS = ("dp_balanced", "dcp")
STATISTICS = ("trimmed", "mean")
POINT_ID = re.compile(r"^(dp_balanced|dcp)-(\d+)gpu-(trimmed|mean)$")

GAP = ("what fills the rest the model does not contain: the GPU, which the source does not state (four per node under "
       "a NeMo 26.02 container, recorded as h100; GB200 trays also hold four); the host work Megatron's THD path does "
       "every iteration (each DP rank collating its 8 samples in the main process, --num-workers 0; gathering every "
       "rank's lengths, the scheduler, rerouting samples between ranks, building the packed micro-batches and "
       "broadcasting their sizes: data_schedule.py's run), Transformer Engine's per-sequence THD attention and CP "
       "kernels, logging every iteration (--log-interval 1 with --log-throughput), and the per-token loss's token-count "
       "all-reduce and gradient scaling pass (--calculate-per-token-loss). No per-iteration constant is fitted to close it")


def batch_samples(iteration: int, dp: int, micro_batches: int) -> np.ndarray:
    """The dataset positions global batch `iteration` (from 0) of a run from the start trains, in the order Megatron's
    packing schedulers see them (micro-batches of one sample): MegatronPretrainingSampler (--dataloader-type single)
    hands DP rank d the d-th of every dp consecutive samples, each rank fetches its `micro_batches`, and
    get_batch_and_global_seqlens gathers them rank after rank (megatron/training/datasets/data_samplers.py,
    megatron/core/datasets/data_schedule_utils.py); the mock dataset's training split is its samples in order."""
    rank, j = np.divmod(np.arange(dp * micro_batches), micro_batches)
    return iteration * dp * micro_batches + j * dp + rank


def trimmed_indices(values: np.ndarray, share: float = TRIM) -> np.ndarray:
    """The iterations the script's trimmed mean keeps: sorted, int(n * share) dropped at each end (all if that
    leaves none)."""
    order = np.argsort(values, kind="stable")
    k = int(len(values) * share)
    return order[k:len(values) - k] if len(values) - 2 * k > 0 else order


def propagation(scheduler: str, gpus: int) -> Callable[[np.ndarray], float]:
    """Seconds one global batch's propagation takes, from its samples' lengths, under Megatron's `scheduler` on its
    executor: dp_balanced's packs at CP 4 (padded to 2 x CP) on MegatronPacking, whose slowest replica sets the time,
    or default_dynamic_cp's micro-batches (padded to 2 x DP x CP) chained on DynamicCP."""
    profile = load_profile(PROFILE)
    dpcp, dp = gpus // TP, gpus // (TP * CP)
    if scheduler == "dcp":
        target = DynamicCP.of(profile, tp=TP, dpcp=dpcp, max_seqlen_per_rank=LIMIT)

        def dcp(raw: np.ndarray) -> float:
            padded = dynamic_cp_padded(raw, dpcp, TP)
            return dynamic_cp_time(target, default_dynamic_cp_schedule(padded, dpcp=dpcp, max_seqlen_per_rank=LIMIT),
                                   padded)
        return dcp
    packing = MegatronPacking.of(profile, tp=TP, pp=1, cp=CP, dp=dp, capacity=LIMIT * CP, multiple=dp)

    def balanced(raw: np.ndarray) -> float:
        padded = packing_padded(raw, CP, TP)
        return max(packing.propagation_s(dp_balanced_schedule(padded.tolist(), LIMIT * CP, dp, CP), padded))
    return balanced


@lru_cache(maxsize=16)
def iteration_times(scheduler: str, gpus: int) -> tuple[IterationTime, ...]:
    """Every measured iteration (WARMUP..ITERATIONS-1) of the scheduler's run on `gpus` GPUs, term by term: the
    propagation, DDP's gradient all-reduce and the optimizer step (core.iteration, grad_sync ddp)."""
    dp = gpus // (TP * CP)
    lengths = load_dataset(DATASET).lengths
    job = Job(gpus=gpus, gpus_per_node=4, tp=TP, pp=1, cp=CP, dp=dp, seq_len=int(lengths.max()),
              global_batch=dp * MICRO_BATCHES, micro_batch=1, grad_sync="ddp")
    model, gpu, fw = model_by_name("megatron-dcp-bench"), GPUS["h100"], framework_spec(fidelity.FRAMEWORK_OF["megatron-lm"])
    prop = propagation(scheduler, gpus)
    return tuple(iteration_from_propagation(prop(lengths[batch_samples(k, dp, MICRO_BATCHES)]), model, job, gpu, fw,
                                            fp8=False) for k in range(WARMUP, ITERATIONS))


def statistic(times: tuple[IterationTime, ...], kind: str) -> dict[str, float]:
    """The script's statistic of the iterations (trimmed: over the iterations its trimmed mean keeps), per term."""
    total = np.array([t.total_s for t in times])
    keep = trimmed_indices(total) if kind == "trimmed" else np.arange(total.size)
    terms = {"propagation_s": [t.propagation_s for t in times], "dp_sync_s": [t.dp_sync_s for t in times],
             "optimizer_s": [t.optimizer_s for t in times]}
    return {"total_s": float(total[keep].mean()), **{k: float(np.asarray(v)[keep].mean()) for k, v in terms.items()}}


def parse(point: Point) -> tuple[str, int, str]:
    """(scheduler, GPUs, statistic) of a benchmark point, from its id."""
    m = POINT_ID.match(point.id)
    if m is None:
        raise ValueError(f"{SOURCE}: point id {point.id!r} is not SCHEDULER-Ngpu-STATISTIC")
    return m.group(1), int(m.group(2)), m.group(3)


def predict(point: Point) -> fidelity.Prediction:
    scheduler, gpus, kind = parse(point)
    c = point.config
    assert isinstance(c, IterationConfig) and c.gpus == gpus and c.tp == TP and c.cp == CP
    s = statistic(iteration_times(scheduler, gpus), kind)
    pred = s.pop("total_s")
    why = (f"measured {point.value * 1e3:.0f} ms per iteration, predicted {pred * 1e3:.0f} ms ({pred / point.value:.2f}x): "
           f"propagation {s['propagation_s'] * 1e3:.0f} ms (Megatron's {scheduler} schedules as its executor runs them), "
           f"the fp32 gradient all-reduce over {gpus} GPUs {s['dp_sync_s'] * 1e3:.0f} ms, the optimizer step "
           f"{s['optimizer_s'] * 1e3:.0f} ms; " + GAP)
    return fidelity.Prediction(SOURCE, point, pred, why, scheme_in_profile=True, terms=s,
                               predicted_as=f"on the bundled {PROFILE} profile, each of iterations {WARMUP + 1}-"
                                            f"{ITERATIONS} from the samples Megatron draws for it")


@dataclass(frozen=True)
class Speedup:
    """Dynamic CP over dp_balanced at one GPU count and statistic: published and predicted (whole iteration and
    propagation alone), and the seconds per iteration dynamic CP saves, measured and predicted."""

    gpus: int
    statistic: str
    published: float
    predicted: float
    propagation: float
    published_saved_s: float
    predicted_saved_s: float


def speedups(preds: list[fidelity.Prediction]) -> list[Speedup]:
    """The published speedups of dynamic CP over dp_balanced beside the predicted ones (a derived comparison)."""
    by = {parse(p.point): p for p in preds if p.source == SOURCE and p.predicted is not None and p.terms}
    out = []
    for gpus, kind in sorted({(g, k) for _, g, k in by}):
        base, dcp = by.get(("dp_balanced", gpus, kind)), by.get(("dcp", gpus, kind))
        if base is None or dcp is None:
            continue
        assert base.predicted and dcp.predicted and base.terms and dcp.terms
        out.append(Speedup(gpus, kind, base.point.value / dcp.point.value, base.predicted / dcp.predicted,
                           base.terms["propagation_s"] / dcp.terms["propagation_s"], base.point.value - dcp.point.value,
                           base.predicted - dcp.predicted))
    return out


def predictions() -> list[fidelity.Prediction]:
    """Every published point's prediction (hydraplan.store.fidelity), the dynamic-CP benchmark's by its executors."""
    return [predict(p.point) if p.source == SOURCE else p for p in fidelity.predictions()]

