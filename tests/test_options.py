"""The run's options are declared once (job/config.py, engine/settings.py, app/config.py: fields with an `Opt`):
`hydraplan pack --help` and the runtime's planning flags show exactly those, and both command lines build
the same typed config. run_plan's own flags are exactly runtime/train_config.py's, typed once into TrainConfig."""

import argparse
import re

import pytest
from helpers import hp

from hydraplan.app.config import PackConfig
from hydraplan.core.errors import UserError
from hydraplan.core.options import options
from hydraplan.runtime import device, online

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


def test_run_plans_flags_are_exactly_its_declaration_and_the_planning_ones():
    from hydraplan.runtime.run_plan import parser
    from hydraplan.runtime.train_config import TrainConfig

    actions = [a for a in parser()._actions if a.dest != "help"]
    own, planning = list(options(TrainConfig)), online.planning_options()
    flags = {f for a in actions for f in a.option_strings}
    assert flags == ({o.flag for o in own if not o.opt.positional} | {o.flag for o in planning}
                     | {o.opt.off for o in planning if o.opt.off})
    assert [a.dest for a in actions if not a.option_strings] == [o.name for o in own if o.opt.positional] == ["plan"]
    for o in own:
        a = next(a for a in actions if a.dest == o.name)
        assert (a.help, a.default, a.metavar, a.choices) == (o.opt.help, o.default, o.opt.metavar, o.choices), o.name
    assert {o.name for o in own}.isdisjoint(o.name for o in planning)
    # --dtype's names are DTYPES' and fp8, which the runtime refuses in one line (tests/test_run_plan.py)
    assert set(next(o for o in own if o.name == "dtype").choices) == set(device.DTYPES) | {"fp8"}


def train_config(*argv: str, dtype: str = "fp32"):
    from hydraplan.runtime.run_plan import configure, parse_args

    return configure(parse_args(list(argv)), dtype, 1).model_dump(exclude={"planning"})


def test_run_plans_defaults_are_the_ones_it_always_had():
    assert train_config("p", dtype="bf16") == dict(
        plan="p", iterations=None, model=None, init_from=None, hf_config=None, save=None, resume=None, dtype="bf16",
        dataset=None, verify=False, tolerance=None, compile=False, lr=1e-3, lr_warmup_iters=0,
        lr_decay_style="constant", lr_decay_iters=None, min_lr=0.0, clip_grad=1.0, init_seed=0, memory=False,
        overlap=True, timeout_s=300.0, liveness_s=30.0)


def test_every_run_plan_flag_lands_in_its_typed_field():
    got = train_config("p", "--iterations", "3", "--model", "tiny-wide", "--save", "s", "--dtype", "fp64",
                       "--dataset", "d", "--tolerance", "0.5", "--compile", "--lr", "0.01", "--lr-warmup-iters", "2",
                       "--lr-decay-style", "cosine", "--lr-decay-iters", "9", "--min-lr", "0.001", "--clip-grad", "0",
                       "--init-seed", "4", "--memory", "--no-overlap", "--timeout-s", "60", "--liveness-s", "0")
    assert got == dict(plan="p", iterations=3, model="tiny-wide", init_from=None, hf_config=None, save="s", resume=None,
                       dtype="fp64", dataset="d", verify=False, tolerance=0.5, compile=True, lr=0.01,
                       lr_warmup_iters=2, lr_decay_style="cosine", lr_decay_iters=9, min_lr=0.001, clip_grad=0.0,
                       init_seed=4, memory=True, overlap=False, timeout_s=60.0, liveness_s=0.0)
    got = train_config("p", "--init-from", "i", "--resume", "r")
    assert (got["init_from"], got["resume"], got["verify"]) == ("i", "r", False)
    got = train_config("p", "--hf-config", "f", "--verify")
    assert (got["hf_config"], got["verify"]) == ("f", True)


@pytest.mark.parametrize(("argv", "message"), [
    (["--lr-warmup-iters", "-1"], "--lr-warmup-iters: -1 is negative"),
    (["--min-lr", "-0.5"], "--min-lr: -0.5 is negative"),
    (["--clip-grad", "-1"], "--clip-grad: -1.0 is negative"),
    (["--verify", "--resume", "r"], "--verify and --resume: give one (the reference would start from the initial "
                                    "weights)"),
    (["--model", "tiny", "--hf-config", "f"], "--model and --hf-config: give one (--init-from and --hf-config take "
                                              "the model from a config.json)"),
])
def test_a_bad_run_plan_flag_is_one_line(argv, message):
    with pytest.raises(UserError) as e:
        train_config("p", *argv)
    assert str(e.value) == message


def test_a_decay_must_end_after_the_warmup():
    from hydraplan.runtime.run_plan import configure, parse_args

    config = configure(parse_args(["p", "--lr-decay-style", "cosine", "--lr-warmup-iters", "5"]), "fp32", 1)
    assert config.schedule(6).decay_iters == 6
    with pytest.raises(UserError, match=r"^--lr-decay-iters: 5 must exceed --lr-warmup-iters 5 for a cosine decay$"):
        config.schedule(5)


def test_argparse_refuses_a_dtype_or_decay_style_it_does_not_know(capsys):
    from hydraplan.runtime.run_plan import parse_args

    for flag in ("--dtype", "--lr-decay-style"):
        with pytest.raises(SystemExit) as e:
            parse_args(["p", flag, "fp16"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"run_plan: argument {flag}: invalid choice: 'fp16'"), err
