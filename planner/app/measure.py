"""Measured profiles, the planner side of `hydraplan profile`: launch the runtime to measure each scheme and
the network, build the profile file from the fits (hydraplan.core.fit, hydraplan.core.memory), and --check
(the end-to-end estimate against measured whole iterations, propagation and sync apart, as a table's rows and
JSON). The measuring itself runs in the runtime (runtime/profile.py, under torchrun for several ranks).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import pipeline_time, util_len
from hydraplan.core.errors import UserError
from hydraplan.core.fit import BandwidthFit, SchemeFit, fit_bandwidth, fit_points, network_slices
from hydraplan.core.memory import activation_fit, peak_fit
from hydraplan.core.schema import GPUInfo, ModelInfo, Network, Plan, PlanPipeline, Profile, Scheme, scheme_label

# Run as a module of the installed package, so it works from a wheel as well as from a checkout.
MODULE = "hydraplan.runtime.profile"


# ------------------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class Launch:
    """A runtime job's exit status, the JSON it wrote (None: none) and its stderr."""

    returncode: int
    result: dict | None
    stderr: str


def launch_runtime(module: str, args: Sequence[str], ranks: int, device: str, timeout_s: float) -> Launch:
    """Run a runtime module on `ranks` processes (torchrun when more than one), one thread each, GPUs hidden on
    --device cpu; it writes its JSON to the --out it is given."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        launcher = [sys.executable]
        if ranks > 1:
            launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(_free_port())]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        cmd = [*launcher, "-m", module, *args, "--out", str(out)]
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise UserError(f"{module} {' '.join(args)}: no result after {timeout_s:g}s") from e
        return Launch(res.returncode, json.loads(out.read_text()) if out.exists() else None, res.stderr)


def run_runtime(args: Sequence[str], ranks: int, device: str, timeout_s: float) -> dict:
    """Run runtime/profile.py (`launch_runtime`) and return the JSON it writes. Its failure becomes a UserError
    with the failing rank's own line (`failure_line`)."""
    res = launch_runtime(MODULE, args, ranks, device, timeout_s)
    if res.returncode != 0 or res.result is None:
        why = failure_line(res.stderr, "profile") or f"exit {res.returncode} without a word"
        raise UserError(f"runtime/profile.py {' '.join(args)}: {why.removeprefix('profile: ')}")
    return res.result


_RANK_PREFIX = re.compile(r"^\[(?:default)?(?:rank)?\d+\]:\s?")


def failure_line(stderr: str, program: str) -> str | None:
    """The one line that says why a runtime job failed: the line the runtime printed (`PROGRAM: ...`, once per
    job, runtime/faults.py); else the exception that ended the first rank with a traceback (a crash the
    runtime did not catch), with its rank; else the end of torchrun's summary (which rank, which exit code or
    signal); None for no output at all."""
    lines = stderr.splitlines()
    said = next((x for x in lines if x.startswith(f"{program}: ")), None)
    if said is not None:
        return said
    for i, x in enumerate(lines):
        if _RANK_PREFIX.sub("", x).startswith("Traceback (most recent call last)"):
            rank = re.match(r"^\[(?:default)?(?:rank)?(\d+)\]", x)
            tail = [_RANK_PREFIX.sub("", y) for y in lines[i + 1:]]
            error = next((y for y in tail if y and not y[0].isspace()), None)
            if error is not None and "ChildFailedError" not in error:  # not torchrun's own
                return f"{'rank ' + rank.group(1) + ': ' if rank else ''}{error}"
    summary = re.findall(r"^\s*rank\s*:\s*(\d+).*?^\s*exitcode\s*:\s*(.*?)$", stderr, re.M | re.S)
    if summary:
        rank, code = summary[0]
        return f"rank {rank} exited with exit code {' '.join(code.split())}"
    rest = [x.strip() for x in lines if x.strip()]
    return rest[-1] if rest else None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_points(launches: Sequence[list[dict]]) -> list[dict]:
    """Timing points of several launches of one scheme's measurement combined: per grid point (by its lengths;
    the grid follows MaxLen, which the first launch fixed) the median of the launches' medians, and every run."""
    out = []
    for p in launches[0]:
        same = [q for pts in launches for q in pts if q["lengths"] == p["lengths"]]
        out.append({"lengths": p["lengths"], "seconds": float(np.median([q["seconds"] for q in same])),
                    "runs": [r for q in same for r in q["runs"]], "launches": len(same)})
    return out


@dataclass(frozen=True)
class Runs:
    """How the runtime is launched and timed for `hydraplan profile` (the command's flags, validated once)."""

    model: str = "tiny"
    device: str = "cpu"
    clock: str = "cpu"
    dtype: str = "fp32"
    warmup: int = 1
    repeats: int = 3
    launches: int = 1


def measure_profile(name: str, runs: Runs, schemes: Sequence[tuple[int, int, int, str]], capacity_bytes: float,
                    *, gpus_per_node: int, timeout_s: float = 3600.0,
                    progress: Callable[[str], None] | None = None) -> tuple[Profile, list[SchemeFit]]:
    """Measure every <tp, pp, cp> with its recomputation mode in the runtime and build a v1 profile with
    "source": "measured". Each scheme is
    measured in `runs.launches` separate runtime jobs (median_points): on a shared CPU one process's own speed
    varies against another's, which a median within one process cannot see."""
    model, device, clock, dtype = runs.model, runs.device, runs.clock, runs.dtype
    warmup, repeats, launches = runs.warmup, runs.repeats, runs.launches
    from hydraplan.runtime.hf import model_config

    cfg = model_config(model)
    out, fits = [], []
    if progress is not None:
        progress("LNK pull/push")
    network, _, net_note = measure_network(model, device, gpus_per_node, sorted({(tp, pp) for tp, pp, _, _ in schemes}),
                                                 dtype=dtype, timeout_s=timeout_s)
    for tp, pp, cp, mode in schemes:
        if progress is not None:
            progress(scheme_label((tp, pp, cp, mode)))
        args = ["--tp", str(tp), "--pp", str(pp), "--cp", str(cp), "--recompute", mode, "--model", model, "--dtype", dtype,
                "--clock", clock, "--capacity-bytes", repr(capacity_bytes), "--reference-gpus", str(gpus_per_node),
                "--warmup", str(warmup), "--repeats", str(repeats)]
        raws = [run_runtime(args, tp * pp * cp, device, timeout_s) for _ in range(launches)]
        raw = {**raws[0], "points": median_points([r["points"] for r in raws])}
        fit = fit_points([(p["lengths"], p["seconds"]) for p in raw["points"]])
        fits.append(fit)
        max_len = int(raw["max_len"])
        out.append(Scheme(tp=tp, pp=pp, cp=cp, recompute=mode, max_len=max_len, util_len=util_len(fit.time, max_len),
                          time=fit.time,
                          fit={"r2": fit.r2, "worst_rel_err": fit.worst_rel_err,
                               "packed_worst_rel_err": fit.packed_worst_rel_err, "points": fit.points},
                          measured_memory=[{"stage": m["stage"], "fixed_bytes": m["fixed_bytes"], "stash": m["stash"],
                                            "lnk_bytes": m["lnk_bytes"], "lengths": m["lengths"],
                                            "act_bytes_per_token2": q, "act_bytes_per_token": p,
                                            "peak_bytes_per_token2": q2, "peak_bytes_per_token": p2, "peak_bytes": r}
                                           for m in raw["memory"]
                                           for (q, p), (q2, p2, r) in [(activation_fit(m["lengths"], m["act_bytes"]),
                                                                        peak_fit(m["lengths"], m["peak_bytes"]))]],
                          measured_points=raw["points"]))
    gpu = _device_name(device)
    profile = Profile(
        name=name, gpu=GPUInfo(name=gpu, memory_gib=capacity_bytes / 2**30, gpus_per_node=gpus_per_node),
        model=ModelInfo(name=cfg.name, layers=cfg.layers, hidden=cfg.hidden, ffn=cfg.ffn, heads=cfg.heads, vocab=cfg.vocab,
                        params=model_params(model), kv_heads=cfg.kv_heads if cfg.kv_heads != cfg.heads else None,
                        qkv_bias=cfg.qkv_bias or None),
        schemes=out, reference_gpus=gpus_per_node, source="measured", network=network, dtype=dtype,
        notes={"time": f"runtime/profile.py on {gpu}, {dtype}, {clock} clock: replayed training steps (run_plan's), 1F1B "
                       f"latency of pp identical micro-batches / (2*pp - 1), median of {repeats} runs after {warmup} "
                       f"warm-up in each of {launches} launches, median over the launches, one thread per rank; "
                       "a, b, c fitted on single "
                       "sequences and packed micro-batches together (NNLS, relative error; fit.packed_worst_rel_err: the "
                       "packings alone)",
               "max_len": f"largest l with fixed + (pp - stage - 1) * act(l) + peak(l) <= {capacity_bytes / 2**30:g} GiB "
                          "on every stage; act(l) = q*l^2 + p*l fitted to the bytes a micro-batch's forward leaves for "
                          "its backward (what autograd saves, or under recomputation what the layers keep, and its "
                          f"output), peak(l) to the most bytes one micro-batch's forward and backward add at once "
                          f"({_memory_source(device)}), plus a constant; fixed: weights, gradient accumulators, 1/N of the "
                          "masters, AdamW states and owner gradient, and LNK's in-flight buffers (lnk_bytes) "
                          "(measured_memory); single sequences of 128-2048 tokens, then (lengths) of the MaxLen each "
                          "fit gives until one lands within 5% of a length measured (a fit over short sequences "
                          "extrapolates badly); "
                          "each scheme measured with its recomputation mode",
               "params": f"parameter count of the runtime's {model} config (runtime/model.py param_specs)",
               "network": net_note,
               "regenerate": f"hydraplan profile --device {device} --model {model} --out <this file>"})
    return profile, fits


def _memory_source(device: str) -> str:
    return "torch.cuda.max_memory_allocated" if device == "cuda" else "the C heap's statistics"


def model_params(model: str) -> int:
    """Phi of a runtime model config: what LNK pulls and pushes."""
    from hydraplan.runtime.hf import model_config
    from hydraplan.runtime.model import param_specs

    return sum(s.numel for s in param_specs(model_config(model)))


NETWORK_REPEATS = 15


def measure_network(model: str, device: str, ranks: int, slices: Sequence[tuple[int, int]], *, dtype: str = "fp32",
                    warmup: int = 2, repeats: int = NETWORK_REPEATS,
                    timeout_s: float = 600.0) -> tuple[Network, BandwidthFit, str]:
    """LNK pull/push of homogeneous <tp, pp> layouts over `ranks` ranks of this node, timed in the runtime
    (runtime/profile.py --network), fitted to one bandwidth. `hydraplan profile` runs one node, so
    inter_node_GBps is set to the intra-node figure; a job within one node (N <= gpus_per_node) never uses
    it (sync.effective_bandwidth_GBps weighs it by 1 - G/N = 0)."""
    todo = [(tp, pp) for tp, pp in slices if ranks % (tp * pp) == 0] or [(1, 1)]
    args = ["--model", model, "--dtype", dtype, "--warmup", str(warmup), "--repeats", str(repeats)]
    for tp, pp in todo:
        args += ["--network", f"{tp},{pp}"]
    raw = run_runtime(args, ranks, device, timeout_s)
    fit = fit_bandwidth(*network_slices(raw["params"], raw["samples"]))
    backend = "NCCL" if device == "cuda" else "gloo"
    times = ", ".join(f"<{x['tp']},{x['pp']}> pull {x['pull_s'] * 1e3:.2f} ms push {x['push_s'] * 1e3:.2f} ms"
                      for x in raw["samples"])
    note = (f"intra_node_GBps: runtime/lnk.py pull and push on {ranks} {backend} ranks of one node ({dtype} on the wire), "
            f"homogeneous layouts {times} (wall time between barriers, median of {repeats} after {warmup} warm-up); "
            f"one bandwidth fitted to those times as sync.transfer_s counts bytes (2 per parameter / (tp*pp)), "
            f"worst error {fit.worst_rel_err:.0%} (latency folded in at these slice sizes). inter_node_GBps: "
            "no second node was measured, so it is set to the intra-node figure; a job within one node never uses it")
    return Network(intra_node_GBps=fit.GBps, inter_node_GBps=fit.GBps), fit, note


def _device_name(device: str) -> str:
    from hydraplan.runtime.device import CudaDevice, Device

    return (CudaDevice(0) if device == "cuda" else Device()).describe()


# -------------------------------------------------------------------------------------------- check
@dataclass(frozen=True)
class CheckRow:
    """One iteration: estimated propagation + exposed sync (= iteration_s) against the measured whole iteration
    of the runtime's own step (LNK pull/push overlapped with compute). Measured sync is everything outside
    propagation (exposed pull/push waits, waits on slower ranks, the optimizer step). Errors are signed and
    relative to the measured whole iteration, so propagation_err + sync_err = err."""

    iteration: int
    strategy: str
    estimate_propagation_s: float  # of the pipeline attaining iteration_s
    estimate_sync_s: float
    pull_s: float  # time the pull had an exchange in flight (hidden or not)
    propagate_s: float  # the slowest pipeline
    push_s: float
    step_s: float
    exposed_s: float  # compute blocked on a pull/push after every rank posted it
    iteration_s: float  # measured whole iteration
    estimate_from: str  # "plan" (its estimate.iteration_s/sync_s) or "profile" (sync.iteration_estimate)
    transfer_s: float  # sync.transfer_s of the plan's slowest-moving busy pipeline: one pull or push, unhidden
    no_overlap_s: float  # max over busy pipelines of propagation + pull + push: the estimate if LNK hid nothing
    pipelines: list[tuple[str, float, float]]  # (scheme label, estimated, measured propagation) per pipeline

    @property
    def estimate_s(self) -> float:
        return self.estimate_propagation_s + self.estimate_sync_s

    @property
    def sync_s(self) -> float:
        """Measured time outside propagation: exposed LNK, waits on slower ranks, the optimizer step."""
        return self.iteration_s - self.propagate_s

    @property
    def measured_s(self) -> float:
        return self.iteration_s

    @property
    def err(self) -> float:
        return (self.estimate_s - self.measured_s) / self.measured_s

    @property
    def rel_err(self) -> float:
        return abs(self.err)

    @property
    def propagation_err(self) -> float:
        return (self.estimate_propagation_s - self.propagate_s) / self.measured_s

    @property
    def sync_err(self) -> float:
        return (self.estimate_sync_s - self.sync_s) / self.measured_s


def pipeline_estimate(scheme: Scheme, pipe: PlanPipeline, lengths_by_id: dict[int, int]) -> float:
    """Estimated propagation of one plan pipeline under the profile: the Seq1F1B schedule simulated with
    split times when the plan carries splits, else the canonical 1F1B estimate."""
    mbs = [np.array([lengths_by_id[s] for s in mb.seqs], dtype=np.int64) for mb in pipe.micro_batches]
    if not pipe.micro_batches or pipe.micro_batches[0].splits is None:
        return pipeline_time(scheme, mbs)
    from hydraplan.solve.seqsplit import SplitPlan, cumulative_cost, seq1f1b_estimate

    t = scheme.time
    plans = [SplitPlan(np.asarray(mb.splits), np.diff(cumulative_cost(ls, t.a, t.b, np.asarray(mb.splits))))
             for mb, ls in zip(pipe.micro_batches, mbs)]
    return seq1f1b_estimate(scheme, plans)[0]


def plan_estimate(plan: Plan, cluster: Cluster, estimates: Sequence[float]) -> tuple[float, float, str]:
    """(propagation, exposed sync) of the pipeline attaining the plan's end-to-end estimate: the plan's own
    estimate.iteration_s/sync_s when it carries them for this profile, else the cluster's end-to-end estimate
    over the pipelines' estimates."""
    e = plan.estimate
    if plan.profile == cluster.name and e.iteration_s is not None and e.sync_s is not None:
        return e.iteration_s - e.sync_s, e.sync_s, "plan"
    est = cluster.estimate([p.key for p in plan.pipelines], estimates)
    return est.iteration_s - est.sync_s, est.sync_s, "profile"


def compare(plans: Sequence[Plan], measured: dict, cluster: Cluster) -> list[CheckRow]:
    """Estimated against measured whole iterations per plan (all on the cluster's GPUs); `measured` is the JSON
    of runtime/profile.py --check for the same plans."""
    rows = []
    for plan, got in zip(plans, measured["plans"], strict=True):
        lengths = {s.id: s.length for s in plan.batch}
        pipes = []
        for i, (pipe, m) in enumerate(zip(plan.pipelines, got["pipelines"], strict=True)):
            scheme = cluster.scheme(pipe.key)
            if scheme is None:
                raise UserError(f"iteration {plan.iteration}: field pipelines.{i}: scheme {pipe.label} "
                                f"is not in profile {cluster.name} for {cluster.gpus} GPUs")
            pipes.append((scheme.label, pipeline_estimate(scheme, pipe, lengths), float(m["seconds"])))
        prop, sync, source = plan_estimate(plan, cluster, [p[1] for p in pipes])
        busy = [(float(cluster.transfer_s(p.tp, p.pp)), e) for p, (_, e, _) in zip(plan.pipelines, pipes) if p.micro_batches]
        rows.append(CheckRow(plan.iteration, plan.strategy, prop, sync, float(got["pull_s"]), float(got["propagate_s"]),
                             float(got["push_s"]), float(got["step_s"]), float(got["exposed_s"]), float(got["iteration_s"]),
                             source, max((t for t, _ in busy), default=0.0),
                             max((e + 2 * t for t, e in busy), default=0.0), pipes))
    return rows


def check_summary(rows: Sequence[CheckRow]) -> dict:
    """Mean and worst whole-iteration error, the mean signed propagation and sync errors (shares of the
    measured iteration), and the mean error of an estimate that assumes LNK hides nothing. (Pull and push
    overlap compute, so their in-flight times are not transfer times; `hydraplan profile` measures the network
    figure itself.)"""
    errs = [r.rel_err for r in rows]
    worst = max(range(len(rows)), key=lambda i: errs[i])
    return {"mean_rel_err": float(np.mean(errs)), "worst_rel_err": errs[worst], "worst_iteration": rows[worst].iteration,
            "mean_rel_err_no_overlap": float(np.mean([abs(r.no_overlap_s - r.measured_s) / r.measured_s for r in rows])),
            "mean_propagation_err": float(np.mean([r.propagation_err for r in rows])),
            "mean_sync_err": float(np.mean([r.sync_err for r in rows]))}


def describe_pipelines(r: CheckRow) -> str:
    """e.g. "4x<1,1,1>" or "1x<2,1,1>+2x<1,1,1>", in plan order."""
    counts: dict[str, int] = {}
    for label, _, _ in r.pipelines:
        counts[label] = counts.get(label, 0) + 1
    return "+".join(f"{n}x{k}" for k, n in counts.items())


def check_row_json(r: CheckRow) -> dict:
    return {"iteration": r.iteration, "strategy": r.strategy, "estimate_from": r.estimate_from,
            "estimate_s": r.estimate_s, "estimate_propagation_s": r.estimate_propagation_s,
            "estimate_sync_s": r.estimate_sync_s, "measured_s": r.measured_s, "pull_s": r.pull_s,
            "propagate_s": r.propagate_s, "push_s": r.push_s, "step_s": r.step_s, "exposed_s": r.exposed_s,
            "sync_s": r.sync_s,
            "estimate_transfer_s": r.transfer_s, "no_overlap_s": r.no_overlap_s, "err": r.err, "rel_err": r.rel_err,
            "propagation_err": r.propagation_err, "sync_err": r.sync_err,
            "pipelines": [{"scheme": s, "estimate_s": e, "measured_s": m} for s, e, m in r.pipelines]}


def check_plans(plan_dir: str, profile: Profile, runs: Runs, timeout_s: float = 600.0) -> list[CheckRow]:
    """Replay every plan of a run as whole training iterations and compare with the profile's estimates; with
    `runs.launches`, in that many separate runtime jobs, each phase the median over them (as measure_profile)."""
    model, device, clock, dtype = runs.model, runs.device, runs.clock, runs.dtype
    warmup, repeats, launches = runs.warmup, runs.repeats, runs.launches
    from hydraplan.runtime.plan_roles import load_plans

    loaded = load_plans(plan_dir, None)
    plans = [p for _, p in loaded]
    ranks = plans[0].gpus
    for source, p in loaded:
        if p.gpus != ranks:
            raise UserError(f"{source}: field gpus: {p.gpus}, but the run's first plan has {ranks} (--check replays "
                            "one run on one set of ranks)")
    args = ["--check", str(plan_dir), "--model", model, "--dtype", dtype, "--clock", clock, "--warmup", str(warmup),
            "--repeats", str(repeats)]
    measured = median_check([run_runtime(args, ranks, device, timeout_s) for _ in range(launches)])
    return compare(plans, measured, Cluster.of(profile, ranks))


def median_check(launches: Sequence[dict]) -> dict:
    """runtime/profile.py --check results of several launches: per plan, each phase's median over them."""
    out = []
    for k, first in enumerate(launches[0]["plans"]):
        same = [m["plans"][k] for m in launches]
        phases = {f: float(np.median([m[f] for m in same])) for f in first if isinstance(first[f], (int, float))
                  and f != "iteration"}
        pipes = [{"seconds": float(np.median([m["pipelines"][j]["seconds"] for m in same]))}
                 for j in range(len(first["pipelines"]))]
        out.append({**first, **phases, "pipelines": pipes, "runs": [r for m in same for r in m["runs"]]})
    return {"plans": out}


