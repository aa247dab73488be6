"""Plan files in either form: JSON (`hydraplan.plan/v1`, readable, the default) or compact (Parquet,
`hydraplan.plan-compact/v1`: a tenth of the bytes at thousands of GPUs, and the form plans travel in
between the processes of a job that plans while it trains).

A compact plan is one table with a row per pipeline, per micro-batch and per sequence (`kind`), in that
order; each kind fills its own columns and leaves the others null. The plan's other fields (iteration,
profile, gpus, strategy, estimate, synthesized, cad, any unknown field) are JSON in the file's metadata
under `plan`, and `schema` names the format. A micro-batch names its sequences by
their row among the sequence rows (`seqs`). Fields a column does not hold (a CP shard, an unknown field of
a pipeline, micro-batch or sequence) are JSON in the row's `extra` column, so any plan round-trips exactly.
docs/formats.md describes the columns.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hydraplan.core.errors import UserError
from hydraplan.core.schema import Plan
from hydraplan.store.fileio import atomic_write_bytes, model_json, parse_model, read_json

COMPACT_SCHEMA = "hydraplan.plan-compact/v1"
SUFFIX = {"json": ".json", "compact": ".parquet"}
KINDS = ("pipeline", "micro_batch", "sequence")

# Row columns per kind: (name, arrow type). The plan field each one holds has the same name.
PIPELINE = (("tp", pa.int32()), ("pp", pa.int32()), ("cp", pa.int32()), ("ranks", pa.list_(pa.int32())),
            ("estimate_s", pa.float64()), ("sync_s", pa.float64()), ("seq1f1b_splits", pa.int32()),
            ("seq1f1b_estimate_s", pa.float64()), ("seq1f1b_max_len", pa.int64()))
MICRO_BATCH = (("pipeline", pa.int32()), ("seqs", pa.list_(pa.int32())), ("splits", pa.list_(pa.int64())))
SEQUENCE = (("id", pa.int64()), ("length", pa.int64()), ("doc", pa.int64()), ("sampled_iteration", pa.int64()))
COLUMNS = (*PIPELINE, *MICRO_BATCH, *SEQUENCE, ("extra", pa.string()))
# Sequence ids and rank lists mostly count up (deltas); floats and lengths compress best byte plane by byte plane.
ENCODING = {"id": "DELTA_BINARY_PACKED", "pipeline": "DELTA_BINARY_PACKED", "ranks.list.element": "DELTA_BINARY_PACKED",
            "length": "BYTE_STREAM_SPLIT", "estimate_s": "BYTE_STREAM_SPLIT", "sync_s": "BYTE_STREAM_SPLIT"}
HEADER = ("batch", "pipelines")  # the plan fields held in rows; every other one is in the metadata


def plan_format(path: str | Path) -> str:
    """'compact' for a .parquet file, else 'json'."""
    return "compact" if Path(path).suffix == SUFFIX["compact"] else "json"


def write_plan(path: str | Path, plan: Plan) -> None:
    """The plan, atomically, in the form its file name's suffix says."""
    data = encode(plan) if plan_format(path) == "compact" else (model_json(plan) + "\n").encode()
    atomic_write_bytes(path, data)


def read_plan(path: str | Path) -> Plan:
    """A plan file of either form; a bad file is one UserError naming it."""
    if plan_format(path) == "json":
        return parse_model(Plan, read_json(path), str(path))
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    return decode(data, str(path))


# ------------------------------------------------------------------------------------------ encode
def _rows(plan: dict[str, Any]) -> dict[str, list]:
    """The plan's rows as columns (Python lists), pipelines, then micro-batches, then sequences."""
    cols: dict[str, list] = {name: [] for name, _ in COLUMNS}
    kinds: list[int] = []

    def row(kind: int, values: dict[str, Any], own: tuple) -> None:
        kinds.append(kind)
        names = {n for n, _ in own}
        for name, _ in COLUMNS[:-1]:
            cols[name].append(values.get(name) if name in names else None)
        extra = {k: v for k, v in values.items() if k not in names and k != "micro_batches"}
        cols["extra"].append(json.dumps(extra, separators=(",", ":")) if extra else None)

    pipes = plan["pipelines"]
    position = {s["id"]: k for k, s in enumerate(plan["batch"])}
    for p in pipes:
        row(0, p, PIPELINE)
    for j, p in enumerate(pipes):
        for mb in p["micro_batches"]:
            missing = [i for i in mb["seqs"] if i not in position]
            if missing:
                raise UserError(f"plan {plan['iteration']}: pipelines.{j}: sequence id {missing[0]} is not in the batch, "
                                "which the compact form needs (micro-batches name sequences by their row)")
            row(1, {**mb, "pipeline": j, "seqs": [position[i] for i in mb["seqs"]]}, MICRO_BATCH)
    for s in plan["batch"]:
        row(2, s, SEQUENCE)
    cols["kind"] = kinds
    return cols


def encode(plan: Plan) -> bytes:
    """The plan as compact bytes (a Parquet file)."""
    data = plan.model_dump(mode="json", by_alias=True, exclude_none=True)
    cols = _rows(data)
    arrays = [pa.DictionaryArray.from_arrays(pa.array(cols.pop("kind"), pa.int8()), pa.array(KINDS))]
    arrays += [pa.array(cols[name], typ) for name, typ in COLUMNS]
    header = {k: v for k, v in data.items() if k not in HEADER}
    meta = {"schema": COMPACT_SCHEMA, "plan": json.dumps(header, separators=(",", ":"))}
    table = pa.Table.from_arrays(arrays, names=["kind", *(n for n, _ in COLUMNS)]).replace_schema_metadata(meta)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", compression_level=9, use_dictionary=["kind"],
                   column_encoding=ENCODING, write_statistics=False)
    return buf.getvalue()


# ------------------------------------------------------------------------------------------ decode
def _header(table: pa.Table, source: str) -> dict[str, Any]:
    meta = table.schema.metadata or {}
    tag = meta.get(b"schema", b"").decode()
    if tag != COMPACT_SCHEMA:
        raise UserError(f"{source}: field schema: expected {COMPACT_SCHEMA!r} in the Parquet metadata (got {tag!r})")
    try:
        return json.loads(meta[b"plan"])
    except (KeyError, ValueError):
        raise UserError(f"{source}: field plan: the Parquet metadata holds no plan header") from None


def _objects(table: pa.Table, kinds: pa.Array, kind: int, own: tuple) -> list[dict[str, Any]]:
    """The rows of one kind as dicts: their own non-null columns and their extra fields."""
    rows = table.filter(pc.equal(kinds, KINDS[kind]))
    cols = {name: rows.column(name).to_pylist() for name, _ in own}
    extra = rows.column("extra").to_pylist()
    out = []
    for k in range(rows.num_rows):
        obj = {name: values[k] for name, values in cols.items() if values[k] is not None}
        if extra[k] is not None:
            obj.update(json.loads(extra[k]))
        out.append(obj)
    return out


def decode(data: bytes, source: str = "<compact plan>") -> Plan:
    """A plan from compact bytes (encode's, or a .parquet file's)."""
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as e:
        raise UserError(f"{source}: not a compact plan (Parquet): {e}") from None
    missing = [n for n, _ in COLUMNS if n not in table.column_names] + (["kind"] if "kind" not in table.column_names else [])
    if missing:
        raise UserError(f"{source}: field {missing[0]}: column missing from the compact plan")
    plan = _header(table, source)
    kinds = table.column("kind").cast(pa.string())
    pipes = _objects(table, kinds, 0, PIPELINE)
    batch = _objects(table, kinds, 2, SEQUENCE)
    for p in pipes:
        p["micro_batches"] = []
    for mb in _objects(table, kinds, 1, MICRO_BATCH):
        j = mb.pop("pipeline", -1)
        if not 0 <= j < len(pipes):
            raise UserError(f"{source}: field pipeline: micro-batch of pipeline {j}, the plan has {len(pipes)}")
        bad = [k for k in mb.get("seqs", []) if not 0 <= k < len(batch)]
        if bad:
            raise UserError(f"{source}: field seqs: sequence row {bad[0]}, the plan has {len(batch)}")
        mb["seqs"] = [batch[k].get("id") for k in mb.get("seqs", [])]
        pipes[j]["micro_batches"].append(mb)
    plan["pipelines"], plan["batch"] = pipes, batch
    return parse_model(Plan, plan, source)

