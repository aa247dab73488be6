"""The docs' figures, generated from bench/results: `python -m bench.docs` rewrites every generated table and
figure in README.md and docs/*.md from the results files, `--check` lists every one that differs and exits 1
(tests/test_bench.py runs it), `--status` shows how and when each results file was made.

Two kinds of marks, both invisible on a rendered page:
- a region `<!-- bench: TABLE ARGS -->` ... `<!-- /bench -->`: its lines are what bench/tables.py's TABLE
  function makes of the results (ARGS as key=value words);
- an inline figure, a Markdown reference link `[1.39x][name]` with its definition `[name]: PATH "SELECTOR FORMAT"`:
  PATH is the results file (relative to the page, so the figure links to it), SELECTOR the value's place in it
  (keys and list items by `id` or index, separated by `/`; `*` for all of a level, inside `min(...)`, `max(...)`,
  `range(...)`, `sum(...)`, `count(...)`), FORMAT a Python format string (`{:.2f}x`; `{:.3K}` writes thousands,
  `{:?ahead of|behind}` words for a yes/no, a pair of numbers is a range `lo-hi`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.run import CODE, RESULTS
from hydraplan.store.paths import ROOT

REGION = re.compile(r"(<!-- bench: (\w+)((?: [^ >]+)*) -->\n)(.*?)(<!-- /bench -->)", re.S)
DEFINITION = re.compile(r'^\[([^\]\n]+)\]: (\S+) "([^"\n]*)"[ \t]*$', re.M)
REFERENCE = re.compile(r"\[([^\]\n]*)\]\[([^\]\n]+)\]")
CODE_SPAN = re.compile(r"```.*?```|`[^`\n]*`", re.S)
PLACEHOLDER = re.compile(r"\{(?::([^{}]*))?\}")
REDUCERS: dict[str, Callable[[list], Any]] = {"min": min, "max": max, "sum": sum, "count": len,
                                                "range": lambda v: (min(v), max(v))}


class FigureError(Exception):
    """A mark that cannot be evaluated: unknown table, missing file, a selector that finds nothing."""


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


class Results:
    """The results files of one folder, read once each. `structural`: look a list item up by any id (a smoke
    run's results have other configurations than the full run's, but the same fields)."""

    def __init__(self, folder: Path = RESULTS, structural: bool = False) -> None:
        self.folder, self.structural, self._files = Path(folder), structural, {}

    @classmethod
    def of(cls, files: dict[str, dict]) -> Results:
        """Results already read (another commit's files, from git history), looked up as a folder's would be."""
        out = cls()
        out._files = dict(files)
        return out

    def __getitem__(self, name: str) -> dict:
        if name not in self._files:
            path = self.folder / f"{name}.json"
            if not path.exists():
                raise FigureError(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: no such results file")
            self._files[name] = json.loads(path.read_text())
        return self._files[name]

    def select(self, name: str, selector: str) -> Any:
        m = re.fullmatch(r"(\w+)\((.*)\)", selector)
        reducer, path = (m.group(1), m.group(2)) if m else (None, selector)
        if reducer is not None and reducer not in REDUCERS:
            raise FigureError(f"{selector}: unknown function {reducer} (one of {', '.join(REDUCERS)})")
        values = list(self._walk(self[name], path.split("/") if path else [], name))
        if reducer == "count":
            return len(values)
        if not values:
            raise FigureError(f"{name}.json: nothing at {path}")
        if reducer is not None:
            return REDUCERS[reducer](values)
        if "*" in path.split("/"):
            raise FigureError(f"{selector}: `*` selects several values; wrap it in {', '.join(REDUCERS)}")
        return values[0]

    def _walk(self, node: Any, keys: list[str], where: str) -> Iterator[Any]:
        if not keys:
            yield node
            return
        key, rest = keys[0], keys[1:]
        if key == "*":  # every item that has the rest of the path
            for child in (node.values() if isinstance(node, dict) else node):
                try:
                    found = list(self._walk(child, rest, where))
                except FigureError:
                    continue
                yield from found
            return
        if isinstance(node, dict):
            if key not in node:
                raise FigureError(f"{where}: no key {key!r}")
            yield from self._walk(node[key], rest, f"{where}/{key}")
            return
        if not isinstance(node, list):
            raise FigureError(f"{where}: {key!r} below a value")
        found = [x for x in node if isinstance(x, dict) and x.get("id") == key]
        if not found and key.isdigit() and int(key) < len(node):
            found = [node[int(key)]]
        if not found and self.structural:
            for x in node:  # the first item that has the rest of the path
                try:
                    yield from self._walk(x, rest, f"{where}/{key}")
                    return
                except FigureError:
                    continue
        if not found:
            raise FigureError(f"{where}: no item with id {key!r}")
        yield from self._walk(found[0], rest, f"{where}/{key}")


def format_value(fmt: str, value: Any) -> str:
    """`fmt` with its one placeholder filled: a pair of numbers (a range) as `lo-hi`, each end in the placeholder's
    spec; a list as its items joined by commas (`none` if empty); a yes/no by `{?WORDS IF TRUE|WORDS IF FALSE}`."""
    m = PLACEHOLDER.search(fmt)
    if m is None:
        raise FigureError(f"format {fmt!r}: no {{}} placeholder")
    spec = m.group(1) or ""
    one = lambda v: _spec(v, spec)  # noqa: E731
    if isinstance(value, tuple | list) and len(value) == 2 and all(_number(v) for v in value):
        text = f"{one(value[0])}-{one(value[1])}"
    elif isinstance(value, tuple | list):
        text = ", ".join(map(one, value)) or "none"
    else:
        text = one(value)
    return fmt[:m.start()] + text + fmt[m.end():]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _spec(value: Any, spec: str) -> str:
    if spec.startswith("?"):
        if not isinstance(value, bool):
            raise FigureError(f"{{:{spec}}} needs a yes/no value, got {value!r}")
        yes, _, no = spec[1:].partition("|")
        return yes if value else no
    if isinstance(value, float) and not math.isfinite(value):
        raise FigureError(f"value {value} is not a number")
    if spec.endswith("K"):  # thousands, significant digits: {:.3K} of 14599 is 14.6K
        digits = spec[:-1].lstrip(".") or "3"
        return f"{float(f'{value / 1000:.{digits}g}'):g}K"
    return format(value, spec)


@dataclass
class Mark:
    """One generated piece of a page: where it is, what it shows, what the results say it should show."""

    page: Path
    line: int
    what: str
    shown: str
    expected: str | None
    error: str | None = None

    def __str__(self) -> str:
        where = f"{self.page.relative_to(ROOT)}:{self.line}: {self.what}"
        if self.error:
            return f"{where}: {self.error}"
        return f"{where}: shows {self.shown!r}, the results give {self.expected!r}"


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _results_name(page: Path, url: str) -> str:
    path = (page.parent / url).resolve()
    if path.parent != RESULTS.resolve() or path.suffix != ".json":
        raise FigureError(f"{url}: figures cite bench/results/NAME.json")
    return path.stem


def figures(page: Path, text: str, results: Results) -> Iterator[tuple[re.Match, Mark]]:
    """Every figure link outside code, with its value; a figure without a definition, or a definition Markdown
    would not see (it must follow a blank line or another definition), is an error."""
    defs = {m.group(1).lower(): m for m in DEFINITION.finditer(text)}
    code = [m.span() for m in CODE_SPAN.finditer(text)]
    for d in defs.values():
        before = text[:d.start()].rstrip("\n").rpartition("\n")[2]
        if d.start() and text[d.start() - 2:d.start()] != "\n\n" and not DEFINITION.fullmatch(before):
            yield d, Mark(page, _line(text, d.start()), f"definition [{d.group(1)}]", "", None,
                          "a definition must follow a blank line or another definition")
    for use in REFERENCE.finditer(text):
        if any(a <= use.start() < b for a, b in code):
            continue
        d = defs.get(use.group(2).lower())
        if d is not None and not d.group(2).endswith(".json"):
            continue  # an ordinary reference link
        mark = Mark(page, _line(text, use.start()), f"figure [{use.group(2)}]", use.group(1), None)
        try:
            if d is None:
                raise FigureError("no definition of this figure")
            selector, _, fmt = d.group(3).partition(" ")
            mark.expected = format_value(fmt, results.select(_results_name(page, d.group(2)), selector))
        except (FigureError, TypeError, ValueError) as e:
            mark.error = str(e)
        yield use, mark


def regions(page: Path, text: str, results: Results) -> Iterator[tuple[re.Match, Mark]]:
    from bench import tables

    for m in REGION.finditer(text):
        name, args = m.group(2), dict(a.split("=", 1) for a in m.group(3).split())
        mark = Mark(page, _line(text, m.start()), f"table {name}", m.group(4), None)
        try:
            if name not in tables.TABLES:
                raise FigureError(f"no table {name} in bench/tables.py")
            mark.expected = tables.TABLES[name](results, **args).rstrip("\n") + "\n"
        except (FigureError, IndexError, KeyError, TypeError, ValueError) as e:
            mark.error = f"{type(e).__name__}: {e}"
        yield m, mark


def marks(page: Path, text: str, results: Results) -> list[Mark]:
    """Every mark of a page's text, each with what it shows and what the results give."""
    return [mark for _, mark in regions(page, text, results)] + [mark for _, mark in figures(page, text, results)]


def check(results: Results) -> list[Mark]:
    """The marks of every page that differ from the results or cannot be made."""
    return [m for page in pages() for m in marks(page, page.read_text(), results) if m.error or m.expected != m.shown]


def rewrite(page: Path, results: Results) -> list[Mark]:
    """The page with every region and figure as the results give it; returns the marks that could not be made."""
    text, failed = page.read_text(), []
    for m, mark in reversed(list(regions(page, text, results))):
        if mark.error:
            failed.append(mark)
        elif mark.expected != mark.shown:
            text = text[:m.start(4)] + mark.expected + text[m.end(4):]
    for use, mark in reversed(list(figures(page, text, results))):
        if mark.error:
            failed.append(mark)
        elif mark.expected != mark.shown:
            text = text[:use.start(1)] + mark.expected + text[use.end(1):]
    page.write_text(text)
    return failed


def status(results: Results) -> list[str]:
    """Per results file: its commit, date, what the run took, command, and whether the code changed since."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = []
    for path in sorted(results.folder.glob("*.json")):
        meta = json.loads(path.read_text()).get("meta", {})
        c = meta.get("commit")
        changed = "unknown"
        if c:
            diff = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", c, head, "--", *CODE, ":!bench/results"])
            changed = "code changed since" if diff.returncode else "code unchanged since"
        earlier = f", parts from {len(meta['earlier'])} earlier run(s)" if meta.get("earlier") else ""
        took = f"{meta['wall_s']:7.0f} s wall {meta['cpu_s']:7.0f} s CPU" if "cpu_s" in meta else f"{'(time not recorded)':32s}"
        out.append(f"{path.name:18s} {(c or 'no commit')[:10]} {meta.get('date', 'no date')} {took} "
                   f"{'dirty ' if meta.get('dirty') else ''}{changed}{earlier}: {meta.get('command', 'no command')}")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list every table and figure that differs; exit 1 if any")
    parser.add_argument("--status", action="store_true", help="how and when each results file was made")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder (default bench/results)")
    a = parser.parse_args(argv)
    results = Results(a.results)
    if a.status:
        print("\n".join(status(results)))
        return 0
    if a.check:
        bad = check(results)
        print("\n".join(map(str, bad)) or "docs: every table and figure is what bench/results gives")
        return 1 if bad else 0
    failed = [m for page in pages() for m in rewrite(page, results)]
    print("\n".join(map(str, failed)) or "docs: every table and figure rewritten from bench/results")
    return 1 if failed else 0


if __name__ == "__main__":  # run as bench.docs, the module bench/tables.py imports (one FigureError class)
    from bench.docs import main as module_main

    sys.exit(module_main(sys.argv[1:]))
