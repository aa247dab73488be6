"""`hydraplan dataset stats`: JSON and table output, the PNG, and one-line exit-2 errors for bad input."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from helpers import hp
from typer.testing import CliRunner

from hydraplan.app.cli import app
from hydraplan.schema import DatasetStats

HYDRAPLAN = str(Path(sys.executable).with_name("hydraplan"))
LENGTHS = [100, 5000, 20_000, 40_000, 3, 17, 900, 4097]


def run_main(*args) -> tuple[int, str, str]:
    r = hp(*args)
    return r.returncode, r.stdout, r.stderr


def test_stats_json_is_one_object_with_the_figures(tmp_path):
    path = tmp_path / "l.txt"
    path.write_text("\n".join(map(str, LENGTHS)) + "\n")
    result = CliRunner().invoke(app, ["dataset", "stats", str(path), "--context-len", "32768", "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert DatasetStats.model_validate(stats).model_dump(by_alias=True, exclude_none=True) == stats  # round-trips
    cut = [min(v, 32768) for v in LENGTHS]
    q = statistics.quantiles(cut, n=100, method="inclusive")
    assert stats["count"] == len(cut) and stats["tokens"] == sum(cut)
    assert (stats["min"], stats["max"]) == (3, 32768) and stats["truncated"] == 1
    assert stats["mean"] == pytest.approx(statistics.mean(cut))
    assert stats["median"] == pytest.approx(statistics.median(cut))
    assert stats["p90"] == pytest.approx(q[89]) and stats["p99"] == pytest.approx(q[98])
    above_4k = {s["threshold"]: s for s in stats["share_above"]}[4096]
    assert above_4k["tokens"] == pytest.approx(sum(v for v in cut if v > 4096) / sum(cut))
    assert sum(b["docs"] for b in stats["histogram"]) == len(cut)


def test_stats_table_and_plot(tmp_path):
    png = tmp_path / "plots" / "wiki.png"
    args = ["dataset", "stats", "builtin:prolong", "--context-len", "65536", "--plot", str(png)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "77,932" in result.stdout and "237,840,913" not in result.stdout  # truncation applied
    assert "(32K, 64K]" in result.stdout and "(64K, 128K]" not in result.stdout
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 600 and np.ptp(image[..., :3]) > 0.5


# name -> (file content, text the one-line error must contain)
BAD_FILES: dict[str, tuple[str, str]] = {
    "neg.csv": ("length\n5\n-3\n", "line 3: -3 is not a non-negative length"),
    "zeros.txt": ("0\n0\n", "all 2 documents are empty (0 tokens)"),
    "nocol.csv": ("size\n5\n", "no column 'length'"),
    "empty.txt": ("", "empty file"),
    "header.csv": ("length\n", "no documents"),
    "text.csv": ("length\n5\nabc\n", "line 3: 'abc' is not an integer"),
    "text.txt": ("5\nseven\n", "line 2: 'seven' is not an integer"),
    "float.parquet": ("", "row 2: 2.5 is not an integer"),
    "hist.csv": ("length,count\n5,-1\n", "column 'count' line 2: -1 is not a non-negative count"),
    "bins.csv": ("lo,hi,count\n8,4,3\n", "(8, 4] holds no length"),
    "strs.json": ('[1, "2"]', "item 1: '2' is not an integer"),
    "obj.json": ('{"a": 1}', "expected a JSON list"),
    "table.xlsx": ("x", "unknown dataset extension '.xlsx'"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_files_exit_2_with_one_line(tmp_path, monkeypatch, capsys, name):
    content, expected = BAD_FILES[name]
    path = tmp_path / name
    if name == "float.parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"length": [1.0, 2.5]}), path)
    else:
        path.write_text(content)
    code, out, err = run_main("dataset", "stats", path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and expected in err and str(path) in err


@pytest.mark.parametrize("args, expected", [
    (["builtin:c4"], "unknown builtin dataset 'builtin:c4' (known: builtin:prolong, builtin:wikipedia)"),
    (["missing.csv"], "missing.csv: no such file"),
    (["builtin:wikipedia", "--context-len", "0"], "--context-len must be a positive"),
])
def test_bad_specs_exit_2_with_one_line(monkeypatch, capsys, args, expected):
    code, out, err = run_main("dataset", "stats", *args)
    assert code == 2 and err.count("\n") == 1 and expected in err


def test_console_script_bad_input_has_no_traceback(tmp_path):
    """The installed command (the others run its entry point in this process)."""
    (tmp_path / "bad.jsonl").write_text('{"length": 3}\n{"length": -4}\n')
    proc = subprocess.run([HYDRAPLAN, "dataset", "stats", str(tmp_path / "bad.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"hydraplan: {tmp_path / 'bad.jsonl'}: column 'length' line 2: "
                                                "-4 is not a non-negative length"]


def test_stats_skip_and_report_empty_documents(tmp_path, monkeypatch, capsys):
    path = tmp_path / "l.txt"
    path.write_text("\n".join(map(str, [0, *LENGTHS, 0, 0])) + "\n")
    code, out, _ = run_main("dataset", "stats", path, "--json")
    stats = json.loads(out)
    assert code == 0 and stats["empty"] == 3 and stats["count"] == len(LENGTHS) and stats["min"] == min(LENGTHS)
    code, out, _ = run_main("dataset", "stats", path)
    assert code == 0 and "(3 empty documents skipped)" in " ".join(out.split())  # the title, wrapped by rich
