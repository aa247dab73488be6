"""The wheel installs one import namespace, `hydraplan`, with the bundled profiles and datasets inside it, and
plans when installed on its own.

The wheel is built from a copy of the sources pyproject.toml and setup.py package (as a clean clone has them,
with no build/ or egg-info left over), offline: setuptools from this environment, no build isolation.
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

SOURCES = ("pyproject.toml", "setup.py", "README.md", "planner", "runtime", "profiles", "data")


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


def test_every_module_of_the_tree_is_in_the_wheel(wheel):
    """setup.py finds the packages: each module under planner/ and runtime/ is in the wheel, at its import path."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in (("planner", "hydraplan"), ("runtime", "hydraplan/runtime")):
        modules = {f"{package}/{p.relative_to(ROOT / folder).as_posix()}" for p in (ROOT / folder).rglob("*.py")}
        assert modules and modules <= names, sorted(modules - names)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The wheel installed by pip into a folder of its own, and an environment that imports hydraplan from there
    only: `python -S` skips the .pth files of site-packages, so this environment's editable install (a finder
    that maps hydraplan.* to the checkout, which would hide a subpackage the wheel lacks) is not loaded; the
    dependencies come from site-packages as a plain path entry after the install folder."""
    target = tmp_path_factory.mktemp("installed")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                          "-q", "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    deps = Path(pytest.importorskip("numpy").__file__).parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(deps)]))
    return target, env


def test_the_installed_wheel_plans_from_another_folder(installed, tmp_path):
    """`hydraplan pack` through the wheel's entry point plans the committed example's first iteration byte for
    byte, `Planner` plans a batch, and the runtime's entry module imports; all from the install folder."""
    target, env = installed
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-S", str(target / "bin" / "hydraplan"), "pack", "--profile", "cpu-tiny",
                          "--dataset", "builtin:wikipedia", "--gpus", "4", "--tokens-per-iter", "1536", "--context-len", "768",
                          "--iterations", "1", "--seed", "1", "--out", str(run)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert any(line.startswith(f"planned 1 iteration into {run}") for line in res.stdout.splitlines()), res.stdout
    assert (run / "iter_000000.json").read_bytes() == (ROOT / "plans" / "example" / "iter_000000.json").read_bytes()
    probe = (
        "import json, sys\n"
        "import hydraplan, hydraplan.solve.dispatch, hydraplan.runtime.run_plan as rp\n"
        "from hydraplan import Planner\n"
        "from hydraplan.schema import Candidate, PipelineSpec, Strategies\n"
        "layout = Strategies(candidates=[Candidate(name='dp', pipelines=[PipelineSpec(tp=1, pp=1, cp=1)] * 2)])\n"
        "plan = Planner('cpu-tiny', layout, gpus=2, context_len=512).plan([500, 300, 200, 100])\n"
        "print(json.dumps({'files': [hydraplan.__file__, hydraplan.solve.dispatch.__file__, rp.__file__],\n"
        "  'seqs': sorted(s for p in plan.pipelines for mb in p.micro_batches for s in mb.seqs),\n"
        "  'editable': [type(f).__module__ for f in sys.meta_path if 'editable' in type(f).__module__]}))\n"
    )
    res = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert all(Path(f).is_relative_to(target / "hydraplan") for f in out["files"]), out["files"]
    assert out["seqs"] == [0, 1, 2, 3] and out["editable"] == []
