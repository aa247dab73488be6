"""The run's options are declared once (job/config.py, engine/settings.py, app/config.py: fields with an `Opt`):
`hydraplan pack --help` and the runtime's planning flags show exactly those, and both command lines build
the same typed config."""

import argparse
import re

import pytest
from helpers import hp

from hydraplan.app.config import PackConfig
from hydraplan.core.errors import UserError
from hydraplan.core.options import options
from hydraplan.runtime import online

# pack's options the runtime does not take: run_plan's own (--dataset, --iterations), the world size (--gpus), and
# what only steers a pack invocation. A new option is either online or named here.
PACK_ONLY = {"dataset", "iterations", "gpus", "out", "workers", "resume", "format", "bound"}


def help_rows(command: str) -> dict[str, str]:
    """flag -> its help text, from the command's `--help` (wide enough for one line per option)."""
    out = hp(command, "--help", env={"COLUMNS": "1000"}).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"│\s*\*?\s*(--[\w-]+)(?:\s+(--[\w-]+)|,\s*-\w)?\s+(?:<\w+>\s+)?(.*?)\s*│$", line)
        if m:  # a pair of flags (`--synthesize/--candidates-only`) shows as two columns
            rows["/".join(f for f in m.groups()[:2] if f)] = re.sub(r"\s*\[(default: [^]]*|required)\]", "", m.group(3))
    return rows


def runtime_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    online.add_arguments(ap)
    return ap


def test_pack_help_lists_every_declared_option_with_its_help():
    declared = {(o.flag if o.opt.off is None else f"{o.flag}/{o.opt.off}"): o.opt.help for o in options(PackConfig)}
    rows = help_rows("pack")
    assert {f: rows[f] for f in declared} == declared
    assert set(rows) - set(declared) == {"--json", "--help"}


def test_runtime_takes_every_online_option_under_packs_name_and_help():
    actions = {flag: a for a in runtime_parser()._actions for flag in a.option_strings}
    pack = {o.name: o for o in options(PackConfig)}
    taken = {o.name for o in online.planning_options() if o.path[:1] == ("run",)}  # the rest are its own
    assert set(pack) - taken == PACK_ONLY
    for name in taken:
        o, a = pack[name], actions[pack[name].flag]
        assert a.dest == name and a.help == o.opt.help and a.default is None, name
        assert o.opt.off is None or actions[o.opt.off].dest == name


ARGS = ["--profile", "cpu-tiny", "--tokens-per-iter", "4096", "--seq1f1b", "4", "--no-static", "--candidates-only",
        "--seed", "3", "--cp-shard", "--objective", "propagation"]


def test_pack_and_the_runtime_build_the_same_typed_config(monkeypatch):
    got = {}

    def capture(config, progress=None):
        got["pack"] = config
        raise SystemExit(0)

    monkeypatch.setattr("hydraplan.app.pack.run_pack", capture)
    r = hp("pack", *ARGS, "--dataset", "builtin:wikipedia", "--gpus", "4", "--iterations", "2", "--out", "/tmp/x")
    assert r.returncode == 0, r.stderr
    runtime = runtime_config(ARGS, "builtin:wikipedia", 2)
    pack = got["pack"]
    assert runtime.args("x") == pack.args("x")
    assert pack.plan.seq1f1b == 4 and pack.plan.synthesize is False and pack.static is False and pack.seed == 3
    assert pack.args("x").seq1f1b == "4"  # summary.json keeps the text it always kept


def runtime_config(argv: list[str], dataset: str, iterations: int):
    """The run the runtime's flags give (run_plan adds --dataset and --iterations, its own), on 4 ranks."""
    args = runtime_parser().parse_args(argv)
    args.dataset, args.iterations = dataset, iterations
    return online.online_config(args, 4).run


@pytest.mark.parametrize(("flags", "synthesize"), [([], True), (["--synthesize"], True), (["--candidates-only"], False)])
def test_synthesize_defaults_on_once(flags, synthesize):
    config = runtime_config(["--profile", "p", "--tokens-per-iter", "9", *flags], "d", 1)
    assert config.plan.synthesize is synthesize


@pytest.mark.parametrize("bad", [["--dispatch", "x"], ["--seq1f1b", "0"], ["--seed", "-1"], ["--context-len", "0"],
                                 ["--objective", "fastest"], ["--tokens-per-iter", "0"]])
def test_a_bad_value_is_the_same_one_line_from_pack_and_the_runtime(bad):
    argv = ["--profile", "cpu-tiny", "--tokens-per-iter", "4096", *bad]
    r = hp("pack", *argv, "--dataset", "builtin:wikipedia", "--gpus", "4", "--iterations", "2", "--out", "/tmp/x")
    with pytest.raises(UserError) as e:
        runtime_config(argv, "builtin:wikipedia", 2)
    assert r.returncode == 2 and r.stderr == f"hydraplan: {e.value}\n" and str(e.value).startswith(bad[0])
