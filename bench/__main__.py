"""Run every benchmark module (bench/bench_*.py) in turn; each writes bench/results/<name>.json."""

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main(argv: list[str]) -> None:
    names = argv or sorted(p.stem for p in HERE.glob("bench_*.py"))
    for name in names:
        print(f"== {name}", flush=True)
        importlib.import_module(f"bench.{name}").main()


if __name__ == "__main__":
    main(sys.argv[1:])
