"""mypy over planner/ as the installed `hydraplan` (pyproject's [tool.mypy], run by tests/typecheck.py as in
`make lint`) is clean, checks every module, and every `# type: ignore` says which error it silences and why."""

import re
import subprocess
import sys

from typecheck import ROOT, repo_paths


def test_mypy_clean_over_every_planner_module():
    """As `make lint` runs it: tests/typecheck.py in a process of its own, so mypy's half a million objects (its
    types and caches) do not stay in the test process, where every later garbage collection would walk them."""
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "typecheck.py")], capture_output=True, text=True,
                         cwd=ROOT)
    report = res.stdout + res.stderr
    assert res.returncode == 0, report
    modules = len(list((ROOT / "planner").rglob("*.py")))
    assert f"no issues found in {modules} source files" in report, report


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
