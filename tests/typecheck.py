"""mypy over the `hydraplan` package as it installs (configured in pyproject.toml's [tool.mypy]); `make lint` runs
this file, and so does tests/test_typecheck.py.

`hydraplan` is the folder planner/ and `hydraplan.runtime` the folder runtime/ (pyproject's package-dir), a mapping
mypy cannot follow: the editable install is an import hook, and mypy names a module after its folders. So `layout`
lays the installed names out as two symlinks under .cache/mypy/layout (the config's mypy_path), and `run` reports
the errors with the repository's paths. The incremental cache sits beside it (.cache/mypy/cache)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / ".cache" / "mypy" / "layout"
# mypy_path entry -> (the installed package's folder under it, the repository folder it is)
LINKS = {"planner": ("hydraplan", "planner"), "runtime": ("hydraplan/runtime", "runtime")}


def layout() -> None:
    """The symlinks of LINKS, made when missing (relative, so a moved checkout keeps them)."""
    for base, (package, folder) in LINKS.items():
        link = LAYOUT / base / package
        target = os.path.relpath(ROOT / folder, link.parent)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{link.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        tmp.replace(link)


def repo_paths(report: str) -> str:
    """mypy's report with each path under the layout named as the repository's file (planner/..., runtime/...)."""
    for base, (package, folder) in LINKS.items():
        report = re.sub(rf"^[^\n:]*\.cache/mypy/layout/{base}/{package}/", f"{folder}/", report, flags=re.M)
    return report


def run() -> tuple[int, str]:
    """mypy's exit status (0: clean) and its report."""
    from mypy import api

    layout()
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    return status, repo_paths(out + err)


if __name__ == "__main__":
    status, report = run()
    print(report, end="")
    sys.exit(status)
