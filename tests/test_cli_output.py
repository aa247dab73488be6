"""What a user reads when something is off, in-process: typer's usage errors in one line, `validate` stopping at
the first plan for another profile, tables that never cut a path or a strategy at 80 columns, plurals and the
baseline's "faster", a strategies file without its schema tag, and the API's errors for bad lengths."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from collections import Counter

import pytest
from rich.console import Console
from rich.table import Table

from hydraplan.app import cli, cliopts
from hydraplan.app.cmd_plan import _slower
from hydraplan.core.errors import UserError
from hydraplan.core.schema import PipelineSpec
from hydraplan.store.paths import ROOT

EXAMPLE = ROOT / "plans" / "example"


def run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`hydraplan ARGS` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["hydraplan", *args])
    code = 0
    try:
        cli._invoke()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except UserError as e:  # cliopts.run's part: one line, exit 2
        print(f"hydraplan: {e}", file=sys.stderr)
        code = 2
    out, err = capsys.readouterr()
    return code, out, err


def narrow(monkeypatch) -> io.StringIO:
    """An 80-column terminal for the tables (cliopts.print_table)."""
    buf = io.StringIO()
    monkeypatch.setattr(cliopts, "console", Console(file=buf, width=80, force_terminal=True, color_system=None))
    return buf


@pytest.mark.parametrize("args,needle", [
    (["pack", "--profile", "cpu-tiny", "--tokens-per-iter", "1e9"], "hydraplan: pack: Invalid value for '--tokens-per-iter'"),
    (["pack", "--bogus"], "hydraplan: pack: No such option: --bogus"),
    (["validate"], "hydraplan: validate: Missing argument 'path'"),
    (["profiles", "lst"], "hydraplan: profiles: No such command 'lst'. Did you mean 'list'?"),
])
def test_usage_errors_are_one_line_and_exit_2(monkeypatch, capsys, args, needle):
    code, out, err = run(monkeypatch, capsys, *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith(needle), err
    assert "╭" not in err and err.rstrip().endswith(f"(hydraplan {args[0]} -h)")  # the command (or group) that refused


def test_help_and_version_still_exit_0(monkeypatch, capsys):
    code, out, _ = run(monkeypatch, capsys, "--version")
    assert code == 0 and out.startswith("hydraplan ")
    code, out, _ = run(monkeypatch, capsys, "validate", "-h")
    assert code == 0 and "--profile" in out


def test_validate_against_another_profile_stops_at_the_first_plan_in_one_line(monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, "validate", str(EXAMPLE), "--profile", "h100-llama2-7b")
    assert code == 2 and out == "" and err.splitlines() == [
        f"hydraplan: {EXAMPLE / 'iter_000000.json'}: field profile: the plan is for profile 'cpu-tiny', not "
        "'h100-llama2-7b' (pass --profile cpu-tiny)"]


def test_validate_says_one_plan(monkeypatch, capsys):
    code, out, _ = run(monkeypatch, capsys, "validate", str(EXAMPLE / "iter_000000.json"), "--profile", "cpu-tiny")
    assert code == 0 and re.fullmatch(r"OK: 1 plan, \d+ pipelines?, \d+ micro-batch(es)? satisfy every constraint\n", out)


def cells(text: str, column: int, key: int) -> list[str]:
    """A rich table's `column`, each row's wrapped or folded pieces joined without spaces (box drawing: cells
    between │); a row starts where column `key` is not empty."""
    rows: list[str] = []
    for line in text.splitlines():
        if line.startswith("│"):
            parts = line.split("│")
            if parts[key + 1].strip():
                rows.append("")
            rows[-1] += parts[column + 1].replace(" ", "")
    return rows


def test_validate_table_shows_a_long_path_whole_at_80_columns(monkeypatch, capsys, tmp_path):
    run_dir = tmp_path / "a-rather-long-folder-name-for-runs" / "experiment-2026-11-27-h100-llama2-7b" / "run"
    shutil.copytree(EXAMPLE, run_dir)
    plan = json.loads((run_dir / "iter_000002.json").read_text())
    plan["pipelines"][0]["estimate_s"] += 1.0
    (run_dir / "iter_000002.json").write_text(json.dumps(plan))
    buf = narrow(monkeypatch)
    code, out, _ = run(monkeypatch, capsys, "validate", str(run_dir), "--profile", "cpu-tiny")
    table = buf.getvalue()
    assert code == 1 and "…" not in table and max(map(len, table.splitlines())) <= 80
    assert str(run_dir / "iter_000002.json") in cells(table, 0, key=3)
    assert out.startswith("2 violations in 4 plans") or re.match(r"\d+ violations? in 4 plans", out), out


def test_a_wide_strategy_is_never_cut_at_80_columns():
    """compare's table (9 columns, one row) on an 80-column terminal: rich used to end the strategy in an ellipsis."""
    wide = "<4,1,2,selective>x8+<2,1,1>x4"
    buf = io.StringIO()
    table = Table("method", "strategy", "iter s", "prop s", "sync s", "1F1B s", "speedup", "gap", "MFU")
    table.add_row("hydraplan", wide, "0.443", "0.443", "0.000", "0.443", "1.27x", "0%", "41.9%")
    cliopts.console, saved = Console(file=buf, width=80, force_terminal=True, color_system=None), cliopts.console
    try:
        cliopts.print_table(table)
    finally:
        cliopts.console = saved
    text = buf.getvalue()
    shown = "".join(line.split("│")[2].strip() for line in text.splitlines() if line.startswith("│"))
    assert "…" not in text and shown == wide and max(map(len, text.splitlines())) <= 80


def test_propose_table_shows_every_strategy_whole_at_80_columns(monkeypatch, capsys, tmp_path):
    """28 candidates, strategies up to 56 characters among 8 columns: wrapped or folded, never cut."""
    buf = narrow(monkeypatch)
    code, _, err = run(monkeypatch, capsys, "propose", "--profile", "h100-llama2-7b", "--dataset", "builtin:wikipedia",
                       "--gpus", "64", "--context-len", "32768", "--tokens-per-iter", "200000", "--out", str(tmp_path / "s.json"))
    assert code == 0, err
    table = buf.getvalue()
    strategies = json.loads((tmp_path / "s.json").read_text())["candidates"]
    assert "…" not in table and max(map(len, table.splitlines())) <= 80
    assert cells(table, 0, key=0) == [c["name"] for c in strategies]
    assert cells(table, 7, key=0) == [",".join(s.split("-")[0] for s in c["sources"]) for c in strategies]  # the last
    for candidate, shown in zip(strategies, cells(table, 1, key=0)):
        counts = Counter(PipelineSpec(**p).label for p in candidate["pipelines"])
        assert shown == "+".join(f"{n}x{label}" for label, n in counts.items()), shown


def test_the_baseline_ratio_says_faster_below_one():
    assert _slower(1.39) == "1.39x slower" and _slower(1.0) == "1.00x slower" and _slower(0.78) == "1.28x faster"
    assert cliopts.plural(1, "plan") == "1 plan" and cliopts.plural(2, "micro-batch", "micro-batches") == "2 micro-batches"


def test_a_strategies_file_without_its_schema_tag_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    strategies = tmp_path / "s.json"
    strategies.write_text(json.dumps({"candidates": [{"name": "S0", "pipelines": [{"tp": 1, "pp": 1, "cp": 1}] * 4}]}))
    code, out, err = run(monkeypatch, capsys, "pack", "--profile", "cpu-tiny", "--dataset", "builtin:wikipedia", "--gpus", "4",
                         "--tokens-per-iter", "1536", "--context-len", "768", "--iterations", "1", "--strategies",
                         str(strategies), "--out", str(tmp_path / "run"))
    assert code == 2 and err.splitlines() == [
        f"hydraplan: {strategies}: field schema: missing (this file must start with "
        '{"schema": "hydraplan.strategies/v1", ...})']
    assert list((tmp_path / "run").iterdir()) == []  # and the --out lock is gone


@pytest.mark.parametrize("lengths,message", [
    ([300, 100.5], "lengths[1] is 100.5"),
    ([300, 0], "lengths[1] is 0"),
    ([300, "x"], "lengths[1] is 'x'"),
    ([float("nan")], "lengths[0] is nan"),
    ([], "(got [])"),
    ([[1, 2]], "(got [[1, 2]])"),
])
def test_the_api_names_the_bad_length(lengths, message):
    from hydraplan import Planner
    from hydraplan.schema import Candidate, PipelineSpec, Strategies

    planner = Planner("cpu-tiny", Strategies(candidates=[Candidate(name="dp", pipelines=[PipelineSpec(tp=1, pp=1, cp=1)])]),
                      gpus=1, context_len=512)
    with pytest.raises(UserError) as e:
        planner.plan(lengths)
    assert message in str(e.value) and "shape" not in str(e.value) and "--" not in str(e.value)
    assert planner.plan([300, 100.0]).batch[1].length == 100


def test_the_api_does_not_tell_a_python_caller_about_cli_flags():
    from hydraplan import Planner
    from hydraplan.schema import Candidate, PipelineSpec, Strategies

    planner = Planner("cpu-tiny", Strategies(candidates=[Candidate(name="dp", pipelines=[PipelineSpec(tp=1, pp=1, cp=1)])]),
                      gpus=1)
    with pytest.raises(UserError, match=r"no candidate can hold a sequence of length 10000000 .* truncate sequences to at most "
                                        r"\d+ tokens") as e:
        planner.plan([10_000_000])
    assert "--" not in str(e.value)


def test_validate_stops_at_a_plan_for_a_job_size_the_profile_cannot_lay_out(tmp_path):
    from hydraplan.app.validate import validate_path
    from hydraplan.store.profiles import load_profile

    for i in range(2):
        plan = json.loads((EXAMPLE / f"iter_{i:06d}.json").read_text())
        plan["gpus"] = 1
        (tmp_path / f"iter_{i:06d}.json").write_text(json.dumps(plan))
    tiny = load_profile("cpu-tiny")
    no_single = tiny.model_copy(update={"schemes": [s for s in tiny.schemes if s.gpus >= 2]})
    with pytest.raises(UserError, match=r"^\S+/iter_000000\.json: field gpus: 1: profile cpu-tiny: no scheme fits in 1 GPU"):
        validate_path(tmp_path, no_single)


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_interrupt_is_one_line_even_inside_compiled_code(capsys, wrapped):
    """SIGTERM raised by the handler inside a numba dispatcher's Python callback comes back as a SystemError whose
    cause is the interrupt (seen in `pack`): still the one line and exit 143, as when it is raised in plain Python."""
    import signal
    import warnings

    def command():
        if not wrapped:
            raise cliopts.Interrupted(signal.SIGTERM)
        try:
            raise cliopts.Interrupted(signal.SIGTERM)
        except cliopts.Interrupted as e:
            raise SystemError("CPUDispatcher(<function f>) returned a result with an exception set") from e

    saved, showwarning = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}, warnings.showwarning
    try:
        with pytest.raises(SystemExit) as exit_:
            cliopts.run(command)
    finally:  # run() installs its signal handlers and warning hook for the process
        for s, h in saved.items():
            signal.signal(s, h)
        warnings.showwarning = showwarning
    assert exit_.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.startswith("hydraplan: interrupted (SIGTERM)")
