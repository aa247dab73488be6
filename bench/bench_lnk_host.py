"""Host work at the start of a step with a new strategy, measured: the LNK setup (runtime/replay.py
Replayer.link_setup: every rank's role and LNK role, then this rank's plan_link, runtime/lnk.py), in thread CPU
seconds on this shared 2-core machine (the least of 3 runs each, after one warm-up: the run least disturbed by
the other jobs), for every rank of each new
strategy of the demo's plans (`make demo`'s pack: h100-llama2-7b, builtin:wikipedia, 64 GPUs, context 32768,
200K tokens per iteration, 20 iterations) and for a few ranks of a 1024-GPU data-parallel layout (1024 <1,1,1>
replicas of LLaMA-2 7B); the previous planner (tests/lnk_reference.py) on two ranks of each, a ratio measured in
the same run. The runtime makes this setup ahead of the step (on a helper thread, or on the plan feed's thread
when planning while training); what is left at the step itself is `at_step_ms`: the strategy key and the plan's
group list (runtime/groups.py ensure: each group then a dictionary hit). And the owners' push sum per layer
group: one batched reduction when the contributions lie stacked, else one gather and add per round of them
(`push_reductions_max`: the most of either in one group). The smoke run uses synthetic layouts of the tiny
model at 8 and 16 GPUs. Writes bench/results/lnk_host.json.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.bench_demo import demo_iterations, makefile_run
from bench.run import Run
from hydraplan.core.schema import Estimate, Plan, PlanPipeline
from hydraplan.loader import read_plans
from hydraplan.runtime import lnk
from hydraplan.runtime.groups import plan_groups
from hydraplan.runtime.model import ModelConfig, get_config, param_groups, param_specs
from hydraplan.runtime.plan_roles import rank_roles, strategy_key
from tests import lnk_reference

REPEATS = 3


def cpu_ms(f: Callable[[], object]) -> float:
    """The least thread CPU milliseconds of `f` over REPEATS runs."""
    out = []
    for _ in range(REPEATS):
        t = time.thread_time()
        f()
        out.append((time.thread_time() - t) * 1e3)
    return min(out)


def layout(world: int, pipelines: list[tuple[int, int, int]]) -> Plan:
    """A plan of these <tp, pp, cp> pipelines on consecutive ranks (no batch: only the layout matters here)."""
    out, at = [], 0
    for tp, pp, cp in pipelines:
        d = tp * pp * cp
        out.append(PlanPipeline(tp=tp, pp=pp, cp=cp, ranks=list(range(at, at + d)), micro_batches=[], estimate_s=0.0))
        at += d
    return Plan(iteration=0, profile="", gpus=world, batch=[], strategy="", estimate=Estimate(propagation_s=0.0),
                pipelines=out)


def demo_plans() -> list[Plan]:
    """The demo's plans: the Makefile's RUN arguments packed for its number of iterations."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(Path(sys.executable).with_name("hydraplan")), "pack", *makefile_run(), "--iterations",
                        str(demo_iterations()), "--out", tmp], check=True, capture_output=True)
        return list(read_plans(tmp))


def measure(case: str, cfg: ModelConfig, plans: list[Plan], ranks: Callable[[int], list[int]], reference: int) -> dict:
    """Each new strategy of `plans` on `ranks(world)`: setup CPU ms per rank (roles, then plan_link), the
    previous planner on the first and last of them (at most `reference` strategies), the step's own part and the
    push sum's reductions per group."""
    specs = param_specs(cfg)
    numels = np.array([s.numel for s in specs], dtype=np.int64)
    sharded = np.array([s.sharded for s in specs], dtype=bool)
    groups = param_groups(cfg)
    seen, rows = set(), []
    for plan in plans:
        key = strategy_key(plan)
        if key in seen:
            continue
        seen.add(key)
        world = plan.gpus

        def link_roles(plan=plan, world=world):
            return [r.link_role(cfg) if r else None for r in rank_roles(plan, world)]

        roles = link_roles()
        lnk.plan_link(numels, sharded, roles, 0, groups)  # warm-up
        roles_ms = cpu_ms(link_roles)
        setup = {r: roles_ms + cpu_ms(lambda r=r: lnk.plan_link(numels, sharded, roles, r, groups)) for r in ranks(world)}
        row = {"iteration": plan.iteration, "strategy": plan.strategy, "gpus": world,
               "layout": "+".join(sorted({f"<{p.tp},{p.pp},{p.cp}>" for p in plan.pipelines})),
               "setup_ms_max": max(setup.values()), "setup_ms_median": statistics.median(setup.values()),
               "ranks": len(setup), "at_step_ms": cpu_ms(lambda plan=plan: (strategy_key(plan), plan_groups([plan])))}
        sample = sorted({min(setup), max(setup)})
        if len(rows) < reference:
            t = time.thread_time()
            for r in sample:
                lnk_reference.plan_link(numels, sharded, roles, r, groups)
            row["reference_ms_mean"] = (time.thread_time() - t) * 1e3 / len(sample) + roles_ms
            row["speedup"] = row["reference_ms_mean"] / statistics.mean(setup[r] for r in sample)
        pushes = [lnk.plan_link(numels, sharded, roles, r, groups).push_groups for r in sample]
        row["push_reductions_max"] = max(1 if g.stacked else len(g.rounds) for gs in pushes for g in gs)
        row["push_stacked_groups"] = min(sum(g.stacked is not None for g in gs) for gs in pushes)
        row["groups"] = len(pushes[0])
        rows.append(row)
        print(f"{case} iteration {plan.iteration} {row['layout']}: setup {row['setup_ms_max']:.1f} ms CPU at most over "
              f"{row['ranks']} ranks (previous planner {row.get('reference_ms_mean', float('nan')):.0f} ms), at the step "
              f"{row['at_step_ms']:.2f} ms; push sum {row['push_reductions_max']} reduction(s) per group at most",
              flush=True)
    return {"id": case, "model": cfg.name, "gpus": plans[0].gpus, "strategies": rows,
            "setup_ms_max": max(r["setup_ms_max"] for r in rows), "at_step_ms_max": max(r["at_step_ms"] for r in rows),
            "push_reductions_max": max(r["push_reductions_max"] for r in rows),
            "speedup_min": min(r["speedup"] for r in rows if "speedup" in r)}


def main(run: Run) -> None:
    if run.smoke:
        tiny = get_config("tiny")
        cases = [measure("mixed8", tiny, [layout(8, [(2, 1, 1)] * 4), layout(8, [(1, 2, 1), (1, 2, 1), (2, 1, 2)])],
                         lambda w: list(range(w)), 2),
                 measure("dp16", tiny, [layout(16, [(1, 1, 1)] * 16)], lambda w: [0, w - 1], 1)]
    else:
        llama = get_config("llama2-7b")
        cases = [measure("demo64", llama, demo_plans(), lambda w: list(range(w)), 3),
                 measure("dp1024", llama, [layout(1024, [(1, 1, 1)] * 1024)], lambda w: [0, 1, w // 2, w - 1], 1)]
    run.write({"cases": cases, "repeats": REPEATS,
               "note": "thread CPU milliseconds on a shared 2-core machine (other jobs running), the least of the repeats"})
