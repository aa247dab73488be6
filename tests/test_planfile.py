"""Compact plans (store/planfile.py): every plan round-trips exactly, `pack --format compact` writes the
same plans as JSON, and validate, the runtime's reader and hydraplan.loader read both forms."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import Interrupt, StopAfter, make_plan

from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.app.validate import validate_path
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Plan
from hydraplan.loader import read_plans
from hydraplan.runtime.plan_roles import load_plans
from hydraplan.store.planfile import COMPACT_SCHEMA, decode, encode, read_plan, write_plan
from hydraplan.store.profiles import load_profile
from hydraplan.store.runfolder import plan_files

RUN = dict(profile="h100-llama2-7b", dataset="builtin:prolong", gpus=16, context_len=16384, tokens_per_iter=50_000,
           iterations=3, workers=1)


def _pack(out: Path, **flags) -> list[Plan]:
    run_pack(PackConfig(**{**RUN, **flags}, out=out))
    return [read_plan(f) for f in plan_files(out)]


@pytest.fixture(scope="module")
def flagged(tmp_path_factory) -> list[Plan]:
    """Plans with every optional part: Seq1F1B splits, CP shards, outlier delay, CAD sections, recomputation."""
    tmp = tmp_path_factory.mktemp("flags")
    strategies = tmp / "strategies.json"  # pp and cp > 1 everywhere: every plan has splits and shards
    strategies.write_text(json.dumps({"schema": "hydraplan.strategies/v1", "candidates": [
        {"name": "S", "pipelines": [{"tp": 2, "pp": 2, "cp": 2}, {"tp": 2, "pp": 2, "cp": 2, "recompute": "full"}]}]}))
    return (_pack(tmp / "a", strategies=str(strategies), static=False, seq1f1b="2", cp_shard=True, outlier_delay=True)
            + _pack(tmp / "b", profile="cpu-tiny", dataset="builtin:wikipedia", gpus=4, context_len=2048,
                    tokens_per_iter=8192, seed=0, cad=True, iterations=2))


def test_every_plan_round_trips_exactly(flagged):
    assert any(p.cad is not None for p in flagged)
    assert any(s.sampled_iteration is not None for p in flagged for s in p.batch)
    assert any(mb.splits for p in flagged for q in p.pipelines for mb in q.micro_batches)
    assert any(mb.cp_shard for p in flagged for q in p.pipelines for mb in q.micro_batches)
    assert {q.recompute for p in flagged for q in p.pipelines} >= {"none", "full"}
    for plan in flagged:
        back = decode(encode(plan))
        assert back == plan
        assert back.model_dump_json() == plan.model_dump_json()


def test_unknown_fields_round_trip_and_the_file_is_tagged(tmp_path):
    plan = make_plan(3, "S0", [(2, 1, [0, 1], [[5, 3], [7]]), (1, 2, [2, 3], [[4]])], gpus=4)
    data = plan.model_dump(by_alias=True, exclude_none=True)
    data["tool"] = {"name": "x"}
    data["pipelines"][1]["note"] = "slow"
    data["pipelines"][0]["micro_batches"][1]["tag"] = [1, 2]
    data["batch"][0]["weight"] = 0.5
    plan = Plan.model_validate(data)
    write_plan(tmp_path / "iter_000003.parquet", plan)
    assert read_plan(tmp_path / "iter_000003.parquet") == plan
    table = pq.read_table(tmp_path / "iter_000003.parquet")
    assert table.schema.metadata[b"schema"].decode() == COMPACT_SCHEMA
    kinds = table.column("kind").cast(pa.string()).to_pylist()
    assert kinds == ["pipeline"] * 2 + ["micro_batch"] * 3 + ["sequence"] * 4  # a row per pipeline, micro-batch, sequence
    assert table.column("seqs").to_pylist()[2:5] == [[0, 1], [2], [3]]  # micro-batches name sequences by their row
    assert json.loads(table.schema.metadata[b"plan"])["tool"] == {"name": "x"}


def test_recompute_has_its_column_and_files_without_it_read_as_none(tmp_path):
    plan = make_plan(0, "S0", [(2, 1, [0, 1], [[5]]), (1, 2, [2, 3], [[4]])], gpus=4)
    plan.pipelines[1].recompute = "selective"
    table = pq.read_table(pa.BufferReader(encode(plan)))
    assert table.column("recompute").to_pylist()[:2] == [None, "selective"]
    assert table.column("extra").to_pylist()[:2] == [None, None]
    assert decode(encode(plan)) == plan
    buf = pa.BufferOutputStream()  # a compact file from before the column: every pipeline without recomputation
    pq.write_table(table.drop_columns(["recompute"]), buf)
    assert [q.recompute for q in decode(buf.getvalue().to_pybytes()).pipelines] == ["none", "none"]


def test_bad_compact_files_are_one_line_errors(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"not parquet")
    with pytest.raises(UserError, match="a.parquet: not a compact plan"):
        read_plan(tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "b.parquet")
    with pytest.raises(UserError, match="b.parquet: field .*column missing"):
        read_plan(tmp_path / "b.parquet")
    with pytest.raises(UserError, match="c.parquet: no such file"):
        read_plan(tmp_path / "c.parquet")


def test_pack_compact_is_pack_json_and_every_reader_reads_it(tmp_path):
    as_json = _pack(tmp_path / "json")
    with pytest.raises(Interrupt):  # stopped after two plans, then resumed: the same three
        run_pack(PackConfig(**RUN, out=tmp_path / "compact", format="compact"), StopAfter(2))
    run_pack(PackConfig(**RUN, out=tmp_path / "compact", format="compact", resume=True))
    compact = [read_plan(f) for f in plan_files(tmp_path / "compact")]
    assert compact == as_json
    assert all(f.suffix == ".parquet" for f in plan_files(tmp_path / "compact"))
    report = validate_path(tmp_path / "compact", load_profile(RUN["profile"]))
    assert report.ok and report.plans == 3
    assert [p for _, p in load_plans(tmp_path / "compact", None)] == as_json  # run_plan's reader
    assert list(read_plans(tmp_path / "compact")) == as_json  # hydraplan.loader
