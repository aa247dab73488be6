"""mypy over planner/ as the installed `hydraplan` (pyproject's [tool.mypy], run by tests/typecheck.py as in
`make lint`) is clean, checks every module, and every `# type: ignore` says which error it silences and why."""

import gc
import re
import sys

from typecheck import ROOT, repo_paths, run


def test_mypy_clean_over_every_planner_module():
    """In-process, as `make lint` runs it; mypy raises the gc threshold and the recursion limit for itself, and the
    tests after it run in this process, so both must be as before."""
    before = gc.get_threshold(), sys.getrecursionlimit()
    status, report = run()
    assert status == 0, report
    modules = len(list((ROOT / "planner").rglob("*.py")))
    assert f"no issues found in {modules} source files" in report, report
    assert (gc.get_threshold(), sys.getrecursionlimit()) == before


def test_type_ignores_name_the_error_and_the_reason():
    ignore = re.compile(r"#\s*type:\s*ignore")
    explained = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\S")
    bare = [f"{path.relative_to(ROOT)}:{n}" for folder in ("planner", "runtime") for path in sorted((ROOT / folder).rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if ignore.search(line) and not explained.search(line)]
    assert not bare, f"a `# type: ignore[code]  # why` each: {bare}"


def test_report_names_the_repository_files():
    """mypy names a module's file by the layout's symlinks, relative to the working folder or absolute."""
    rel = ".cache/mypy/layout/planner/hydraplan/core/cost.py:51: error: x  [index]"
    absolute = f"{ROOT}/.cache/mypy/layout/runtime/hydraplan/runtime/model.py:3: note: y"
    assert repo_paths(f"{rel}\n{absolute}\n") == ("planner/core/cost.py:51: error: x  [index]\n"
                                                  "runtime/model.py:3: note: y\n")
