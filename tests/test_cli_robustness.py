"""A scripted bad-input and fault run of the CLI: every user mistake and OS write failure is one line and
exit 2; Ctrl-C/SIGTERM one line naming --resume; a killed `pack` leaves no process or temp folder behind;
a second `pack` on the same --out is refused while the first runs, and the lock dies with a killed run.
Commands run in this process (helpers.hp) except where a signal or a kill must reach the installed command."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import alive, children, hp, write_run_inputs

from hydraplan.schema import Strategies

HYDRAPLAN = str(Path(sys.executable).with_name("hydraplan"))
WIKI = ["--profile", "h100-llama2-7b", "--dataset", "builtin:wikipedia", "--gpus", "64"]


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(5)
    lengths = np.minimum(rng.lognormal(6.0, 1.2, 3000).astype(np.int64) + 1, 4000)
    profile, data, strat = write_run_inputs(tmp_path, lengths, Strategies(candidates=[
        {"name": "mixed", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}, *[{"tp": 1, "pp": 1, "cp": 1}] * 2]},
    ]))
    return {"profile": profile, "data": data, "strategies": strat, "tmp": tmp_path}


def pack_args(inputs, out, iterations, workers=1):
    return ["pack", "--profile", inputs["profile"], "--dataset", inputs["data"], "--gpus", 4, "--tokens-per-iter", 15000,
            "--iterations", iterations, "--out", out, "--workers", workers, "--strategies", inputs["strategies"]]


def one_line_exit_2(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def read_only_path(tmp_path: Path) -> Path:
    """A folder nobody may create: under a mode-0500 folder, or for root (which ignores modes) in /proc."""
    if os.geteuid() == 0:
        return Path("/proc/hydraplan-no-such-folder/out")
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    return locked / "out"


def test_bad_input_and_write_failures_are_one_line_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    pack = ["pack", *WIKI, "--tokens-per-iter", 200000, "--iterations", 2]
    cases = [
        ([*pack, "--out", tmp_path / "r", "--context-len", 0], ["--context-len", "(got 0)"]),
        ([*pack, "--out", tmp_path / "r", "--context-len", -1], ["--context-len", "(got -1)"]),
        ([*pack, "--out", tmp_path / "r", "--workers", 0], ["--workers", "(got 0)"]),
        ([*pack, "--out", tmp_path / "r", "--workers", -1], ["--workers", "(got -1)"]),
        ([*pack, "--out", tmp_path / "r", "--gpus", 0], ["--gpus", "(got 0)"]),
        ([*pack, "--out", blocker / "run"], [str(blocker / "run"), "Not a directory"]),
        ([*pack, "--out", blocker], [str(blocker), "not a folder"]),
        ([*pack, "--out", read_only_path(tmp_path)], [str(read_only_path(tmp_path)), "cannot create"]),
        (["propose", *WIKI, "--out", folder], [str(folder), "is a folder"]),
        (["propose", *WIKI, "--out", blocker / "s.json"], [str(blocker / "s.json"), "not a folder"]),
        (["propose", *WIKI, "--out", read_only_path(tmp_path) / "s.json"], ["cannot create"]),
        (["propose", *WIKI, "--context-len", 0, "--out", tmp_path / "s.json"], ["--context-len", "(got 0)"]),
        (["compare", *WIKI, "--tokens-per-iter", 200000, "--iterations", 2, "--out", blocker], [str(blocker), "not a folder"]),
        (["dataset", "stats", "builtin:wikipedia", "--plot", folder], [str(folder), ".png"]),
        (["dataset", "stats", "builtin:wikipedia", "--plot", blocker / "h.png"], ["not a folder"]),
        (["dataset", "stats", "builtin:wikipedia", "--context-len", 0], ["--context-len", "(got 0)"]),
        (["pipeline", "--schedule", "1f1b", "--stages", 4, "--micro-batches", 8, "--plot", folder], [".png"]),
        (["profiles", "show", "h100-llama2-7b", "--gpus", 0], ["--gpus", "(got 0)"]),
        (["pipeline", "--schedule", "1f1b", "--stages", 1000, "--micro-batches", 100000],
         ["200,000,000 forward and backward actions", "at most 100,000"]),
        (["schema", "--out", blocker], [str(blocker), "not a folder"]),
    ]
    for args, needles in cases:
        one_line_exit_2(hp(*args), *needles)
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.parametrize(("text", "needle"), [
    ("length\n100\n1e23\n", "1e+23 is too large"),
    ("length\n100\nNaN\n", "nan is not an integer"),
    ("length\n100\ninf\n", "inf is not an integer"),
    ("length\n100\n99999999999\n", "99,999,999,999 is too large (at most 2,147,483,647 tokens)"),
    ("length,count\n100,1000000000000\n", "1,000,000,000,000 is too large"),
])
def test_lengths_never_overflow_and_say_what_the_value_is(tmp_path, text, needle):
    data = tmp_path / "lengths.csv"
    data.write_text(text)
    one_line_exit_2(hp("dataset", "stats", data), str(data), "line", needle)


def test_json_lengths_beyond_int64(tmp_path):
    data = tmp_path / "lengths.json"
    data.write_text("[100, 100000000000000000000000]")
    one_line_exit_2(hp("dataset", "stats", data), "item 1", "is too large")


def test_version_short_help_and_flags_without_a_type():
    v = hp("--version")
    assert v.returncode == 0 and v.stdout.startswith("hydraplan ")
    for cmd in (["validate"], ["pack"], ["compare"], ["propose"], ["dataset", "stats"], ["profiles", "list"], ["schema"]):
        h = hp(*cmd, "-h", env={"COLUMNS": "200"})
        assert h.returncode == 0 and "--json" in h.stdout, (cmd, h.stdout)
        assert "<bool>" not in h.stdout, (cmd, h.stdout)
    # a help paragraph wraps at the terminal, not at its docstring's source line breaks
    h = hp("profile", "-h", env={"COLUMNS": "200"})
    assert "critical path of the executed schedule over each action's thread CPU time" in h.stdout, h.stdout


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_is_one_line_naming_resume_and_resume_finishes(inputs, sig):
    out = inputs["tmp"] / "run"
    proc = subprocess.Popen([HYDRAPLAN, *map(str, pack_args(inputs, out, 2000))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(out / "iter_000001.json", proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("hydraplan: interrupted")
    assert "--resume" in err.strip().splitlines()[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["iterations"]) >= 2  # everything planned before the signal is recorded


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigkill_leaves_no_worker_tracker_or_temp_folder(inputs):
    out = inputs["tmp"] / "run"
    tmp_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "pymp-*")))
    proc = subprocess.Popen([HYDRAPLAN, *map(str, pack_args(inputs, out, 5000, workers=2))], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(out / "iter_000001.json", proc)
    kids = children(proc.pid)
    assert len(kids) >= 2  # the workers (and the resource tracker)
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while any(alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if alive(k)]
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "pymp-*"))) <= tmp_before


def test_second_pack_on_the_same_out_is_refused_and_the_lock_dies_with_a_killed_run(inputs):
    out = inputs["tmp"] / "run"
    first = subprocess.Popen([HYDRAPLAN, *map(str, pack_args(inputs, out, 5000))], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(out / "iter_000000.json", first)
    second = hp(*pack_args(inputs, out, 3))
    one_line_exit_2(second, str(out), f"in use by pid {first.pid}", "hydraplan pack")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    again = hp(*pack_args(inputs, out, 3))  # no stale lock: the kernel dropped it with the process
    assert again.returncode == 0, again.stderr
    assert len(json.loads((out / "summary.json").read_text())["iterations"]) == 3


def test_non_terminal_runs_print_progress_lines(inputs):
    """The installed command, its stderr a pipe (HYDRAPLAN_PROGRESS_EVERY_S is read at start-up)."""
    r = subprocess.run([HYDRAPLAN, *map(str, pack_args(inputs, inputs["tmp"] / "run", 40))], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "HYDRAPLAN_PROGRESS_EVERY_S": "0.2"})
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("pack: ")]
    assert lines and all(x.endswith(" s]") for x in lines), r.stderr
