"""The committed run plans/example is what the current code plans, and it replays in the one command the
docs show (whichever page holds it), with the strategies, token counts and losses they show."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import doc_pages, free_port, hp

from hydraplan.store.paths import ROOT

EXAMPLE = ROOT / "plans" / "example"
TIMING = {"solver_s", "dispatch_s", "pack_s", "refine_s"}  # wall-clock seconds: the only fields that may differ


def example_args() -> list[str]:
    """`make example`'s pack arguments (the Makefile is the one place they are written)."""
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("EXAMPLE_ARGS :="))
    return shlex.split(line.split(":=", 1)[1])


def normalized(value):
    """JSON content without timing fields, floats to 12 significant digits (printing, not planning, noise)."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.12g}")
    return value


def test_the_committed_example_run_is_what_the_planner_plans_today(tmp_path):
    out = tmp_path / "example"
    res = hp("pack", *example_args(), "--out", out)
    assert res.returncode == 0, res.stderr
    committed = sorted(p.name for p in EXAMPLE.iterdir())
    assert committed == sorted(p.name for p in out.iterdir())  # pack removed its --out lock (.hydraplan.lock)
    assert {"strategies.json", "summary.json", "iter_000000.json"} <= set(committed)
    for name in committed:
        fresh, kept = (json.loads((d / name).read_text()) for d in (out, EXAMPLE))
        assert normalized(fresh) == normalized(kept), f"plans/example/{name} is out of date: run `make example`"


REPLAY = re.compile(r"```\n(torchrun --nproc-per-node 4 runtime/run_plan.py plans/example [^\n]*)\n```")


def replay_page() -> str:
    """The one Markdown page that shows the replay of plans/example."""
    (page,) = [p for p in doc_pages() if REPLAY.search((ROOT / p).read_text())]
    return page


def replay_block() -> tuple[str, list[str]]:
    """The page's replay command for plans/example and the output lines it shows."""
    text = (ROOT / replay_page()).read_text()
    command = REPLAY.search(text).group(1)
    output = re.search(r"```\n((?:attention: [^\n]*\n)?iteration 0 strategy .*?)```", text, re.S).group(1)
    return command, output.strip().splitlines()


ITERATION = re.compile(r"^iteration (\d+) strategy (\S+) (\S+) tokens=(\d+) loss=([\d.]+) time=")
VERIFY = re.compile(r"^verify: iteration (\d+) max_abs_param_diff=(\S+)$")


def facts(lines: list[str]) -> tuple[list[tuple[str, ...]], list[float]]:
    """(iteration, strategy, layout, tokens, loss) per iteration and the verify differences; times dropped."""
    its = [m.groups() for m in map(ITERATION.match, lines) if m]
    diffs = [float(m.group(2)) for m in map(VERIFY.match, lines) if m]
    return its, diffs


def test_the_docs_show_the_example_run():
    command, shown = replay_block()
    assert "plans/example" in command
    its, diffs = facts(shown)
    assert 1 <= len(its) == len(diffs) <= len(list(EXAMPLE.glob("iter_*.json")))
    for (it, strategy, *_), path in zip(its, sorted(EXAMPLE.glob("iter_*.json"))):
        assert json.loads(path.read_text())["strategy"] == strategy, f"{replay_page()} replay output, iteration {it}"
    text = " ".join((ROOT / replay_page()).read_text().replace("\\\n", " ").split())
    assert f"hydraplan pack {' '.join(example_args())} --out plans/example" in text


@pytest.mark.slow
def test_the_example_replays_in_one_command_as_the_docs_show():
    command, shown = replay_block()
    argv = shlex.split(command)
    assert argv[:3] == ["torchrun", "--nproc-per-node", "4"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(free_port()),
           *argv[3:], "--timeout-s", "120"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))
    assert res.returncode == 0, res.stderr[-2000:]
    its, diffs = facts(res.stdout.splitlines())
    assert its[:len(facts(shown)[0])] == facts(shown)[0]  # a page may show the first iterations only
    assert len(diffs) == len(its) == len(list(EXAMPLE.glob("iter_*.json"))) and max(diffs) <= 1e-9
