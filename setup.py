"""The packages are found in the tree, not listed (pyproject.toml holds everything else): `hydraplan` is the
folder planner/ with every subpackage under it, `hydraplan.runtime` the folder runtime/, and the bundled
profiles/ and data/ install as hydraplan/profiles and hydraplan/data (pyproject.toml's package-dir)."""

from setuptools import find_packages, setup


def _under(name: str, folder: str) -> list[str]:
    return [name, *(f"{name}.{sub}" for sub in find_packages(folder))]


setup(packages=[*_under("hydraplan", "planner"), *_under("hydraplan.runtime", "runtime"), "hydraplan.profiles",
                "hydraplan.data"])
