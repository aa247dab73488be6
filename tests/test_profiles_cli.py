"""`hydraplan profiles list|show|generate`."""

import json

from helpers import hp
from typer.testing import CliRunner

from hydraplan.app.cli import app
from hydraplan.core.cluster import max_len_for_gpus
from hydraplan.schema import Profile
from hydraplan.store.fileio import parse_model, write_model
from hydraplan.store.paths import PROFILES_DIR
from hydraplan.store.profiles import load_profile

SIX = [f"{g}-llama2-{m}" for g in ("h100", "a800") for m in ("7b", "13b", "32b")]
WIDE = {"COLUMNS": "200"}


def run(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def test_list_shows_the_six_profiles():
    table = run("profiles", "list")
    assert table.exit_code == 0, table.output
    for name in SIX:
        assert name in table.output
    rows = json.loads(run("profiles", "list", "--json").output)
    by_name = {r["name"]: r for r in rows}
    assert set(SIX) <= set(by_name)
    for name in SIX:
        p = load_profile(name)
        assert by_name[name]["schemes"] == len(p.schemes)
        assert by_name[name]["gpu"] == p.gpu.name and by_name[name]["source"] == "analytic"


def test_show_json_is_the_profile():
    out = run("profiles", "show", "a800-llama2-7b", "--json")
    assert out.exit_code == 0, out.output
    shown = parse_model(Profile, json.loads(out.output), "show --json")
    assert shown == load_profile("a800-llama2-7b")


def test_show_json_for_gpus_recomputes_max_len():
    p = load_profile("h100-llama2-13b")
    shown = parse_model(Profile, json.loads(run("profiles", "show", "h100-llama2-13b", "--gpus", "16", "--json").output), "x")
    assert shown.schemes and all(s.gpus <= 16 for s in shown.schemes)
    for s in shown.schemes:
        assert s.max_len == max_len_for_gpus(p, p.scheme(*s.key), 16) < p.scheme(*s.key).max_len


def test_show_table_rows():
    p = load_profile("a800-llama2-7b")
    out = run("profiles", "show", "a800-llama2-7b")
    assert out.exit_code == 0, out.output
    row = next(line for line in out.output.splitlines() if "<8,1,1>" in line)
    s = p.scheme(8, 1, 1)
    assert f"{s.max_len:,}" in row and f"{s.util_len:,}" in row
    assert f"{4096 / (s.time.a * 4096**2 + s.time.b * 4096 + s.time.c) / 8:,.0f}" in row
    short = next(line for line in out.output.splitlines() if "<1,1,1>" in line)
    assert "OOM" in short  # 32K does not fit on one GPU


def test_show_accepts_a_path(tmp_path):
    p = load_profile("h100-llama2-7b").model_copy(update={"name": "custom"})
    write_model(tmp_path / "custom.json", p)
    out = run("profiles", "show", str(tmp_path / "custom.json"), "--json")
    assert out.exit_code == 0 and json.loads(out.output)["name"] == "custom"


def test_generate_rewrites_identical_files(tmp_path):
    out = run("profiles", "generate", "--out-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    for name in SIX:
        assert (tmp_path / f"{name}.json").read_bytes() == (PROFILES_DIR / f"{name}.json").read_bytes()


def test_unknown_profile_exits_2_with_one_line():
    for args, named in ((["profiles", "show", "no-such-gpu"], "no-such-gpu"),
                        (["profiles", "show", "a800-llama2-7b", "--gpus", "0"], "--gpus")):
        proc = hp(*args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr
