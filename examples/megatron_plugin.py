"""Megatron-LM training scheduled by hydraplan: install hydraplan's schedulers, then run Megatron's own script.

    MEGATRON_LM=/path/to/Megatron-LM torchrun --nproc-per-node 8 ... examples/megatron_plugin.py \\
        --profile h100-llama2-7b -- <pretrain_gpt.py's arguments, with the flags `hydraplan megatron suggest` gives>
    python examples/megatron_plugin.py --dry-run     # no Megatron: one global batch scheduled both ways

The checkout goes first on `sys.path`, then `install(profile)` runs, before `pretrain(...)` builds the data
iterator: it replaces the schedulers of the seams this Megatron has and uses (hybrid context parallelism's on
megatron-core 0.17-0.19 and Megatron-LM main, `dp_balanced` on main and dev, dynamic context parallelism's
`default_dynamic_cp` on dev) and prints one line saying which. Megatron runs everything else unchanged; TP, PP,
CP, DP and the recompute mode come from its config, the cost model from the hydraplan profile. Every rank
computes the same schedule from the gathered lengths (no broadcast).

`--dry-run` samples one 200K-token global batch of builtin:wikipedia and prints what Megatron's BalancedCPScheduler
and hydraplan's schedule cost on 64 H100s at TP 4 (propagation, as Megatron's executor runs them), and the CPU time
hydraplan's took.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path


def dry_run(profile: str) -> dict:
    from hydraplan.core.executors import HybridCP, hybrid_cp_time
    from hydraplan.integrations.megatron import schedule_hybrid_cp
    from hydraplan.methods.megatron_seams import rank_limit
    from hydraplan.solve.megatron.balanced_cp import balanced_cp_schedule
    from hydraplan.store.datasets import load_dataset, sample_iterations
    from hydraplan.store.profiles import load_profile

    prof = load_profile(profile)
    tp, gpus = 4, 64
    limit = rank_limit(prof, gpus, tp)
    (batch,) = sample_iterations(load_dataset("builtin:wikipedia", 32768), 200_000, 1, 3)
    lengths = batch.lengths.tolist()
    schedule_hybrid_cp(lengths, profile=profile, tp=tp, dpcp=gpus // tp, max_seqlen_per_rank=limit)  # loads the profile
    t0 = time.process_time()
    ours = schedule_hybrid_cp(lengths, profile=profile, tp=tp, dpcp=gpus // tp, max_seqlen_per_rank=limit)
    ms = (time.process_time() - t0) * 1e3
    target = HybridCP.of(prof, tp=tp, dpcp=gpus // tp, max_seqlen_per_rank=limit)
    theirs = balanced_cp_schedule(lengths, limit, gpus // tp)
    return {"sequences": len(lengths), "max_seqlen_per_dp_cp_rank": limit,
            "megatron_s": hybrid_cp_time(target, theirs, lengths), "hydraplan_s": hybrid_cp_time(target, ours, lengths),
            "hydraplan_ms": ms}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="h100-llama2-7b", help="hydraplan profile: bundled name or file")
    parser.add_argument("--dry-run", action="store_true", help="without Megatron: schedule one global batch both ways")
    parser.add_argument("megatron_args", nargs="*", help="pretrain_gpt.py's arguments (after --)")
    a = parser.parse_args(argv)
    if a.dry_run:
        r = dry_run(a.profile)
        print(f"{r['sequences']} sequences, TP 4 x 16 DPxCP ranks, --max-seqlen-per-dp-cp-rank "
              f"{r['max_seqlen_per_dp_cp_rank']}: Megatron's scheduler {r['megatron_s']:.3f} s, hydraplan's "
              f"{r['hydraplan_s']:.3f} s ({r['megatron_s'] / r['hydraplan_s']:.2f}x), planned in {r['hydraplan_ms']:.1f} ms")
        return 0
    from hydraplan.integrations.megatron import install

    script = Path(os.environ.get("MEGATRON_LM", ".")).resolve() / "pretrain_gpt.py"
    if not script.exists():
        print(f"{script}: no such file; set MEGATRON_LM to a Megatron-LM checkout", file=sys.stderr)
        return 2
    sys.path.insert(0, str(script.parent))  # the checkout's megatron, not an installed one: install() patches it
    install(a.profile)  # before pretrain(...) builds the data iterators
    sys.argv = [str(script), *a.megatron_args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
