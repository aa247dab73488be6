"""The benches and the figures the docs publish from them: every bench runs (its smoke configuration, as
`python -m bench --smoke` does) and still writes every field the docs cite; every generated table and inline
figure of README.md and docs/*.md is what bench/results holds; a hand-edited cell or figure fails; every
results file says how it was made; and no figure in the results pages stands without a file behind it."""

import json
import re

import pytest

from bench.docs import REGION, FigureError, Results, format_value, marks, pages
from bench.run import RESULTS, names, run_bench
from hydraplan.store.paths import ROOT

RUNTIME = {"memory", "online", "overlap", "profile"}  # benches that launch gloo jobs under torchrun


FORKED = {"memory", "overlap", "profile"}  # their runtime jobs' ranks forked (tests/ranks.py); online's by torchrun


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in RUNTIME else n for n in names()])
def test_every_bench_runs_and_writes_what_the_docs_cite(name, tmp_path, monkeypatch):
    """The smoke configuration runs, records how it was made, and every table and figure the pages draw from
    this file can be made from it (list items looked up by any id: the smoke run's configurations are smaller).
    The runtime benches' jobs run the same, their ranks forked instead of started by torchrun where the bench,
    not the launch, is what is checked (bench online keeps torchrun, so bench.run.torchrun runs here too)."""
    if name in FORKED:
        import ranks

        from bench import run as bench_run
        from hydraplan.app import measure

        monkeypatch.setattr(bench_run, "torchrun", lambda nproc, args, timeout: ranks.launch(nproc, list(args),
                                                                                              timeout=timeout))
        monkeypatch.setattr(measure, "launch_runtime", ranks.launch_runtime)
    path = run_bench(name, smoke=True, results=tmp_path)
    data = json.loads(path.read_text())
    assert data["meta"]["smoke"] is True and data["meta"]["command"] == f"python -m bench --smoke {name}"
    results = Results(tmp_path, structural=True)
    cited = 0
    for page in pages():
        for mark in marks(page, page.read_text(), results):
            if mark.error and "no such results file" in mark.error:
                continue  # drawn from another bench's file
            assert mark.error is None, str(mark)
            cited += 1
    assert cited or name in UNCITED, f"no page cites bench/results/{name}.json"


UNCITED: set[str] = set()  # benches whose results no page quotes (none today)


def test_the_docs_show_what_bench_results_holds():
    """`python -m bench.docs --check`: every generated table and inline figure equals what its results file gives."""
    bad = [m for page in pages() for m in marks(page, page.read_text(), Results()) if m.error or m.expected != m.shown]
    assert not bad, "run `python -m bench.docs` after `make bench`:\n" + "\n".join(map(str, bad))


def test_a_hand_edited_table_cell_or_figure_fails():
    """Change one cell of a generated table and one inline figure of docs/results.md: the check names both."""
    page = ROOT / "docs" / "results.md"
    text = page.read_text()
    region = REGION.search(text)
    cell = re.search(r"\| (\d+\.\d+)x", region.group(4))
    start = region.start(4) + cell.start(1)
    figure = re.search(r"\[(\d[^\]]*)\]\[[^\]]+\]", text[region.end():])
    fig_at = region.end() + figure.start(1)
    edited = text[:start] + "9.99" + text[cell.end(1) + region.start(4):fig_at] + "7.77" + text[fig_at + len(figure.group(1)):]
    results = Results()
    before = {(m.line, m.what) for m in marks(page, text, results) if m.expected != m.shown}
    bad = [m for m in marks(page, edited, results) if m.expected != m.shown and (m.line, m.what) not in before]
    assert [m.what.split()[0] for m in bad] == ["table", "figure"], bad
    assert "9.99x" in bad[0].shown and bad[1].shown == "7.77"


def test_formats_and_selectors():
    results = Results()
    assert format_value("{:.2f}x", 1.0455) == f"{1.0455:.2f}x"
    assert format_value("{:.2f}-fold", (1.0, 1.5)) == "1.00-1.50-fold"
    assert format_value("{:.3K}", 14599) == "14.6K" and format_value("{:.3K}", 195241) == "195K"
    assert format_value("{:,}", [32641, 32768]) == "32,641-32,768"
    cases = results["bound"]["cases"]
    assert results.select("bound", f"cases/{cases[1]['id']}/gpus") == cases[1]["gpus"]
    assert results.select("bound", "max(cases/*/gpus)") == max(c["gpus"] for c in cases)
    with pytest.raises(FigureError):
        results.select("bound", "cases/no-such-case/gpus")
    with pytest.raises(FigureError):
        results.select("bound", "cases/*/gpus")  # several values need a function


def test_every_results_file_records_how_it_was_made():
    """Each file of bench/results comes from a full bench run (never a smoke run) of a commit of this repository."""
    files = sorted(RESULTS.glob("*.json"))
    assert {p.stem for p in files} == set(names())
    for p in files:
        meta = json.loads(p.read_text())["meta"]
        assert re.fullmatch(r"[0-9a-f]{40}", meta["commit"]) and meta["smoke"] is False, p.name
        assert meta["command"].startswith(f"python -m bench {p.stem}") and meta["date"][:2] == "20", p.name


BARE = re.compile(r"(?<![\w.\-/<])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?(?:x\b|%| s\b| ms\b| GB/s| GB\b| MiB| tokens/s)")


NOT_MEASURED = ("within 10%", "within 2x", "counts as 0 s")  # tests' tolerances and a definition, not results


def prose(text: str) -> str:
    """A page without what is generated or cited: code, generated regions, figure links and their definitions."""
    for phrase in NOT_MEASURED:
        text = text.replace(phrase, "")
    text = REGION.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"^\[[^\]\n]+\]: .*$", "", text, flags=re.M)
    return re.sub(r"\[[^\]\n]*\]\[[^\]\n]+\]", "", text)


def results_sections(page) -> str:
    text = page.read_text()
    if page.name != "README.md":
        return text
    return "".join(re.findall(r"^## (?:What `make demo` runs|Results|Known limits)\n.*?(?=^## )", text, re.M | re.S))


@pytest.mark.parametrize("page", ["README.md", "docs/results.md", "docs/cad.md", "docs/planning.md"])
def test_no_figure_without_a_file_behind_it(page):
    """Measured figures (speedups, seconds, shares, bandwidths) in the results pages are generated or cited."""
    found = BARE.findall(prose(results_sections(ROOT / page)))
    assert not found, f"{page}: figures with no results file behind them: {found}"


def test_a_partial_run_keeps_the_files_earlier_record_once_however_often_it_writes(tmp_path):
    """A part re-run (`python -m bench bound speed`) writes after every row; the record of the file it merged into
    stays under `earlier` once, not once per write."""
    from bench.run import Run

    Run("x", results=tmp_path).write({"a": 1})
    first = json.loads((tmp_path / "x.json").read_text())["meta"]
    part = Run("x", ("speed",), results=tmp_path)
    for k in range(3):
        part.write({"a": 1, "b": k}, merged=True)
    meta = json.loads((tmp_path / "x.json").read_text())["meta"]
    assert meta["earlier"] == [first] and meta["command"] == "python -m bench x speed"
