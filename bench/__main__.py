"""`python -m bench` runs every bench (bench/bench_*.py) with today's code, each writing bench/results/NAME.json;
`python -m bench NAME [ARGS]` runs one (ARGS as its docstring says); `--smoke` runs the tiny configuration of
each into a temporary folder (or `--out DIR`), the check `make test` makes that no bench is broken; `--list`
prints the benches. Afterwards `python -m bench.docs` rewrites the docs' tables and figures from the results."""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.run import RESULTS, names, run_bench


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="every bench on a tiny configuration (a few minutes)")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results; a temporary one with --smoke)")
    parser.add_argument("--list", action="store_true", help="print the benches and exit")
    parser.add_argument("name", nargs="?", help="one bench (default: all)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of that bench")
    a = parser.parse_args(argv)
    if a.list:
        print("\n".join(names()))
        return 0
    todo = [(a.name, a.args)] if a.name else [(n, []) for n in names()]
    with tempfile.TemporaryDirectory(prefix="bench_smoke_") as tmp:
        out = a.out or (Path(tmp) if a.smoke else RESULTS)
        for name, args in todo:
            t0 = time.perf_counter()
            print(f"== {name}{' (smoke)' if a.smoke else ''}", flush=True)
            path = run_bench(name, args, smoke=a.smoke, results=out)
            print(f"== {name}: wrote {path} in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
