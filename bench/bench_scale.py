"""`hydraplan pack` at cluster scale: 8192 GPUs / 25M tokens and 16384 GPUs / 16M tokens per iteration
(h100-llama2-7b, builtin:wikipedia, 32K context), one process (--workers 1), next to 64 and 1024 GPUs.

Per size, in a fresh process (nothing loaded or cached by an earlier size): seconds from importing the
planner to the first plan written (imports, loading, proposing, the static baseline, placement), and seconds
per iteration after it (mean over the iterations), both as wall time and as this process's CPU time: on a
shared machine wall time also counts the other processes, CPU time is the one-core cost. Also per
iteration how many candidates were dispatched (the rest ruled out by their bounds before dispatch) and the
seconds each dispatch took, the bytes of a plan as JSON and compact (store/planfile.py), and the run's
process groups: the family the runtime makes at start-up (total, and the most one rank belongs to) and those
the plans use. Writes bench/results/scale.json; `python -m bench scale 8192` re-measures one size and keeps
the others.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path

from bench.run import Run

SIZES = ((64, 200_000), (1024, 3_200_000), (8192, 25_000_000), (16384, 16_000_000))
ITERATIONS = 5


class _Clock:
    """Wall and CPU time of every plan written, from the start of the run."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        self.marks: list[tuple[float, float]] = []

    def start(self, done: int, total: int) -> None:
        pass

    def advance(self, it: object) -> None:
        self.marks.append((time.perf_counter() - self.wall0, time.process_time() - self.cpu0))


def measure(gpus: int, tokens: int, iterations: int = ITERATIONS) -> dict:
    """One size, in this process: call it in a fresh one (main does)."""
    out = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    try:
        clock = _Clock()
        from hydraplan.app.config import PackConfig
        from hydraplan.app.pack import run_pack

        summary = run_pack(PackConfig(profile="h100-llama2-7b", dataset="builtin:wikipedia", gpus=gpus,
                                       tokens_per_iter=tokens, iterations=iterations, out=out / "run",
                                       context_len=32768, workers=1), clock)
        proposed = json.loads((out / "run" / "strategies.json").read_text()).get("proposed")
        sizes = _plan_bytes(out / "run")
    finally:
        shutil.rmtree(out)
    wall = [b[0] - a[0] for a, b in zip(clock.marks, clock.marks[1:])]
    cpu = [b[1] - a[1] for a, b in zip(clock.marks, clock.marks[1:])]
    later = summary.iterations[1:]  # the iterations timed per iteration
    dispatched = [[c for c in it.candidates if c.dispatch_solver] for it in later]
    return {
        "id": str(gpus), "gpus": gpus, "tokens_per_iter": tokens, "iterations": iterations,
        "candidates": len(summary.iterations[0].candidates), "proposed": proposed,
        "first_plan_wall_s": clock.marks[0][0], "first_plan_cpu_s": clock.marks[0][1],
        "s_per_iter_wall_mean": sum(wall) / len(wall), "s_per_iter_cpu_mean": sum(cpu) / len(cpu),
        "s_per_iter_cpu": [round(c, 3) for c in cpu],
        "dispatched_per_iter_mean": sum(map(len, dispatched)) / len(later),
        "dispatch_s_mean": sum(c.dispatch_s for d in dispatched for c in d) / max(sum(map(len, dispatched)), 1),
        "objective": getattr(summary, "objective", None) or "propagation",
        "mean_estimate_s": summary.mean_estimate_s, "mean_baseline_s": summary.mean_baseline_s,
        **sizes, "compact_ratio": sizes["compact_bytes_per_plan"] / sizes["json_bytes_per_plan"],
        "process_groups": {"startup": summary.startup_process_groups, "per_rank_max": summary.process_groups_per_rank,
                           "used_by_plans": summary.new_process_groups, "outside_family": summary.groups_outside_family,
                           **_any_scheme_family(gpus)},
    }


def _any_scheme_family(gpus: int) -> dict:
    """The family when every scheme of the cluster may be used (strategies made per batch, --synthesize)."""
    from hydraplan.core.cluster import Cluster
    from hydraplan.solve.placement import family, groups_per_rank
    from hydraplan.store.profiles import load_profile

    fam = family([s.key for s in Cluster.of(load_profile("h100-llama2-7b"), gpus).schemes], gpus)
    return {"startup_any_scheme": len(fam), "per_rank_max_any_scheme": int(groups_per_rank(fam, gpus).max())}


def _plan_bytes(run: Path) -> dict:
    """Mean bytes of a plan file as JSON (as written) and in the compact form."""
    from hydraplan.store.planfile import encode, read_plan
    from hydraplan.store.runfolder import plan_files

    files = plan_files(run)
    return {"json_bytes_per_plan": sum(f.stat().st_size for f in files) / len(files),
            "compact_bytes_per_plan": sum(len(encode(read_plan(f))) for f in files) / len(files)}


def main(run: Run) -> None:
    """All sizes, or those whose GPU count is given; each row is written as soon as it is measured (a
    16384-GPU run takes minutes), replacing an older row of the same size."""
    sizes = run.pick([s for s in SIZES if not run.argv or str(s[0]) in run.argv], [(16, 50_000)])
    partial = len(sizes) < len(SIZES) and not run.smoke
    old = run.previous().get("runs", []) if partial else []
    for gpus, tokens in sizes:
        with multiprocessing.get_context("spawn").Pool(1) as pool:  # the first plan is timed separately
            r = pool.apply(measure, (gpus, tokens, run.pick(ITERATIONS, 2) + 1))
        old = sorted([x for x in old if x["gpus"] != gpus] + [r], key=lambda x: x["gpus"])
        run.write({"runs": old, "targets": {"8192": {"s_per_iter": 0.45, "first_plan_s": 5.0, "compact_ratio": 0.10}},
                   "note": "one process (--workers 1); CPU time is the one-core cost on a shared machine"}, merged=partial)
        print(f"{gpus:6d} GPUs {tokens:>11,d} tok  first plan {r['first_plan_wall_s']:6.1f} s wall "
              f"({r['first_plan_cpu_s']:.1f} s CPU)  per iteration {r['s_per_iter_wall_mean']:6.2f} s wall "
              f"({r['s_per_iter_cpu_mean']:.2f} s CPU), {r['dispatched_per_iter_mean']:.1f} candidates dispatched "
              f"per iteration, {r['dispatch_s_mean']:.2f} s each, compact {r['compact_ratio']:.1%} of JSON, "
              f"groups {r['process_groups']}", flush=True)
