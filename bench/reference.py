"""Planning speed next to an earlier commit's, measured in the same run: the repository at that commit (its
planner, bench, profiles and data, from git history) and this checkout each run bench_scale.measure, their own
copy, in a fresh process, on the same batches. Figures from one run on a shared machine compare; figures from
runs weeks apart do not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE_PARTS = ("planner", "bench", "profiles", "data")

# bench_scale.measure of the tree in argv[1], its planner imported as `hydraplan` whatever is installed
_CHILD = """
import importlib.util, json, sys
tree = sys.argv[1]
spec = importlib.util.spec_from_file_location("hydraplan", f"{tree}/planner/__init__.py",
                                              submodule_search_locations=[f"{tree}/planner"])
module = importlib.util.module_from_spec(spec)
sys.modules["hydraplan"] = module
spec.loader.exec_module(module)
sys.path.insert(0, tree)
from bench.bench_scale import measure
print(json.dumps(measure(*map(int, sys.argv[2:5]))))
"""


def checkout(commit: str) -> Path | None:
    """The repository's TREE_PARTS at `commit` in a new temporary folder; None when the history lacks it (a shallow
    clone, an archive)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, *TREE_PARTS], capture_output=True)
    if archive.returncode != 0:
        return None
    dest = Path(tempfile.mkdtemp(prefix=f"bench_{commit}_"))
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def measure(tree: Path, gpus: int, tokens: int, iterations: int, runs: int = 2) -> dict:
    """bench_scale.measure of `tree`'s planner (ROOT: this checkout) in a fresh process, run `runs` times and the last
    kept: the first compiles and caches the numba kernels it reaches, whose compile time is no planning time (a
    smoke run, whose figures nobody reads, runs once)."""
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _CHILD, str(tree), str(gpus), str(tokens), str(iterations)],
                             cwd=tree, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"bench_scale.measure in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
