"""The runtime's peak memory against the profile's memory model (`run_plan --memory`): micro-batches at cpu-tiny's
MaxLen on every scheme of it, 4 gloo ranks, fp32, each plan twice (the first warms the allocator up; the
second is recorded), the layouts of tests/test_run_plan.py's memory test. Writes bench/results/memory.json:
per scheme and stage the largest measured / model over its ranks.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from hydraplan.store.fileio import write_model
from hydraplan.store.paths import ROOT
from hydraplan.store.profiles import load_profile
from tests.helpers import cpu_env, free_port, make_plan

RESULTS = Path(__file__).parent / "results" / "memory.json"
MEMORY = re.compile(r"^memory: iteration (\d+) rank (\d+) pipeline \d+ <(\d),(\d),1> stage (\d) largest micro-batch (\d+) "
                    r"tokens: peak ([\d.]+) MiB, model ([\d.]+) MiB, measured/model ([\d.]+)$", re.M)


def layouts() -> list[tuple[str, list]]:
    ml = {s.key[:2]: s.max_len for s in load_profile("cpu-tiny").schemes}
    a, b, c = ml[(2, 1)], ml[(1, 2)], ml[(1, 1)]
    return [("TPxPP", [(2, 1, [0, 1], [[a]]), (1, 2, [2, 3], [[b], [b]])]),
            ("DP", [(1, 1, [k], [[c]]) for k in range(4)]),
            ("TP4", [(4, 1, [0, 1, 2, 3], [[ml[(4, 1)]]])]),
            ("TP2xPP2", [(2, 2, [0, 1, 2, 3], [[ml[(2, 2)]]] * 2)]),
            ("PP4", [(1, 4, [0, 1, 2, 3], [[ml[(1, 4)]]] * 4)])]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        it = 0
        for name, pipes in layouts():
            for _ in range(2):
                write_model(Path(tmp) / f"iter_{it:06d}.json", make_plan(it, name, pipes, first_id=100 * it))
                it += 1
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(free_port()),
               str(ROOT / "runtime" / "run_plan.py"), tmp, "--memory", "--timeout-s", "120"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=cpu_env())
    if res.returncode != 0:
        raise RuntimeError(res.stdout + res.stderr)
    rows: dict[tuple, dict] = {}
    for it, _, tp, pp, stage, tokens, peak, model, ratio in MEMORY.findall(res.stdout):
        if int(it) % 2 == 0:
            continue
        key = (f"<{tp},{pp},1>", int(stage))
        if key not in rows or float(ratio) > rows[key]["measured_over_model"]:
            rows[key] = {"scheme": key[0], "stage": key[1], "tokens": int(tokens), "peak_mib": float(peak),
                         "model_mib": float(model), "measured_over_model": float(ratio)}
    out = {"profile": "cpu-tiny", "ranks": 4, "dtype": "fp32", "rows": list(rows.values()),
           "min_ratio": min(r["measured_over_model"] for r in rows.values()),
           "max_ratio": max(r["measured_over_model"] for r in rows.values())}
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    for r in out["rows"]:
        print(f"| {r['scheme']} | {r['stage']} | {r['tokens']} | {r['peak_mib']:.2f} MiB | {r['model_mib']:.2f} MiB | "
              f"{r['measured_over_model']:.3f} |")


if __name__ == "__main__":
    main()
