"""The wheel installs one import namespace, `hydraplan`, with the bundled profiles and datasets inside it.

The wheel is built from a copy of the sources pyproject.toml packages (as a clean clone has them, with
no build/ or egg-info left over), offline: setuptools from this environment, no build isolation.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hydraplan.store.paths import ROOT

SOURCES = ("pyproject.toml", "README.md", "planner", "runtime", "profiles", "data")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "--disable-pip-version-check", "-q", "-w", str(tmp / "dist"), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (whl,) = (tmp / "dist").glob("hydraplan-*.whl")
    return whl


def test_the_wheel_has_one_top_level_package_and_the_bundled_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"hydraplan", wheel.name.split("-py3")[0] + ".dist-info"}
    for folder in ("profiles", "data"):
        bundled = {p.name for p in (ROOT / folder).iterdir() if p.suffix in (".json", ".parquet")}
        assert bundled and {f"hydraplan/{folder}/{n}" for n in bundled} <= set(names)
    for module in ("hydraplan/__init__.py", "hydraplan/app/cli.py", "hydraplan/loader.py", "hydraplan/runtime/run_plan.py",
                   "hydraplan/runtime/profile.py", "hydraplan/runtime/batches.py"):
        assert module in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "hydraplan = hydraplan.app.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_package_finds_its_bundled_profiles_and_data(wheel, tmp_path):
    """Unpacked as pip installs it, hydraplan reads profiles and datasets from inside the package, and
    the folder names of the repository are not importable."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import importlib.util, json\n"
        "import hydraplan\n"
        "from hydraplan.store import paths\n"
        "from hydraplan.store.profiles import load_profile\n"
        "from hydraplan.store.datasets import builtin_names, load_dataset\n"
        "print(json.dumps({'package': hydraplan.__file__, 'profiles': str(paths.PROFILES_DIR), 'data': str(paths.DATA_DIR),\n"
        "  'tiny': load_profile('cpu-tiny').name, 'builtin': builtin_names(),\n"
        "  'docs': len(load_dataset('builtin:prolong').lengths),\n"
        "  'top': [m for m in ('planner', 'runtime', 'bench') if importlib.util.find_spec(m) is not None]}))\n"
    )
    # PYTHONPATH comes before this environment's editable install (a meta path finder appended last).
    env = dict(os.environ, PYTHONPATH=str(site))
    res = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert Path(out["package"]).parent == site / "hydraplan"
    assert Path(out["profiles"]) == site / "hydraplan" / "profiles"
    assert Path(out["data"]) == site / "hydraplan" / "data"
    assert out["tiny"] == "cpu-tiny" and out["builtin"] == ["prolong", "wikipedia"] and out["docs"] == 77932
    assert out["top"] == []
