"""File formats: the v1 contract examples parse, round-trip, and bad files fail with one clear line."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from hydraplan.app.cli import app
from hydraplan.core.errors import UserError
from hydraplan.schema import Plan, Profile, Strategies
from hydraplan.store.fileio import atomic_write_text, load_model, model_json, write_model

# The examples of the v1 file contracts as first published, verbatim: other tools write exactly these.
PROFILE = {
    "schema": "hydraplan.profile/v1", "name": "h100-llama2-7b",
    "gpu": {"name": "H100-SXM-80GB", "memory_gib": 80, "gpus_per_node": 8},
    "model": {"name": "llama2-7b", "layers": 32, "hidden": 4096},
    "schemes": [{"tp": 2, "pp": 2, "cp": 1, "max_len": 49152, "util_len": 4096,
                 "time": {"a": 1.1e-10, "b": 2.0e-5, "c": 3.0e-3}}],
}
PLAN = {
    "schema": "hydraplan.plan/v1", "iteration": 17, "profile": "h100-llama2-7b", "gpus": 64,
    "batch": [{"id": 5121, "doc": 90417, "length": 30711}, {"id": 88, "doc": 12, "length": 912}],
    "strategy": "S3",
    "pipelines": [{"tp": 8, "pp": 1, "cp": 1, "ranks": [0, 1, 2, 3, 4, 5, 6, 7],
                   "micro_batches": [{"seqs": [5121]}, {"seqs": [88, 77]}], "estimate_s": 1.92}],
    "estimate": {"propagation_s": 1.92},
}
STRATEGIES_BY_HAND = {  # the minimal hand-written form: ranks optional
    "schema": "hydraplan.strategies/v1",
    "candidates": [{"name": "S0", "pipelines": [{"tp": 8, "pp": 1, "cp": 1}]}],
}


@pytest.mark.parametrize("cls,data", [(Profile, PROFILE), (Plan, PLAN), (Strategies, STRATEGIES_BY_HAND)])
def test_design_examples_round_trip(tmp_path, cls, data):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(data))
    model = load_model(cls, path)
    write_model(path, model)
    again = json.loads(path.read_text())
    # nothing renamed or dropped; only documented defaults may be added (a profile's reference_gpus)
    assert {k: v for k, v in again.items() if k in data} == data
    assert set(again) - set(data) <= {"reference_gpus"}
    assert load_model(cls, path) == model


def test_unknown_fields_survive_round_trip(tmp_path):
    data = json.loads(json.dumps(PLAN))
    data["pipelines"][0]["micro_batches"][0]["splits"] = [100, 200]
    data["estimate"]["seq1f1b_s"] = 1.5
    plan = Plan.model_validate(data)
    assert json.loads(model_json(plan)) == data


def test_scheme_derived_properties():
    s = Profile.model_validate(PROFILE).schemes[0]
    assert (s.gpus, s.key, s.label) == (4, (2, 2, 1, "none"), "<2,2,1>")


def test_recompute_is_part_of_the_scheme_and_written_only_when_set(tmp_path):
    """A profile holds <2,2,1> once per recomputation mode; `recompute` defaults to none, is written only when
    set (so files without it round-trip unchanged) and appears in keys and labels; a bad mode names its field."""
    data = json.loads(json.dumps(PROFILE))
    data["schemes"].append({**data["schemes"][0], "recompute": "full", "max_len": 200000})
    prof = Profile.model_validate(data)
    assert [(s.key, s.label) for s in prof.schemes] == [((2, 2, 1, "none"), "<2,2,1>"),
                                                        ((2, 2, 1, "full"), "<2,2,1,full>")]
    assert prof.scheme(2, 2, 1) is prof.schemes[0] and prof.scheme(2, 2, 1, "full") is prof.schemes[1]
    assert json.loads(model_json(prof))["schemes"] == data["schemes"]
    plan = Plan.model_validate(PLAN)
    plan.pipelines[0].recompute = "selective"
    assert json.loads(model_json(plan))["pipelines"][0]["recompute"] == "selective"
    data["schemes"][1]["recompute"] = "some"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"field schemes\.1\.recompute"):
        load_model(Profile, path)


@pytest.mark.parametrize(
    "mutate,field,value",
    [
        (lambda d: d["schemes"][0]["time"].__setitem__("a", "fast"), "schemes.0.time.a", "'fast'"),
        (lambda d: d["schemes"][0].__setitem__("tp", 0), "schemes.0.tp", "0"),
        (lambda d: d["gpu"].pop("memory_gib"), "gpu.memory_gib", None),
        (lambda d: d.__setitem__("schema", "hydraplan.profile/v9"), "schema", "hydraplan.profile/v9"),
    ],
)
def test_bad_profile_names_file_field_and_value(tmp_path, mutate, field, value):
    data = json.loads(json.dumps(PROFILE))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as e:
        load_model(Profile, path)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(path) in msg and f"field {field}" in msg
    if value is not None:
        assert value in msg


def test_duplicate_scheme_rejected():
    data = json.loads(json.dumps(PROFILE))
    data["schemes"].append(dict(data["schemes"][0]))
    with pytest.raises(Exception, match="duplicate scheme <2,2,1>"):
        Profile.model_validate(data)


def test_pipeline_ranks_must_match_size():
    data = json.loads(json.dumps(STRATEGIES_BY_HAND))
    data["candidates"][0]["pipelines"][0]["ranks"] = [0, 1, 2]
    with pytest.raises(Exception, match="ranks has 3 entries but tp\\*pp\\*cp = 8"):
        Strategies.model_validate(data)


def test_not_json_and_missing_file(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{ nope")
    with pytest.raises(UserError, match=r"x\.json: not valid JSON: .* line 1 column 3"):
        load_model(Plan, bad)
    with pytest.raises(UserError, match="no such file"):
        load_model(Plan, tmp_path / "missing.json")


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    atomic_write_text(path, "old")

    def boom(*_):
        raise OSError("disk full")

    monkeypatch.setattr("hydraplan.store.fileio.os.replace", boom)
    with pytest.raises(UserError, match="out.json: cannot write: disk full"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp file left behind


def test_schema_command_writes_valid_json_schemas(tmp_path):
    result = CliRunner().invoke(app, ["schema", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    names = {p.name for p in tmp_path.iterdir()}
    assert {"plan.schema.json", "profile.schema.json", "strategies.schema.json", "summary.schema.json"} <= names
    plan_schema = json.loads((tmp_path / "plan.schema.json").read_text())
    assert {"schema", "iteration", "batch", "pipelines", "estimate"} <= set(plan_schema["required"]) | set(
        plan_schema["properties"]
    )


def test_cli_user_error_is_one_line_exit_2(tmp_path):
    """The console script turns UserError into one stderr line and exit code 2, no traceback."""
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({**PROFILE, "schemes": []}))
    code = (
        "import sys; from hydraplan.app.cli import main, app\n"
        "from hydraplan.store.fileio import load_model; from hydraplan.schema import Profile\n"
        "@app.command('load-test')\n"
        "def _t(p: str): load_model(Profile, p)\n"
        "sys.argv = ['hydraplan', 'load-test', sys.argv[1]]; main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "field schemes" in lines[0] and "Traceback" not in proc.stderr


def test_atomic_write_gives_the_mode_a_plain_open_would(tmp_path):
    """mkstemp creates 0600 files; plans must stay readable by the cluster's other users and tools."""
    atomic_write_text(tmp_path / "atomic.json", "{}")
    (tmp_path / "plain.json").write_text("{}")
    mode = lambda p: p.stat().st_mode & 0o777  # noqa: E731
    assert mode(tmp_path / "atomic.json") == mode(tmp_path / "plain.json")
