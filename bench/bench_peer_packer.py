"""Our max-length FFD (hydraplan.methods.baselines.ffd) next to a real peer packer, the `binpacking` package's
to_constant_volume, on the same sampled batches: bin counts per batch and packing speed in one run.

binpacking places each item (largest first) into the least-loaded bin it fits (worst-fit decreasing),
FFD into the first; both are decreasing heuristics, so their bin counts should agree on real lengths.
The lower bound ceil(tokens / capacity) shows how close both are to optimal.
"""

from __future__ import annotations

import time

import binpacking
import numpy as np

from bench.run import Run
from hydraplan.methods.baselines import ffd
from hydraplan.store.datasets import load_dataset, sample_iterations

BUDGET, SEED = 200_000, 0
CASES = ((8192, 8192), (32768, 32768), (32768, 65536))  # (context length, bin capacity)


def main(run: Run) -> None:
    iters = run.pick(200, 5)
    rows = []
    for spec in ("builtin:wikipedia", "builtin:prolong"):
        for context, cap in CASES:
            batches = [b.lengths for b in sample_iterations(load_dataset(spec, context), BUDGET, iters, SEED)]
            t0 = time.perf_counter()
            ours = [len(ffd(b, cap)) for b in batches]
            t1 = time.perf_counter()
            theirs = [len(binpacking.to_constant_volume(b.tolist(), cap)) for b in batches]
            t2 = time.perf_counter()
            bound = [int(-(-int(b.sum()) // cap)) for b in batches]
            rows.append({
                "id": f"{spec.removeprefix('builtin:')}_{context // 1024}K_{cap // 1024}K", "dataset": spec,
                "context_len": context, "capacity": cap, "batches": len(batches),
                "ffd_bins": int(sum(ours)), "binpacking_bins": int(sum(theirs)), "lower_bound_bins": int(sum(bound)),
                "equal_bin_count": float(np.mean(np.array(ours) == np.array(theirs))),
                "ffd_fewer": int(sum(o < t for o, t in zip(ours, theirs))),
                "binpacking_fewer": int(sum(o > t for o, t in zip(ours, theirs))),
                "ffd_at_lower_bound": float(np.mean(np.array(ours) == np.array(bound))),
                "ffd_ms_per_batch": 1e3 * (t1 - t0) / len(batches),
                "binpacking_ms_per_batch": 1e3 * (t2 - t1) / len(batches),
            })
    run.write({"tokens_per_iter": BUDGET, "iterations": iters, "seed": SEED, "rows": rows})
    print(f"{'dataset':18s} {'ctx':>6s} {'cap':>6s} {'ffd bins':>9s} {'peer bins':>9s} {'bound':>7s} {'same':>6s} "
          f"{'ffd<':>5s} {'peer<':>5s} {'ffd ms':>7s} {'peer ms':>8s}")
    for r in rows:
        print(f"{r['dataset']:18s} {r['context_len']:6d} {r['capacity']:6d} {r['ffd_bins']:9d} {r['binpacking_bins']:9d} "
              f"{r['lower_bound_bins']:7d} {r['equal_bin_count']:6.1%} {r['ffd_fewer']:5d} {r['binpacking_fewer']:5d} "
              f"{r['ffd_ms_per_batch']:7.2f} {r['binpacking_ms_per_batch']:8.2f}")
